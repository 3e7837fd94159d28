"""Atomic result directories: everything is written into a temporary sibling and renamed into place."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..errors import ConfigError
from ..io import _json_dumps


def default_out(kind: str) -> Path:
    """``runs/<kind>-YYYYmmdd-HHMMSS`` under the current directory."""
    return Path("runs") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


@contextmanager
def output_directory(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory; on success it becomes ``out`` (atomic rename), on error it is removed
    and a previous ``out`` (``overwrite=True``) is left in place, untouched.

    An existing non-empty ``out`` is never silently overwritten: ConfigError unless ``overwrite``. The
    check runs before any work, so a long run cannot fail at the very end because of it.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ConfigError(f"output directory {out} exists and is not empty; choose another --out or pass --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.rename(old, out)  # the swap failed: put the previous results back where they were
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: Path, payload: Any) -> Path:
    """Strict JSON (NaN/Inf → null, numpy → lists, paths → strings) written to ``path``."""
    path.write_text(_json_dumps(payload, str(path)))
    return path
