"""Output directories that modeconn owns: checked before any work, assembled atomically, replaced only when ours.

Rules, for every command and API call that writes a directory:

* An output that *is*, *contains* or *lies inside* one of the inputs is refused (inputs are never written to or
  deleted), whatever ``overwrite`` says.
* An existing non-empty output is replaced only with ``overwrite`` **and** only if modeconn wrote everything in it:
  every directory assembled here carries a marker file (:data:`MARKER`) recording the command, the version and every
  file and directory written (relative path, size and SHA-256 of each file). ``overwrite`` refuses, naming the first
  offender, a directory without the marker (a user's folder, a dataset, a checkpoint from elsewhere), one whose
  marker is a symlink (never followed) or an earlier version's marker without the list, and one holding anything the
  list does not prove is modeconn's: a file or directory added since, a file whose size or bytes changed, a symlink.
  A file listed but gone is fine (nothing of it can be lost). A copy (``cp -r``) of an output is replaced like the
  output itself when its files still match the list. Every file is hashed in full — SHA-256 runs at about 1.5 GB/s
  per core, so a multi-GB checkpoint adds seconds to a run that took minutes to write it; anything weaker (sizes,
  modification times, sampled bytes) would let an edited file pass.
* The current working directory (``--out .``) is written into when empty; one that is not empty is refused with the
  reason, since replacing it would pull the directory the user works in from under them.
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
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModeconnError
from .digest import sha256_file
from .jsonio import to_json

MARKER = ".modeconn-output.json"
"""File name of the ownership marker inside every directory modeconn assembles."""

MARKER_FORMAT = 2
"""Layout of the marker: 2 lists the files (``files``: relative POSIX path → ``{"size", "sha256"}``) and directories
(``directories``) modeconn wrote; a marker without ``marker_format`` (format 1, earlier versions) lists nothing."""

_MAX_MARKER_BYTES = 64 << 20

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


def read_marker(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ownership record in directory ``path`` (a JSON object with ``tool: modeconn``), or None: no marker, a
    marker that is a symlink (never followed) or not a regular file, or not such an object."""
    try:
        fd = os.open(Path(path) / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        try:
            record = json.loads(fh.read(_MAX_MARKER_BYTES))
        except (OSError, ValueError):
            return None
    return record if isinstance(record, dict) and record.get("tool") == "modeconn" else None


def is_modeconn_output(path: str | os.PathLike) -> bool:
    """True if ``path`` is a directory carrying modeconn's ownership marker (:func:`read_marker`). It says who made
    the directory, not that everything in it is modeconn's: :func:`unowned_entry` checks that."""
    return read_marker(path) is not None


def _marker(command: str, listing: dict[str, Any] | None = None) -> str:
    """The marker's text; ``listing`` (:func:`_listing`) once the directory is complete."""
    record = {"tool": "modeconn", "command": command, "modeconn_version": _version(),
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": _host(), "pid": os.getpid()}
    if listing is not None:
        record |= {"marker_format": MARKER_FORMAT, **listing}
    return to_json(record, MARKER)


# ------------------------------------------------------------------------------------- what the marker proves


def _walk(root: Path, prefix: str = "") -> Iterator[tuple[str, os.stat_result]]:
    """``(relative POSIX path, lstat)`` of everything under ``root``, sorted, depth first; symlinks not followed."""
    for name in sorted(os.listdir(root)):
        st = os.lstat(root / name)
        rel = prefix + name
        yield rel, st
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(root / name, rel + "/")


def _listing(root: Path) -> dict[str, Any]:
    """What the marker of a finished directory lists: every file (size, SHA-256) and directory but the marker."""
    files, directories = {}, []
    for rel, st in _walk(root):
        if stat.S_ISDIR(st.st_mode):
            directories.append(rel)
        elif stat.S_ISREG(st.st_mode) and rel != MARKER:
            files[rel] = {"size": st.st_size, "sha256": sha256_file(root / rel, follow_symlinks=False)}
    return {"files": files, "directories": directories}


def _marker_problem(directory: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)`` for a format-2 marker; ``(None, why not)`` otherwise, as the end of a sentence about
    ``directory``."""
    try:
        st = os.lstat(directory / MARKER)
    except FileNotFoundError:
        return None, f"was not written by modeconn (it has no {MARKER})"
    except OSError as err:
        return None, f"has a {MARKER} that cannot be read ({err.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return None, (f"has a symlink as its {MARKER}, which modeconn never follows (the marker it writes is a "
                      "regular file): nothing proves modeconn wrote it")
    record = read_marker(directory)
    if record is None:
        return None, f"was not written by modeconn (its {MARKER} is not a modeconn marker)"
    listed = record.get("files"), record.get("directories")
    if record.get("marker_format") != MARKER_FORMAT or not isinstance(listed[0], dict) \
            or not isinstance(listed[1], list):
        return None, (f"carries a {MARKER} of an earlier modeconn version, which does not list the files it wrote, so "
                      "nothing proves that everything in it is modeconn's: delete it yourself if it is")
    return record, None


def _entry_problem(rel: str, st: os.stat_result, record: dict[str, Any], directory: Path) -> str | None:
    """Why the entry ``rel`` (lstat ``st``) of ``directory`` is not one modeconn wrote there, or None."""
    if stat.S_ISLNK(st.st_mode):
        return f"holds {rel}, a symlink (modeconn writes none)"
    if stat.S_ISDIR(st.st_mode):
        return None if rel in record["directories"] else f"holds {rel}/, a directory modeconn did not write"
    if not stat.S_ISREG(st.st_mode):
        return f"holds {rel}, which is not a regular file"
    listed = record["files"].get(rel)
    if not isinstance(listed, dict):
        return f"holds {rel}, which modeconn did not write"
    if listed.get("size") != st.st_size:
        return f"holds {rel}, changed since modeconn wrote it ({listed.get('size')} bytes then, {st.st_size} now)"
    if listed.get("sha256") != sha256_file(directory / rel, follow_symlinks=False):
        return f"holds {rel}, changed since modeconn wrote it (other bytes, same size)"
    return None


def unowned_entry(directory: str | os.PathLike) -> str | None:
    """Why ``directory`` is not modeconn's to replace, as the end of a sentence naming the first offending entry
    (no marker, a symlinked or earlier-format marker, an entry the marker does not list, a file changed since);
    None when everything in it is what modeconn wrote there. Listed files that are gone are fine."""
    directory = Path(directory)
    record, problem = _marker_problem(directory)
    if problem is not None:
        return problem
    for rel, st in _walk(directory):
        if rel != MARKER and (problem := _entry_problem(rel, st, record, directory)) is not None:
            return problem
    return None


# ---------------------------------------------------------------------------------------- input / output relation


def _absolute(out: str | os.PathLike) -> Path:
    """``out`` made absolute without resolving symlinks (``.`` becomes the working directory, with its name)."""
    return Path(os.path.abspath(out))


def _holds_cwd(out: Path) -> bool:
    """True if ``out`` is the working directory or contains it (swapping it would pull the directory the user works
    in from under them)."""
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        return False
    target = out.resolve()
    return target == cwd or target in cwd.parents


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
    out = _absolute(out)
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
            is a non-empty directory and ``overwrite`` is False; ``out`` is non-empty and holds anything modeconn did
            not write there (:func:`unowned_entry`, naming it), which ``overwrite`` never replaces; ``out`` is the
            working directory (or contains it) and is not empty.
    """
    out = Path(out)
    check_not_an_input(out, inputs, option=option, error=error)
    recover_interrupted(out)
    if os.path.lexists(out) and (out.is_symlink() or not out.is_dir()):
        raise error(f"{option} {out} exists and is not a directory; refusing to replace it")
    if out.is_dir() and any(out.iterdir()):
        if _holds_cwd(out):
            raise error(_cwd_refusal(out, option, unowned_entry(out)))
        if not overwrite:
            raise error(f"{option} {out} exists and is not empty; choose another {option} or pass --overwrite "
                        "(overwrite=True) to replace a directory modeconn wrote")
        if (problem := unowned_entry(out)) is not None:
            raise error(f"{option} {out} {problem}; --overwrite only replaces what modeconn wrote, never other "
                        f"files: choose another {option}, or move those files out (or remove the directory yourself)")
    return out


def _cwd_refusal(out: Path, option: str, problem: str | None) -> str:
    head = (f"{option} {out} is the working directory (or contains it) and is not empty; an output is replaced by "
            "swapping whole directories, which would pull the directory you work in from under you")
    if problem is None:
        return (f"{head}: it holds an earlier modeconn output, so from outside it (cd {_absolute(out).parent}) rerun "
                f"with {option} {_absolute(out).name} --overwrite, or choose another {option}")
    return f"{head}: choose another {option} (it {problem})"


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


def _fill_in_place(tmp: Path, out: Path) -> None:
    """Move ``tmp``'s entries into the empty directory ``out`` (the working directory: it cannot be swapped). The
    marker comes first, so a kill part-way leaves a partial output that is provably modeconn's (listed files that are
    missing are fine) and a temporary that the next run removes."""
    shutil.copyfile(tmp / MARKER, out / MARKER)
    for name in sorted(os.listdir(tmp)):
        if name != MARKER:
            os.rename(tmp / name, out / name)
    shutil.rmtree(tmp, ignore_errors=True)


def _swap_in(tmp: Path, out: Path) -> None:
    """Make ``tmp`` become ``out``; a previous ``out`` (checked to be ours, or empty) is deleted afterwards."""
    if not out.exists():
        os.rename(tmp, out)
        return
    if _holds_cwd(out):  # empty (checked): filled where it stands
        _fill_in_place(tmp, out)
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
    directory is removed and ``out`` is left exactly as it was. ``command`` is recorded in the marker, and, when the
    block ends, every file and directory written into the temporary directory (sizes and SHA-256 digests), which is
    what a later ``overwrite`` may replace. With ``os_error`` set, an OSError while writing or swapping is re-raised
    as that class, naming ``out`` and ``what``.
    """
    inputs = list(inputs)
    check_output_target(out, inputs=inputs, overwrite=overwrite, option=option, error=error)
    target = _absolute(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{_TMP}-{_host()}-{os.getpid()}-", dir=target.parent))
    try:
        (tmp / MARKER).write_text(_marker(command))  # ours while assembling: a killed run's leftover is removable
        yield tmp
        (tmp / MARKER).write_text(_marker(command, _listing(tmp)))
        check_output_target(out, inputs=inputs, overwrite=overwrite, option=option, error=error)
        _swap_in(tmp, target)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if os_error is not None and isinstance(err, OSError):
            raise os_error(f"{out}: writing {what} failed: {err}") from err
        raise
