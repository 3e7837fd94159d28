"""Chord deviation of network outputs along an interpolation path (docs/methods.md §1)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError
from ._validate import as_f64, shape_str


def chord_deviation(outputs: Any, lambdas: Any) -> torch.Tensor:
    """Mean distance of the path's outputs from the chord between its end outputs, per grid point.

    With ``λ̃ = (λ − λ_first) / (λ_last − λ_first)`` the normalised position on the grid::

        dev(λ) = mean_n ‖ out_n(λ) − ((1 − λ̃) out_n(λ_first) + λ̃ out_n(λ_last)) ‖₂

    (the norm over the output dimension ``K``). In the center-dominated regime of W-asymmetric networks the
    deviation is ``O(β^{3/2})`` (``β`` the relative size of the trained part), hence a low barrier. It is
    exactly 0 at both ends and for outputs affine in ``λ``.

    Args:
        outputs: ``(L, N, K)`` network outputs (logits, units of the outputs) of ``N`` inputs at the ``L`` grid
            points; further trailing dimensions are flattened into ``K``, a 2-D ``(L, N)`` means ``K = 1``.
        lambdas: ``(L,)`` strictly increasing grid, ``L ≥ 2`` (e.g. ``linspace(0, 1, 25)``).
    Returns:
        ``(L,)`` float64 on ``outputs``' device.
    Raises:
        ConfigError: ranks/lengths disagree, ``L < 2``, ``N = 0``, ``lambdas`` not strictly increasing.
        NonFiniteError: NaN/Inf in ``outputs`` or ``lambdas``.
    """
    out = as_f64(outputs, "outputs")
    if out.ndim < 2:
        raise ConfigError(f"outputs must be (L, N, K) (or (L, N)), got shape {shape_str(out.shape)}")
    lam = as_f64(lambdas, "lambdas", 1).to(out.device)
    num = out.shape[0]
    if lam.shape[0] != num:
        raise ConfigError(f"lambdas has shape {shape_str(lam.shape)} but outputs has shape {shape_str(out.shape)}: "
                          f"expected one λ per grid point ({num},)")
    if num < 2:
        raise ConfigError(f"chord_deviation needs at least 2 grid points, got lambdas of shape {shape_str(lam.shape)}")
    if not bool((lam[1:] > lam[:-1]).all()):
        raise ConfigError(f"lambdas must be strictly increasing, got {lam.tolist()}")
    if out.shape[1] == 0:
        raise ConfigError(f"outputs has no inputs (N = 0): shape {shape_str(out.shape)}")
    out = out.reshape(num, out.shape[1], -1)
    t = ((lam - lam[0]) / (lam[-1] - lam[0])).view(num, 1, 1)
    chord = (1.0 - t) * out[0:1] + t * out[-1:]
    return torch.linalg.vector_norm(out - chord, dim=-1).mean(dim=1)


def max_chord_deviation(outputs: Any, lambdas: Any) -> float:
    """``max_λ`` of :func:`chord_deviation` (a Python float, units of the outputs); same arguments and errors."""
    return float(chord_deviation(outputs, lambdas).max())
