"""Linear interpolation and weighted averaging of state dicts.

``θ(λ) = (1−λ)·θ_A + λ·θ_B`` (λ=0 is A, λ=1 is B, bit-exactly). Floating tensors are combined in fp32
(fp64 for fp64 tensors) and cast back to their own dtype; integer and bool buffers (``num_batches_tracked``,
masks) are taken from the first model, never interpolated. Inputs are never mutated.

Mixed floating dtypes (e.g. an fp16 A with a bf16 B) follow one rule: the result has the *first* model's
dtype at every λ (λ=1 included); a value that overflows that dtype (fp16's ±65504) raises
:class:`~modeconn.errors.NonFiniteError` naming the key instead of silently becoming ±Inf.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from ..checks import check_compatible, check_one_device, is_interpolable
from ..errors import ConfigError, NonFiniteError

StateDict = Mapping[str, torch.Tensor]


def interpolate(sd_a: StateDict, sd_b: StateDict, lam: float) -> dict[str, torch.Tensor]:
    """``θ(λ) = (1−λ)θ_A + λθ_B``; λ=0 returns A's tensors and λ=1 B's (exactly, as new dict; B's floats
    are cast to A's dtype if they differ). Raises StateDictMismatchError (keys/shapes, all listed) or
    DeviceMismatchError before any arithmetic, ConfigError for a non-finite ``lam``."""
    lam = float(lam)
    if not math.isfinite(lam):
        raise ConfigError(f"lam must be a finite number, got {lam}")
    check_compatible([sd_a, sd_b], ["A", "B"])
    check_one_device([sd_a, sd_b], ["A", "B"])
    if lam == 0:
        return dict(sd_a)
    if lam == 1:
        return {k: (_as_dtype(sd_b[k], a, k) if is_interpolable(a) else a) for k, a in sd_a.items()}
    return weighted_average([sd_a, sd_b], [1.0 - lam, lam], check=False)


def _as_dtype(t: torch.Tensor, like: torch.Tensor, key: str) -> torch.Tensor:
    """``t`` in ``like``'s dtype (the same object when it already is), NonFiniteError on fp16 overflow."""
    if t.dtype == like.dtype:
        return t
    return _checked_cast(t, like.dtype, key)


def _checked_cast(t: torch.Tensor, dtype: torch.dtype, key: str) -> torch.Tensor:
    out = t.to(dtype)
    if dtype == torch.float16 and not torch.isfinite(out).all() and torch.isfinite(t).all():
        raise NonFiniteError(
            f"{key!r}: the result overflows float16 (the first model's dtype, max 65504); convert the models to one "
            "wider dtype (e.g. float32) before interpolating/merging"
        )
    return out


def weighted_average(
    state_dicts: Sequence[StateDict], weights: Sequence[float] | None = None, *, check: bool = True
) -> dict[str, torch.Tensor]:
    """``Σ_i w_i θ_i`` per floating tensor (fp32 accumulation, fp64 for fp64 tensors, cast to the first
    model's dtype); integer buffers from the first model; a tensor identical in every model is returned as is
    (exact). ``weights`` default to uniform; they must be finite and have one entry per model (ConfigError
    otherwise). Raises StateDictMismatchError / DeviceMismatchError, NonFiniteError on fp16 overflow."""
    if not state_dicts:
        raise ConfigError("need at least one state dict to average")
    if weights is None:
        weights = [1.0 / len(state_dicts)] * len(state_dicts)
    weights = [float(w) for w in weights]
    if len(weights) != len(state_dicts) or not all(torch.isfinite(torch.tensor(weights))):
        raise ConfigError(f"weights {weights} must be finite, one per model ({len(state_dicts)} models)")
    if check:
        check_compatible(state_dicts)
        check_one_device(state_dicts)
    first = state_dicts[0]
    out = {}
    for k, t in first.items():
        if not is_interpolable(t) or all(torch.equal(t, sd[k]) for sd in state_dicts[1:]):
            out[k] = t  # integer buffers, and tensors shared by every model (fixed masks/offsets) stay exact
            continue
        # fp32 accumulation (fp64/complex128 stay in their own precision: no silent rounding to fp32)
        acc = torch.zeros(t.shape, dtype=torch.promote_types(t.dtype, torch.float32), device=t.device)
        for w, sd in zip(weights, state_dicts):
            acc.add_(sd[k].to(acc.dtype), alpha=w)
        out[k] = _checked_cast(acc, t.dtype, k)
    return out
