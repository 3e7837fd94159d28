"""Input subspaces: orthonormal bases, coherence, PCA estimate, separation of projected centers.

docs/methods.md §1 (Neuron identifiability): the data live on ``X ⊂ span(U)``, ``U`` a ``d_in × k``
matrix with orthonormal columns; a neuron with fixed offset row ``f_i`` sees only its projected center
``b_i = Uᵀ f_i ∈ R^k``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError
from ._validate import as_f64, check_basis, shape_str


def orthonormalize(U: Any) -> torch.Tensor:
    """An orthonormal basis of the column span of ``U`` (QR with a sign fix), float64.

    ``Q, R = qr(U)`` (reduced), then each column ``q_j`` is multiplied by ``sign(R_jj)`` so that the result is
    unique: the returned ``Q`` satisfies ``U = Q R'`` with ``R'`` upper triangular with a positive diagonal
    (Gram–Schmidt order). A ``U`` that already has orthonormal columns comes back unchanged up to round-off.

    Args:
        U: ``(d_in, k)`` real matrix of full column rank, ``k ≤ d_in``.
    Returns:
        ``(d_in, k)`` float64 tensor with ``QᵀQ = I`` (on ``U``'s device).
    Raises:
        ConfigError: not 2-D, ``k > d_in``, ``k = 0``, or rank-deficient (``|R_jj| ≤ 1e-10 · max|R_jj|``).
        NonFiniteError: NaN/Inf in ``U``.
    """
    u = as_f64(U, "U", 2)
    d_in, k = u.shape
    if k < 1 or k > d_in:
        raise ConfigError(f"U must have shape (d_in, k) with d_in ≥ k ≥ 1, got {shape_str(u.shape)}")
    q, r = torch.linalg.qr(u, mode="reduced")
    diag = torch.diagonal(r)
    scale = float(diag.abs().max())
    if scale == 0.0 or float(diag.abs().min()) <= 1e-10 * scale:
        raise ConfigError(f"U (shape {shape_str(u.shape)}) is rank-deficient: its columns do not span k={k} dimensions")
    sign = torch.where(diag < 0, -1.0, 1.0).to(q.dtype)
    return q * sign


def subspace_coherence(U: Any) -> float:
    """Subspace coherence ``ν(U) = (d_in / k) · max_j ‖Uᵀ e_j‖²`` (dimensionless).

    ``‖Uᵀe_j‖²`` is the leverage of input coordinate ``j`` (the ``j``-th diagonal entry of the projector ``UUᵀ``);
    the leverages sum to ``k``, so ``ν ∈ [1, d_in/k]``: ``1`` when every coordinate carries the same share of the
    subspace (e.g. columns of a normalised Hadamard matrix), ``d_in/k`` when the subspace contains a standard basis
    vector (coordinate-aligned). High coherence lets a mask ``D`` alone (``F = 0``) make particular features
    expensive for particular neurons (docs/methods.md §1). Round-off can put the value ~1e-6 outside the interval.

    Args:
        U: ``(d_in, k)`` with orthonormal columns.
    Raises:
        ConfigError: ``k > d_in`` or columns not orthonormal (see :func:`orthonormalize`).
        NonFiniteError: NaN/Inf in ``U``.
    """
    u = check_basis(U)
    d_in, k = u.shape
    return float(d_in / k * (u * u).sum(dim=1).max())


def estimate_subspace(
    X: Any, k: int | None = None, explained_variance: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PCA estimate of the input subspace: the top principal directions of the centred data.

    ``X_c = X − mean(X)``; ``X_c = P S Vᵀ`` (thin SVD, ``torch.linalg.svd``); ``U = V[:, :k]`` and the explained
    variance ratio of component ``l`` is ``s_l² / Σ_l' s_l'²``. Each column's sign is fixed so that its entry of
    largest magnitude is positive (deterministic output).

    Exactly one of ``k`` / ``explained_variance`` must be given.

    Args:
        X: ``(N, d)`` samples (rows).
        k: number of components, ``1 ≤ k ≤ min(N, d)``; or
        explained_variance: in ``(0, 1]``: the smallest ``k`` whose cumulative explained ratio reaches it.

    Returns:
        ``(U, ratio)``: ``U`` ``(d, k)`` float64 with orthonormal columns, ``ratio`` ``(k,)`` float64 (non-increasing;
        all zeros if ``X`` has zero variance, which is only allowed with ``k``).
    Raises:
        ConfigError: both or neither of ``k`` / ``explained_variance``; ``k`` outside ``[1, min(N, d)]``;
            ``explained_variance`` outside ``(0, 1]`` or requested from zero-variance data; ``X`` not 2-D.
        NonFiniteError: NaN/Inf in ``X``.
    """
    if (k is None) == (explained_variance is None):
        raise ConfigError("estimate_subspace needs exactly one of k / explained_variance, "
                          f"got k={k!r}, explained_variance={explained_variance!r}")
    x = as_f64(X, "X", 2)
    n, d = x.shape
    if n < 1 or d < 1:
        raise ConfigError(f"X must be a non-empty (N, d) matrix, got shape {shape_str(x.shape)}")
    kmax = min(n, d)
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= kmax):
        raise ConfigError(f"k must be an integer in [1, min(N, d)] = [1, {kmax}] for X of shape "
                          f"{shape_str(x.shape)}, got {k!r}")
    if explained_variance is not None:
        ev = float(explained_variance)
        if not 0.0 < ev <= 1.0:
            raise ConfigError(f"explained_variance must be in (0, 1], got {explained_variance!r}")
    xc = x - x.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(xc, full_matrices=False)
    var = s * s
    total = float(var.sum())
    ratio = var / total if total > 0 else torch.zeros_like(var)
    if k is None:
        if total == 0:
            raise ConfigError("X has zero variance: no explained_variance threshold can be reached")
        cum = torch.cumsum(ratio, 0)
        k = min(int((cum < ev - 1e-12).sum()) + 1, kmax)
    u = vh[:k].mT.contiguous()
    idx = u.abs().argmax(dim=0)
    sign = torch.where(u[idx, torch.arange(k, device=u.device)] < 0, -1.0, 1.0).to(u.dtype)
    return u * sign, ratio[:k].clone()


