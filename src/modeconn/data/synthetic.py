"""Synthetic Gaussian mixtures on a k-dimensional subspace of R^d with controllable coherence.

Used by the neuron-identifiability experiments (docs/methods.md §1, experiments (b) and (c)): the data live exactly on
``span(U)`` (plus optional isotropic noise), so the realization cost, swap cost and coherence ``ν(U)`` of
:mod:`modeconn.identifiability` apply to them directly.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import TensorDataset

from ..errors import ConfigError
from .bundle import DatasetBundle

_MEAN_CANDIDATES = 16
"""Random sets of class means drawn; the best spread one (max min-distance / rms norm) is kept."""


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
    return value


def _check_float(value: object, name: str, lo: float, hi: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= float(value) <= hi:
        bounds = f"[{lo}, {hi}]" if math.isfinite(hi) else f"≥ {lo} (finite)"
        raise ConfigError(f"{name} must be a number in {bounds}, got {value!r}")
    if not math.isfinite(float(value)):
        raise ConfigError(f"{name} must be finite, got {value!r}")
    return float(value)


def _qr_basis(m: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis of the columns of ``m`` (reduced QR, columns signed so that ``diag(R) > 0``)."""
    q, r = torch.linalg.qr(m, mode="reduced")
    sign = torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)
    return q * sign


def coherent_basis(d: int, k: int, coherence: float, generator: torch.Generator) -> torch.Tensor:
    """The ``(d, k)`` float64 orthonormal basis of :func:`subspace_mixture` for a coherence knob in ``[0, 1]``.

    Draws ``U₀`` (Haar-random: QR of a ``d × k`` standard normal matrix) from ``generator`` and lets ``S`` be the
    ``k`` coordinates of largest leverage ``‖U₀ᵀ e_j‖²`` (ties by index). For ``c < 1`` the basis spans the rows
    of ``U₀`` re-weighted by ``s = 1 / (1 − c)`` on ``S``: ``U(c) = qr(W U₀)``, ``W = diag(s on S, 1 elsewhere)``;
    for ``c = 1`` it is exactly ``[e_{S_1}, …, e_{S_k}]`` (``S`` ascending), the limit of that span as ``s → ∞``.

    Monotonicity: the leverage of row ``j`` of ``span(W U₀)`` is ``ℓ_j = w_j² u_jᵀ Σ⁻¹ u_j`` with
    ``Σ = Σ_l w_l² u_l u_lᵀ`` (``u_l`` the rows of ``U₀``). Raising ``s`` grows ``Σ`` (Loewner order) with
    ``w_j = 1`` fixed for ``j ∉ S``, so those leverages can only fall; and since ``span(W U₀)`` does not change when
    ``W`` is divided by ``s``, it equally shrinks the weights ``1/s`` outside ``S`` with ``w_j = 1`` fixed on ``S``, so
    every leverage in ``S`` can only rise. ``S`` holds the largest leverage at ``c = 0``, hence the maximum
    leverage — and with it ``ν(U) = (d/k) · max_j ‖Uᵀ e_j‖²`` — is non-decreasing in ``c``, from ``ν(U₀)`` (a generic
    random basis) to ``d/k`` at ``c = 1``.
    """
    u0 = _qr_basis(torch.randn(d, k, generator=generator, dtype=torch.float64))
    lev = (u0 * u0).sum(dim=1)
    support = torch.sort(torch.argsort(-lev, stable=True)[:k]).values
    if coherence >= 1.0:
        u = torch.zeros(d, k, dtype=torch.float64)
        u[support, torch.arange(k)] = 1.0
        return u
    w = torch.ones(d, 1, dtype=torch.float64)
    w[support] = 1.0 / (1.0 - coherence)
    return _qr_basis(w * u0)


def _class_means(num_classes: int, k: int, class_sep: float, generator: torch.Generator) -> torch.Tensor:
    """``(num_classes, k)`` centred means with minimum pairwise distance exactly ``class_sep``."""
    cand = torch.randn(_MEAN_CANDIDATES, num_classes, k, generator=generator, dtype=torch.float64)
    cand = cand - cand.mean(dim=1, keepdim=True)
    dist = torch.cdist(cand, cand) + torch.diag(torch.full((num_classes,), math.inf, dtype=torch.float64))
    min_dist = dist.amin(dim=(1, 2))
    rms = cand.pow(2).sum(-1).mean(-1).sqrt()
    best = int(torch.argmax(min_dist / rms))
    if float(min_dist[best]) <= 0.0:  # probability zero; keep the function total
        raise ConfigError("could not draw distinct class means; try another seed")
    return cand[best] * (class_sep / min_dist[best])


