"""Digests, written once: the SHA-256 of a file's bytes as stored, and of tensors' raw bytes.

The tensor digests are recorded in files (LLPF resume state, dual-matching checkpoints, W-asymmetric checkpoints)
and compared with recorded ones, so their bytes never change: ``tests/test_digest_pins.py`` pins them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import torch

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


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of ``t`` as stored: detached, on the CPU, C order (``b""`` for an empty tensor)."""
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def update_tensor(h: Any, t: torch.Tensor, header: str) -> None:
    """Feed ``header`` (UTF-8) and then the raw bytes of ``t`` (:func:`tensor_bytes`) into the hash ``h``."""
    h.update(header.encode())
    h.update(tensor_bytes(t))


def update_named_tensor(h: Any, name: str, t: torch.Tensor) -> None:
    """:func:`update_tensor` with the header ``name:shape:dtype``."""
    update_tensor(h, t, f"{name}:{tuple(t.shape)}:{t.dtype}")


def tensors_sha256(tensors: Mapping[str, torch.Tensor] | None) -> str:
    """sha256 over ``key:shape:dtype`` and the raw bytes of every tensor, keys sorted (``"none"`` for None):
    the content digest of a state dict (LLPF's resume fingerprint and its state-file check)."""
    if tensors is None:
        return "none"
    h = hashlib.sha256()
    for k in sorted(tensors):
        update_named_tensor(h, k, tensors[k])
    return h.hexdigest()
