"""File digests, written once: the SHA-256 of a file's bytes as stored."""

from __future__ import annotations

import hashlib
import os

CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike, *, follow_symlinks: bool = True, chunk_size: int = CHUNK) -> str:
    """Hex SHA-256 of the bytes of ``path``, read in chunks of ``chunk_size``. With ``follow_symlinks=False`` a
    symlink at ``path`` is not opened (OSError ``ELOOP``). Raises OSError if the file cannot be read."""
    flags = os.O_RDONLY | (0 if follow_symlinks else os.O_NOFOLLOW)
    h = hashlib.sha256()
    with open(os.open(path, flags), "rb") as fh:
        while chunk := fh.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()
