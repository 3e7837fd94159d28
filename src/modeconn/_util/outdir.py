"""Output directories that modeconn owns: checked before any work, assembled atomically, replaced only when ours.

Rules, for every command and API call that writes a directory:

* An output that *is*, *contains* or *lies inside* one of the inputs is refused (inputs are never written to or
  deleted), whatever ``overwrite`` says.
* An existing non-empty output is replaced only with ``overwrite`` **and** only if modeconn wrote it: every
  directory assembled here carries a marker file (:data:`MARKER`, recording the command and version). A directory
  without it — a user's folder, a dataset, a checkpoint from elsewhere — is refused with the reason.
* The new directory is assembled in a uniquely named hidden sibling (``.<name>.modeconn-tmp-<host>-<pid>-<rand>``,
  so concurrent runs never share one) and swapped in with Linux ``renameat2(RENAME_EXCHANGE)`` — one atomic step,
  so a kill at any moment leaves either the old or the new directory at ``out``. Where the exchange is unavailable
  the old directory is first renamed to ``.<name>.modeconn-old-…``; a kill inside that window is repaired by the
  next run on the same ``out`` (the old directory is put back). Hidden siblings left by killed processes on this
  host are removed by the next run (only those carrying modeconn's marker).
"""

from __future__ import annotations

import ctypes
import errno
import glob
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError, ModeconnError

MARKER = ".modeconn-output.json"
"""File name of the ownership marker inside every directory modeconn assembles."""

_TMP, _OLD = "modeconn-tmp", "modeconn-old"
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("modeconn")
    except Exception:  # pragma: no cover - source checkout without metadata
        return "unknown"


def _host() -> str:
    return socket.gethostname() or "localhost"


def is_modeconn_output(path: str | os.PathLike) -> bool:
    """True if ``path`` is a directory carrying modeconn's ownership marker (a JSON object with ``tool: modeconn``)."""
    try:
        record = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("tool") == "modeconn"


def _marker(command: str) -> str:
    return json.dumps({"tool": "modeconn", "command": command, "modeconn_version": _version(),
                       "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": _host(), "pid": os.getpid()},
                      indent=2) + "\n"


# ---------------------------------------------------------------------------------------- input / output relation


def _relation(out: Path, source: Path) -> str | None:
    """How ``out`` relates to an input path (both resolved): 'is', 'contains', 'lies inside' or None."""
    if out == source:
        return "is"
    if out in source.parents:
        return "contains"
    if source in out.parents:
        return "lies inside"
    return None


def check_not_an_input(out: str | os.PathLike, inputs: Iterable[str | os.PathLike], *, option: str = "--out",
                       error: type[ModeconnError] = ConfigError) -> None:
    """``error`` if ``out`` is, contains or lies inside any of ``inputs`` (symlinks resolved)."""
    target = Path(out).resolve()
    for source in inputs:
        rel = _relation(target, Path(source).resolve())
        if rel is not None:
            raise error(f"{option} {out} {rel} the input {source}; inputs are never written to or deleted: "
                        f"choose another {option}")


# ---------------------------------------------------------------------------------- leftovers of killed runs


def _siblings(out: Path, kind: str) -> list[Path]:
    pattern = f".{glob.escape(out.name)}.{kind}-*"
    return [p for p in out.parent.glob(pattern) if p.is_dir() and not p.is_symlink()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _abandoned(sibling: Path, kind: str) -> bool:
    """True if the hidden sibling was made by a process of this host that no longer runs."""
    tag = sibling.name.split(f".{kind}-", 1)[-1]  # "<host>-<pid>-<random>"
    host, _, pid = tag.rpartition("-")[0].rpartition("-")
    if host != _host() or not pid.isdigit():
        return False
    return not _pid_alive(int(pid))


def recover_interrupted(out: str | os.PathLike) -> None:
    """Repair what a killed run left next to ``out``: if ``out`` is missing but the previous output sits in a
    ``.modeconn-old`` sibling (a kill between the two renames of a non-atomic swap), put it back; then delete
    abandoned temporaries and old copies that carry modeconn's marker. Nothing else is touched."""
    out = Path(out)
    if not out.parent.is_dir():
        return
    olds = [p for p in _siblings(out, _OLD) if _abandoned(p, _OLD) and is_modeconn_output(p)]
    if not os.path.lexists(out) and olds:
        newest = max(olds, key=lambda p: p.stat().st_mtime)
        os.rename(newest, out)
        olds.remove(newest)
    tmps = [p for p in _siblings(out, _TMP) if _abandoned(p, _TMP) and is_modeconn_output(p)]
    for p in olds + tmps:
        shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ the checks


def check_output_target(out: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (), overwrite: bool = False,
                        option: str = "--out", error: type[ModeconnError] = ConfigError) -> Path:
    """Check, before any work, that ``out`` may be written; returns it as a Path.

    Raises:
        ``error`` (ConfigError by default): ``out`` is, contains or lies inside an input; ``out`` is a file; ``out``
            is a non-empty directory and ``overwrite`` is False; or ``out`` is non-empty and was not written by
            modeconn (no :data:`MARKER`), which ``overwrite`` never replaces.
    """
    out = Path(out)
    check_not_an_input(out, inputs, option=option, error=error)
    recover_interrupted(out)
    if os.path.lexists(out) and (out.is_symlink() or not out.is_dir()):
        raise error(f"{option} {out} exists and is not a directory; refusing to replace it")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise error(f"{option} {out} exists and is not empty; choose another {option} or pass --overwrite "
                        "(overwrite=True) to replace a directory modeconn wrote")
        if not is_modeconn_output(out):
            raise error(f"{option} {out} was not written by modeconn (it has no {MARKER}); --overwrite only replaces "
                        f"modeconn's own outputs, never other files: choose another {option} or remove it yourself")
    return out


# -------------------------------------------------------------------------------------------------- the swap


def _renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2(RENAME_EXCHANGE)``). False where the system or the file
    system does not offer it; OSError for any other failure."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(tmp: Path, out: Path) -> None:
    """Make ``tmp`` become ``out``; a previous ``out`` (checked to be ours, or empty) is deleted afterwards."""
    if not out.exists():
        os.rename(tmp, out)
        return
    if exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # ``tmp`` now holds the previous output
        return
    old = out.with_name(f".{out.name}.{_OLD}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def output_directory(out: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (), overwrite: bool = False,
                     command: str = "", option: str = "--out", error: type[ModeconnError] = ConfigError,
                     os_error: type[ModeconnError] | None = None, what: str = "output") -> Iterator[Path]:
    """Yield an empty temporary directory (with modeconn's marker) that becomes ``out`` when the block ends.

    ``out`` is checked first (:func:`check_output_target`) and again before the swap. On an exception the temporary
    directory is removed and ``out`` is left exactly as it was. ``command`` is recorded in the marker. With
    ``os_error`` set, an OSError while writing or swapping is re-raised as that class, naming ``out`` and ``what``.
    """
    inputs = list(inputs)
    out = check_output_target(out, inputs=inputs, overwrite=overwrite, option=option, error=error)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{_TMP}-{_host()}-{os.getpid()}-", dir=out.parent))
    try:
        (tmp / MARKER).write_text(_marker(command))
        yield tmp
        check_output_target(out, inputs=inputs, overwrite=overwrite, option=option, error=error)
        _swap_in(tmp, out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if os_error is not None and isinstance(err, OSError):
            raise os_error(f"{out}: writing {what} failed: {err}") from err
        raise
