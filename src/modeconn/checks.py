"""Cheap input checks shared by matching, paths and merging (run before any heavy work)."""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from .errors import DeviceMismatchError, NonFiniteError, StateDictMismatchError

StateDict = Mapping[str, torch.Tensor]


def check_compatible(state_dicts: Sequence[StateDict], names: Sequence[str] | None = None) -> None:
    """All state dicts have the same keys and shapes; one error lists every missing/extra key and shape
    difference (naming both shapes). Raises :class:`StateDictMismatchError`."""
    names = list(names or [f"model {i}" for i in range(len(state_dicts))])
    ref, ref_name = state_dicts[0], names[0]
    problems = []
    for sd, name in zip(state_dicts[1:], names[1:]):
        missing = [k for k in ref if k not in sd]
        extra = [k for k in sd if k not in ref]
        if missing:
            problems.append(f"keys of {ref_name} missing from {name}: {missing}")
        if extra:
            problems.append(f"keys of {name} not in {ref_name}: {extra}")
        for k in ref:
            if k in sd and tuple(ref[k].shape) != tuple(sd[k].shape):
                problems.append(f"{k!r}: shape {tuple(ref[k].shape)} in {ref_name} vs {tuple(sd[k].shape)} in {name}")
    if problems:
        raise StateDictMismatchError("state dicts are not compatible:\n  " + "\n  ".join(problems))


def check_one_device(state_dicts: Sequence[StateDict], names: Sequence[str] | None = None) -> torch.device:
    """The single device all tensors live on; :class:`DeviceMismatchError` naming two tensors otherwise."""
    names = list(names or [f"model {i}" for i in range(len(state_dicts))])
    first: tuple[str, torch.device] | None = None
    for sd, name in zip(state_dicts, names):
        for k, t in sd.items():
            if first is None:
                first = (f"{name}[{k!r}]", t.device)
            elif t.device != first[1]:
                raise DeviceMismatchError(
                    f"{name}[{k!r}] is on {t.device} but {first[0]} is on {first[1]}; move both models to one device"
                )
    return first[1] if first else torch.device("cpu")


def check_finite(sd: StateDict, name: str, keys=None) -> None:
    """:class:`NonFiniteError` naming the first floating tensor with NaN/Inf entries."""
    for k in keys if keys is not None else sd:
        t = sd[k]
        # fast path: a float64 sum is finite iff every entry is (fp32/fp16 values cannot overflow it)
        if t.is_floating_point() and not torch.isfinite(t.sum(dtype=torch.float64)):
            bad = int((~torch.isfinite(t)).sum())
            raise NonFiniteError(f"{name}[{k!r}] has {bad} NaN/Inf entries (shape {tuple(t.shape)})")


def is_interpolable(t: torch.Tensor) -> bool:
    """Floating tensors are interpolated/averaged; integer buffers (``num_batches_tracked``) never are."""
    return t.is_floating_point() or t.is_complex()
