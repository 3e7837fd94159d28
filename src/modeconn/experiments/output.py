"""Atomic result directories: everything is written into a temporary sibling and renamed into place."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..errors import ConfigError


def default_out(kind: str) -> Path:
    """``runs/<kind>-YYYYmmdd-HHMMSS`` under the current directory."""
    return Path("runs") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


@contextmanager
def output_directory(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory; on success it becomes ``out`` (atomic rename), on error it is removed.

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
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: Path, payload: Any) -> Path:
    path.write_text(json.dumps(payload, indent=2, allow_nan=False, default=_default))
    return path


def _default(o: Any):
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
