"""Linear interpolation and weighted averaging of state dicts.

``θ(λ) = (1−λ)·θ_A + λ·θ_B`` (λ=0 is A, λ=1 is B, bit-exactly). Floating tensors are combined in fp32
and cast back to their own dtype; integer buffers (``num_batches_tracked``) are taken from the first
model, never interpolated. Inputs are never mutated.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ..checks import check_compatible, check_one_device, is_interpolable
from ..errors import ConfigError

StateDict = Mapping[str, torch.Tensor]


def interpolate(sd_a: StateDict, sd_b: StateDict, lam: float) -> dict[str, torch.Tensor]:
    """``θ(λ) = (1−λ)θ_A + λθ_B``; λ=0 returns A's tensors and λ=1 B's (exactly, as new dict)."""
    if lam == 0:
        return dict(sd_a)
    if lam == 1:
        return {k: (sd_b[k] if is_interpolable(sd_a[k]) else sd_a[k]) for k in sd_a}
    return weighted_average([sd_a, sd_b], [1.0 - lam, lam], check=False)


def weighted_average(
    state_dicts: Sequence[StateDict], weights: Sequence[float] | None = None, *, check: bool = True
) -> dict[str, torch.Tensor]:
    """``Σ_i w_i θ_i`` per floating tensor (fp32 accumulation, cast to the first model's dtype);
    integer buffers from the first model; a tensor identical in every model is returned as is (exact). ``weights`` default to uniform; they must be finite and have
    one entry per model (ConfigError otherwise). Raises StateDictMismatchError / DeviceMismatchError."""
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
        acc = torch.zeros(t.shape, dtype=torch.float32 if not t.is_complex() else t.dtype, device=t.device)
        for w, sd in zip(weights, state_dicts):
            acc.add_(sd[k].to(acc.dtype), alpha=w)
        out[k] = acc.to(t.dtype)
    return out
