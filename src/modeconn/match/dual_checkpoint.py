"""Dual matching's resumable checkpoint (:mod:`modeconn.match.dual`): the run's fingerprint, written atomically and
read back only for the same options and endpoints."""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Mapping
from pathlib import Path

import torch

from .._util.atomic import atomic_write
from .._util.digest import update_tensor
from ..errors import CheckpointError, ConfigError
from ..symmetry import SymmetrySpec

StateDict = Mapping[str, torch.Tensor]
CHECKPOINT_FILE = "dual_matching.pt"
_FORMAT = 1


def _fingerprint(spec: SymmetrySpec, sd_a: StateDict, sd_b: StateDict, opts: dict) -> str:
    """sha256 over the options (all but ``steps``), the spec's spaces and the endpoints' bytes."""
    h = hashlib.sha256()
    meta = {k: (v.name if k == "parameterization" else v) for k, v in opts.items()}
    meta["spaces"] = [[s, sp.size, sp.group, sp.parent, [list(p) for p in sp.params]] for s, sp in spec.spaces.items()]
    h.update(json.dumps(meta, sort_keys=True, default=str).encode())
    for name, sd in (("A", sd_a), ("B", sd_b)):
        for k in sorted(sd):
            update_tensor(h, sd[k], f"{name}/{k}/{sd[k].dtype}/{tuple(sd[k].shape)}")
    return h.hexdigest()


def _save_checkpoint(path: Path, state: dict) -> None:
    """``state`` stamped with the checkpoint format, written atomically."""
    atomic_write(path, lambda fh: torch.save({"format": _FORMAT, **state}, fh))


def _load_checkpoint(path: Path, fingerprint: str, steps: int) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as e:  # truncated / not a torch file
        raise CheckpointError(f"cannot read the dual-matching checkpoint {path}: {e}") from None
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise CheckpointError(f"{path} is not a dual-matching checkpoint (format {_FORMAT})")
    if state.get("fingerprint") != fingerprint:
        raise ConfigError(
            f"checkpoint {path} was written for other options or endpoints (everything but steps must match); "
            "use another checkpoint_dir or delete it"
        )
    if state["step"] > steps:
        raise ConfigError(f"checkpoint {path} is at step {state['step']}, beyond steps={steps}")
    return state