def _latent(n: int, means: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Balanced shuffled labels ``(n,)`` and latent samples ``z = μ_y + N(0, I_k)`` ``(n, k)`` float64."""
    num_classes, k = means.shape
    y = (torch.arange(n) % num_classes)[torch.randperm(n, generator=generator)]
    return y, means[y] + torch.randn(n, k, generator=generator, dtype=torch.float64)


def subspace_mixture(
    n_train: int,
    n_test: int,
    d: int,
    k: int,
    num_classes: int,
    *,
    coherence: float = 0.0,
    class_sep: float = 3.0,
    noise: float = 0.0,
    seed: int = 0,
) -> tuple[DatasetBundle, torch.Tensor]:
    """A Gaussian mixture on a k-dimensional subspace of R^d: ``x = U z (+ noise)``.

    Latent ``z ∈ R^k``: class ``c`` is ``N(μ_c, I_k)`` (unit within-class covariance); the means are centred,
    drawn at random (the best spread of 16 draws) and scaled so that the *minimum* distance between two class
    means is ``class_sep`` within-class standard deviations (each pair is then separable by a hyperplane up to the
    Bayes error ``Φ(−class_sep/2)``, 6.7 % for the closest pair at ``class_sep = 3``). Labels are balanced
    (``n % num_classes`` classes get one extra example) and shuffled. ``x = U z`` embeds into R^d, plus isotropic
    ``N(0, noise² I_d)`` when ``noise > 0``. Train and test share ``U`` and the means.

    ``U`` (``d × k``, orthonormal columns) comes from :func:`coherent_basis`: ``coherence = 0`` is a Haar-random
    basis (``ν(U)`` small — generically a little above the minimum 1), ``coherence = 1`` is exactly ``k``
    standard basis vectors (``ν = d/k``), and ``ν(U)`` is non-decreasing in the knob in between (proof in
    :func:`coherent_basis`). For a fixed seed the latent samples, labels and noise are the same for every
    ``coherence``; only the embedding changes.

    Input layout: ``x`` is stored as ``(N, 1, 1, d)`` float32 with ``input_shape = (1, 1, d)``, because
    :mod:`modeconn.models` builders take ``in_shape = (C, H, W)`` (a 1-tuple is rejected by their validation);
    ``mlp`` flattens it to ``d`` features. ``x.flatten(1) @ U`` recovers ``z`` when ``noise = 0``.

    Determinism: everything is drawn from one ``torch.Generator().manual_seed(seed)``; the same arguments give
    the same bytes in every process. The global RNG is neither read nor advanced.

    Args:
        n_train: training examples (≥ 1). n_test: test examples (≥ 0).
        d: ambient dimension (≥ 1). k: subspace dimension, ``1 ≤ k ≤ d``. num_classes: ≥ 2.
        coherence: knob in ``[0, 1]``. class_sep: minimum distance of class means (≥ 0, units of the
            within-class std). noise: std of the ambient isotropic noise (≥ 0). seed: integer seed.
    Returns:
        ``(bundle, U)``: a :class:`DatasetBundle` (name ``"subspace_mixture"``, empty ``val`` of shape
        ``(0, 1, 1, d)``, classes ``("0", "1", …)``, source ``"synthetic"``) and ``U`` ``(d, k)`` float64.
    Raises:
        ConfigError: ``k > d``, ``k < 1``, ``coherence`` outside ``[0, 1]``, ``num_classes < 2``, negative or
            non-finite ``class_sep`` / ``noise``, non-integer sizes or seed.
    """
    n_train = _check_int(n_train, "n_train", 1)
    n_test = _check_int(n_test, "n_test", 0)
    d = _check_int(d, "d", 1)
    k = _check_int(k, "k", 1)
    num_classes = _check_int(num_classes, "num_classes", 2)
    if k > d:
        raise ConfigError(f"k must be ≤ d (a k-dimensional subspace of R^d), got k={k}, d={d}")
    coherence = _check_float(coherence, "coherence", 0.0, 1.0)
    class_sep = _check_float(class_sep, "class_sep", 0.0)
    noise = _check_float(noise, "noise", 0.0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")

    gen = torch.Generator().manual_seed(seed)
    u = coherent_basis(d, k, coherence, gen)
    means = _class_means(num_classes, k, class_sep, gen)
    latents = [_latent(n, means, gen) for n in (n_train, n_test)]  # independent of noise: drawn first
    splits = [_embedded(y, z, u, noise, gen) for y, z in latents]
    val = TensorDataset(torch.zeros(0, 1, 1, d, dtype=torch.float32), torch.zeros(0, dtype=torch.int64))
    bundle = DatasetBundle(
        name="subspace_mixture",
        train=splits[0],
        val=val,
        test=splits[1],
        num_classes=num_classes,
        input_shape=(1, 1, d),
        classes=tuple(str(c) for c in range(num_classes)),
        source="synthetic",
    )
    return bundle, u


def _embedded(y: torch.Tensor, z: torch.Tensor, u: torch.Tensor, noise: float, gen: torch.Generator) -> TensorDataset:
    """Labels ``y`` with inputs ``x = U z`` (plus ``N(0, noise² I_d)`` drawn from ``gen`` when ``noise > 0``) in the
    ``(N, 1, 1, d)`` float32 layout of :func:`subspace_mixture`."""
    x = z @ u.mT
    if noise > 0:
        x = x + noise * torch.randn(x.shape, generator=gen, dtype=torch.float64)
    return TensorDataset(x.to(torch.float32).reshape(-1, 1, 1, u.shape[0]).contiguous(), y.to(torch.int64))
