"""Reading checkpoint files without trusting them: safetensors headers and tensors, ``torch.load(weights_only=True)``
only when pickles are allowed, JSON objects, and the containment of every file in its checkpoint's directory tree.

Nothing here unpickles by default or follows a symlink out of a checkpoint; every failure raises a
:mod:`modeconn.errors` exception naming the file (and the tensor, for a dtype modeconn cannot read or a NaN/Inf).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..checks import check_finite_stored
from ..errors import CheckpointError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
"""File suffixes treated as pickle-based weight files: never unpickled unless ``allow_pickle=True``."""


def _check_not_pickle(path: Path) -> None:
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(
            f"{path}: pickle-based weight files ({', '.join(PICKLE_SUFFIXES)}) are not loaded because "
            "unpickling can execute arbitrary code; convert it to .safetensors"
        )


# ----------------------------------------------------------------------- trust: dtype kinds, checkpoint trees
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
"""safetensors dtype names → torch dtypes (the dtypes modeconn reads from safetensors headers)."""


def safetensors_dtype(name: str, file: str | os.PathLike, key: str) -> torch.dtype:
    """The torch dtype of a safetensors header dtype ``name``; CheckpointError naming the file and tensor if modeconn
    cannot read it."""
    if name not in SAFETENSORS_DTYPES:
        raise CheckpointError(f"{file}: tensor {key!r} has dtype {name}, which modeconn cannot read "
                              f"(supported: {', '.join(SAFETENSORS_DTYPES)})")
    return SAFETENSORS_DTYPES[name]


def check_in_checkpoint(file: str | os.PathLike, root: str | os.PathLike) -> Path:
    """The real path of ``file``, a file of checkpoint directory ``root``; refused if it leaves ``root``'s tree.

    A symlinked file (a side file such as ``tokenizer.json``, a weights shard, ``config.json``) would otherwise pull
    a file from anywhere on the machine into what modeconn reads and copies to its outputs. Allowed: real paths
    inside ``root`` (symlinks within the checkpoint), and the Hugging Face cache layout: ``root``'s real path is
    ``<repo>/snapshots/<revision>`` and the file is a blob directly in ``<repo>/blobs``, which must be a real
    directory of the repo (:func:`_cache_blobs`: a symlinked ``blobs`` would reach any directory). Hard links cannot
    be told apart from regular files and are not refused.

    Raises:
        CheckpointError: naming the file and where it points (or why it cannot be resolved, e.g. a symlink loop).
    """
    file = Path(file)
    try:
        real, base = file.resolve(), Path(root).resolve()
        blobs = _cache_blobs(base)
    except (OSError, RuntimeError) as err:
        raise CheckpointError(f"{file}: cannot resolve the path (symlink loop?): {err}") from None
    if real == base or base in real.parents or (blobs is not None and real.parent == blobs):
        return real
    linked = base.parent.parent / "blobs" if base.parent.name == "snapshots" and blobs is None else None
    why = (f" ({linked} is not a real directory of the cache repo: a symlinked blobs directory is never followed)"
           if linked is not None and (linked.is_symlink() or linked.exists()) else "")
    raise CheckpointError(
        f"{file}: is a symlink to {real}, outside the checkpoint directory {root}{why}; files a checkpoint is read "
        "from (and copied to outputs from) must lie in its directory tree (or be Hugging Face cache blobs, "
        "snapshots/<rev>/f → ../../blobs/<hash>, in a real blobs directory): copy the file into the checkpoint if it "
        "belongs there"
    )


def _cache_blobs(snapshot: Path) -> Path | None:
    """``<repo>/blobs`` of a Hugging Face cache snapshot's real path ``<repo>/snapshots/<rev>``, when it is a real
    directory: not a symlink, and its real path is the path itself (so no component of the chain reaches elsewhere);
    else ``None`` (no blob allowance)."""
    if snapshot.parent.name != "snapshots":
        return None
    blobs = snapshot.parent.parent / "blobs"
    if blobs.is_symlink() or not blobs.is_dir() or blobs.resolve() != blobs:
        return None
    return blobs


def _open_safetensors_header(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Keys → ``(shape, dtype)`` from the safetensors header; validates that the file is complete.

    Raises:
        CheckpointError: missing, pickle, truncated or corrupt file, or a dtype modeconn cannot read (named in the
            message).
    """
    _check_not_pickle(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: weights file not found")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            entries = {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
    except Exception as err:
        raise CheckpointError(f"{path}: not a valid safetensors file (truncated or corrupt?): {err}") from None
    return {k: (shape, safetensors_dtype(name, path, k)) for k, (shape, name) in entries.items()}


def load_state_dict(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Read a ``.safetensors`` file into ``{key: tensor}`` on ``device``. Never unpickles anything.

    Raises:
        CheckpointError: the file is missing, is a pickle format (``.bin``, ``.pt``, ``.pth``, ``.ckpt``,
            ``.pkl``), or is truncated/corrupt; the message names the file.
        NonFiniteError: a floating tensor holds NaN/Inf (the file and tensor are named).
    """
    path = Path(path)
    _open_safetensors_header(path)
    try:
        out: dict[str, torch.Tensor] = {}
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
    except Exception as err:
        raise CheckpointError(f"{path}: reading tensors failed (truncated or corrupt?): {err}") from None
    for k, t in out.items():
        check_finite_stored(t, path, k)
    return out


def load_pickle_state_dict(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A state dict from a pickle weights file (``.pth``, ``.pt``, ``.bin`` …) — the one place modeconn reads one — with
    ``torch.load(weights_only=True)`` only: a pickle that needs code to unpickle (any object outside tensors and plain
    containers) is refused, nothing of it runs. A ``{"state_dict": {...}}`` wrapper is unwrapped.

    Raises:
        CheckpointError: naming the file, when torch refuses or fails to read it, or it holds no flat dict of tensors.
        NonFiniteError: a floating tensor holds NaN/Inf (file and tensor named).
    """
    path = Path(path)
    try:
        sd = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{path}: torch.load(weights_only=True) refused or failed: {err}") from None
    if isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
        sd = sd["state_dict"]
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: does not contain a flat state dict of tensors")
    for k, t in sd.items():
        check_finite_stored(t, path, k)
    return dict(sd)


def read_json_object(path: str | os.PathLike, what: str = "JSON file") -> dict[str, Any]:
    """The JSON object stored in ``path``; CheckpointError naming the file if it is missing, not valid JSON
    (or not UTF-8) or not an object."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: {what} not found")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: invalid JSON: {err}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj
