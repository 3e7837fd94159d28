"""Realization cost of target directions for W-asymmetric neurons (docs/methods.md §1)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import ConfigError
from ._validate import as_f64, check_basis, shape_str

RANK_RTOL = 1e-10
"""Eigenvalues of ``G_i`` at or below ``RANK_RTOL · λ_max(G_i)`` count as zero (they span the null space)."""


_ROUNDOFF_FACTOR = 16.0


def _input_eps(*xs: Any) -> float:
    """Machine epsilon of the least precise floating input (float64's for integer/bool inputs)."""
    eps = torch.finfo(torch.float64).eps
    for x in xs:
        dt = x.dtype if isinstance(x, torch.Tensor) else torch.as_tensor(x).dtype
        if dt.is_floating_point:
            eps = max(eps, torch.finfo(dt).eps)
    return eps


def realization_cost(U: Any, f: Any, d: Any, a: Any, *, rtol: float = 1e-6) -> torch.Tensor:
    """Cost matrix ``C[i, j] = c_i(a_j)`` of realising target direction ``a_j`` with neuron ``i``.

    A W-asymmetric neuron has effective weights ``f_i + d_i ⊙ w`` (``f_i`` fixed offsets, ``d_i`` fixed mask
    values, ``w`` trained). On inputs in ``span(U)`` only ``Uᵀ(f_i + d_i ⊙ w) ∈ R^k`` matters, so the cheapest
    trained weights reaching ``a_j`` (in ``U`` coordinates) cost::

        c_i(a_j) = min ‖w‖²  s.t.  Uᵀ (f_i + d_i ⊙ w) = a_j
                 = (a_j − b_i)ᵀ G_i⁺ (a_j − b_i),   b_i = Uᵀ f_i,   G_i = Uᵀ diag(d_i)² U,

    the min-norm solution ``w* = A_i⁺ (a_j − b_i)`` with ``A_i = Uᵀ diag(d_i)``, ``A_i A_iᵀ = G_i``. When ``G_i``
    is singular the target is reachable only if ``a_j − b_i ∈ range(G_i)``: with ``G_i = V Λ Vᵀ`` and
    ``p = Vᵀ (a_j − b_i)``, the entry is ``+inf`` when the component outside the range (eigenvalues
    ``≤ RANK_RTOL · λ_max``) has norm ``> rtol · ‖a_j − b_i‖ + 16 · eps · (‖a_j‖ + ‖b_i‖)`` (``eps`` the machine
    epsilon of the least precise floating input: the second term is the round-off floor of ``a_j − b_i`` itself,
    so that a target computed as ``a_j = Uᵀ f_i`` counts as reachable even when ``G_i = 0``); a smaller
    out-of-range component is treated as round-off and the cost of the in-range part ``Σ_{λ_l > 0} p_l² / λ_l``
    is returned. ``a_j = b_i`` costs 0 even for ``G_i = 0``. Computed in float64, batched over ``i`` and ``j`` (memory
    ``O(m·n·k + m·d_in·k)``).

    Args:
        U: ``(d_in, k)`` basis of the input subspace with orthonormal columns (``UᵀU = I`` to 1e-5).
        f: ``(m, d_in)`` fixed offsets ``F`` of ``m`` neurons (rows), units of weights.
        d: ``(m, d_in)`` mask / scale values ``D`` (0/1 in the reference code; any real values allowed; bool ok).
        a: ``(n, k)`` target directions in ``U`` coordinates (the neuron's weight vector projected on ``U``).
        rtol: relative tolerance of the range check, in ``[0, 1)``.
    Returns:
        ``(m, n)`` float64 tensor of costs (squared weight norm), ``+inf`` where unreachable; on ``U``'s device.
    Raises:
        ConfigError: ``U`` is not ``(d_in, k)`` with ``k ≤ d_in`` or its columns are not orthonormal (we refuse
            rather than orthonormalise silently, which would change the coordinates of ``a``; use
            :func:`~modeconn.identifiability.orthonormalize`); ``f``, ``d``, ``a`` of inconsistent shapes (the
            message names the argument and both shapes); ``rtol`` out of range.
        NonFiniteError: NaN/Inf in any argument (named).
        DeviceMismatchError: arguments on different devices.
    """
    if not (isinstance(rtol, (int, float)) and not isinstance(rtol, bool) and 0.0 <= rtol < 1.0):
        raise ConfigError(f"rtol must be a number in [0, 1), got {rtol!r}")
    u = check_basis(U)
    d_in, k = u.shape
    fm = as_f64(f, "f", 2, device=u.device)
    dm = as_f64(d, "d", 2, device=u.device)
    am = as_f64(a, "a", 2, device=u.device)
    if fm.shape[1] != d_in:
        raise ConfigError(f"f has shape {shape_str(fm.shape)} but U has shape {shape_str(u.shape)}: "
                          f"expected f of shape (m, {d_in})")
    if dm.shape != fm.shape:
        raise ConfigError(f"d has shape {shape_str(dm.shape)} but f has shape {shape_str(fm.shape)}: "
                          f"they must match (one row per neuron, d_in={d_in} columns)")
    if am.shape[1] != k:
        raise ConfigError(f"a has shape {shape_str(am.shape)} but U has shape {shape_str(u.shape)}: "
                          f"expected a of shape (n, {k}) (targets in U coordinates)")

    b = fm @ u                                                    # (m, k)   projected centers
    g = torch.einsum("pk,ip,pl->ikl", u, dm * dm, u)              # (m, k, k) projected Gram matrices
    g = 0.5 * (g + g.mT)
    lam, vec = torch.linalg.eigh(g)                               # (m, k), (m, k, k), ascending
    lam_max = lam.amax(dim=-1, keepdim=True)
    keep = lam > RANK_RTOL * lam_max                               # all False when G_i = 0
    inv = torch.where(keep, 1.0 / torch.where(keep, lam, torch.ones_like(lam)), torch.zeros_like(lam))

    r = am[None, :, :] - b[:, None, :]                            # (m, n, k)
    p = torch.einsum("ikl,ijk->ijl", vec, r)                      # eigen-coordinates Vᵢᵀ r
    p2 = p * p
    cost = (p2 * inv[:, None, :]).sum(-1)
    resid2 = (p2 * (~keep).to(p2.dtype)[:, None, :]).sum(-1)
    rnorm2 = (r * r).sum(-1)
    # round-off floor: a_j − b_i is only known to ~eps·(‖a_j‖ + ‖b_i‖) (eps of the inputs' precision)
    floor = _ROUNDOFF_FACTOR * _input_eps(U, f, d, a) * (
        torch.linalg.vector_norm(am, dim=1)[None, :] + torch.linalg.vector_norm(b, dim=1)[:, None])
    unreachable = resid2.sqrt() > rtol * rnorm2.sqrt() + floor
    return torch.where(unreachable, torch.full_like(cost, math.inf), cost)
