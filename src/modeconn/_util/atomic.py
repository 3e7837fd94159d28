"""Atomic file writes: a uniquely named temporary sibling, fsync, then ``os.replace`` (readers never see half a file;
two concurrent writers never share a temporary name)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def atomic_path(path: str | os.PathLike, *, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield the name of a new, empty temporary sibling of ``path`` for the block to fill (by name: a library that
    writes to a file name, a copy, a download); when the block ends it is fsync'd and renamed onto ``path``.

    On any exception (KeyboardInterrupt included) the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write(fh)`` on a temporary sibling of ``path``, fsync it and rename it onto ``path``.

    On any exception the temporary file is removed and ``path`` is left as it was. Returns ``path``.
    """
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        write(fh)
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write(path, lambda fh: fh.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write_bytes(path, text.encode())
