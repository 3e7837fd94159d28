"""Argument checks shared by the identifiability functions (private)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import ConfigError, DeviceMismatchError, NonFiniteError

ORTHONORMAL_ATOL = 1e-5
"""Largest ``max |UᵀU − I|`` accepted as "orthonormal columns" (float32 round-off passes, real skew does not)."""


def shape_str(shape: tuple[int, ...] | torch.Size) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + (",)" if len(shape) == 1 else ")")


def as_f64(x: Any, name: str, ndim: int | None = None, *, allow_posinf: bool = False,
           device: torch.device | None = None) -> torch.Tensor:
    """``x`` as a float64 tensor (a copy-free view where possible; the input is never modified).

    Raises ConfigError (wrong rank / non-numeric), DeviceMismatchError, NonFiniteError (NaN, −Inf, and +Inf
    unless ``allow_posinf``).
    """
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{name} must be a tensor or array of numbers, got {type(x).__name__}") from exc
    if t.is_complex() or not (t.is_floating_point() or t.dtype in _INT_DTYPES):
        raise ConfigError(f"{name} must hold real numbers, got dtype {t.dtype}")
    if ndim is not None and t.ndim != ndim:
        raise ConfigError(f"{name} must be {ndim}-D, got shape {shape_str(t.shape)}")
    if device is not None and t.device != device:
        raise DeviceMismatchError(f"{name} is on {t.device} but the other arguments are on {device}")
    t = t.detach().to(torch.float64)
    bad = torch.isnan(t) | (t == -math.inf)
    if not allow_posinf:
        bad |= torch.isinf(t)
    if bool(bad.any()):
        what = "NaN/-Inf" if allow_posinf else "NaN/Inf"
        raise NonFiniteError(f"{name} (shape {shape_str(t.shape)}) has {int(bad.sum())} {what} entries")
    return t


_INT_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}


def check_basis(U: Any, name: str = "U") -> torch.Tensor:
    """``U`` (d_in, k) as float64 after checking ``1 ≤ k ≤ d_in`` and ``UᵀU ≈ I`` (``ORTHONORMAL_ATOL``)."""
    u = as_f64(U, name, 2)
    d_in, k = u.shape
    if k < 1 or d_in < 1:
        raise ConfigError(f"{name} must have shape (d_in, k) with d_in ≥ k ≥ 1, got {shape_str(u.shape)}")
    if k > d_in:
        raise ConfigError(
            f"{name} has k={k} columns but only d_in={d_in} rows (shape {shape_str(u.shape)}); "
            f"a k-dimensional subspace of R^d_in needs k ≤ d_in"
        )
    dev = float((u.mT @ u - torch.eye(k, dtype=u.dtype, device=u.device)).abs().max())
    if dev > ORTHONORMAL_ATOL:
        raise ConfigError(
            f"{name} (shape {shape_str(u.shape)}) does not have orthonormal columns: max |UᵀU − I| = {dev:.3g} > "
            f"{ORTHONORMAL_ATOL:g}. modeconn refuses rather than orthonormalising silently, because that would "
            f"change the coordinates the other arguments are expressed in; call "
            f"modeconn.identifiability.orthonormalize({name}) first if you mean the column span"
        )
    return u


def check_square(C: Any, name: str, *, allow_posinf: bool) -> torch.Tensor:
    c = as_f64(C, name, 2, allow_posinf=allow_posinf)
    if c.shape[0] != c.shape[1] or c.shape[0] < 1:
        raise ConfigError(f"{name} must be a non-empty square (n, n) matrix, got shape {shape_str(c.shape)}")
    return c


def check_perm(perm: Any, n: int, name: str = "perm") -> torch.Tensor:
    """``perm`` as an int64 CPU tensor after checking it is a permutation of ``range(n)``."""
    try:
        p = torch.as_tensor(perm)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{name} must be a sequence of integers, got {type(perm).__name__}") from exc
    if p.is_floating_point() or p.is_complex() or p.dtype == torch.bool:
        raise ConfigError(f"{name} must hold integers, got dtype {p.dtype}")
    p = p.to("cpu", torch.int64)
    if p.ndim != 1 or p.numel() != n:
        raise ConfigError(f"{name} must have shape ({n},) to match the ({n}, {n}) matrix, got {shape_str(p.shape)}")
    if not torch.equal(torch.sort(p).values, torch.arange(n)):
        raise ConfigError(f"{name} is not a permutation of 0..{n - 1}: {p.tolist()}")
    return p