def center_separation(U: Any, f: Any) -> dict[str, float]:
    """How well separated the projected fixed centers ``b_i = Uᵀ f_i`` are (docs/methods.md §1).

    In the center-dominated regime (``F ≫ W``) the swap cost of two neurons is about ``‖b_i − b_j‖²``; with ``m``
    neurons and small intrinsic dimension ``k`` random centers crowd, so symmetry stays effectively unbroken.

    Args:
        U: ``(d_in, k)`` with orthonormal columns.
        f: ``(m, d_in)`` fixed offsets (one row per neuron), ``m ≥ 2``.
    Returns:
        dict of Python floats (distances in the units of ``f``):
        ``min``, ``mean``, ``median`` — over the ``m(m−1)/2`` pairwise distances ``‖b_i − b_j‖``;
        ``nn_mean`` — mean over ``i`` of the nearest-neighbour distance ``min_{j≠i} ‖b_i − b_j‖``;
        ``center_norm_mean`` — mean of ``‖b_i‖``;
        ``min_ratio``, ``mean_ratio``, ``median_ratio``, ``nn_mean_ratio`` — each statistic divided by
        ``center_norm_mean`` (NaN if every center is 0);
        ``m``, ``k`` — as floats.
    Raises:
        ConfigError: bad ``U`` (see :func:`subspace_coherence`), ``f`` not ``(m, d_in)``, ``m < 2``.
        NonFiniteError: NaN/Inf in ``U`` or ``f``.
    """
    u = check_basis(U)
    fm = as_f64(f, "f", 2, device=u.device)
    d_in, k = u.shape
    if fm.shape[1] != d_in:
        raise ConfigError(f"f has shape {shape_str(fm.shape)} but U has shape {shape_str(u.shape)}: "
                          f"expected f of shape (m, {d_in})")
    m = fm.shape[0]
    if m < 2:
        raise ConfigError(f"center_separation needs at least 2 neurons (rows of f), got shape {shape_str(fm.shape)}")
    b = fm @ u
    diff = b[:, None, :] - b[None, :, :]
    dist = torch.sqrt((diff * diff).sum(-1))
    iu = torch.triu_indices(m, m, offset=1, device=dist.device)
    pairs = dist[iu[0], iu[1]]
    nn = (dist + torch.diag(torch.full((m,), float("inf"), dtype=dist.dtype, device=dist.device))).min(dim=1).values
    norm_mean = float(torch.linalg.vector_norm(b, dim=1).mean())
    out = {
        "min": float(pairs.min()),
        "mean": float(pairs.mean()),
        "median": float(torch.quantile(pairs, 0.5)),
        "nn_mean": float(nn.mean()),
        "center_norm_mean": norm_mean,
    }
    for key in ("min", "mean", "median", "nn_mean"):
        out[f"{key}_ratio"] = out[key] / norm_mean if norm_mean > 0 else float("nan")
    out["m"] = float(m)
    out["k"] = float(k)
    return out
