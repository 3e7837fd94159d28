"""Typed option fields shared by the alignment methods' configs, and the λ schedule of learned and dual matching.

Every method's options are a :class:`~modeconn.config.StrictConfig` (``WeightMatchingConfig``,
``ActivationMatchingConfig``, ``LearnedMatchingConfig``, ``DualMatchingConfig``, ``ReferenceMatchingConfig``),
accepted as ``config=`` plus keyword overrides. The same name means the same thing everywhere:

* ``seed``: seeds every random choice of the run (one ``torch.Generator`` per purpose; same seed → same bytes).
* ``steps`` / ``lr``: optimiser steps (one batch each) and the Adam learning rate of the learned methods.
* ``init``: where the search starts — a named start or a group element (weight matching: ``"greedy"`` |
  ``"identity"`` | element; learned matching: ``"weight"`` | ``"identity"`` | element; dual matching:
  ``"weight"`` | ``"identity"``). ``"weight"`` is weight matching's solution, ``"identity"`` the identity element.
* ``lambda_schedule`` / ``lambda_value`` / ``lambda_width``: the λ (weight of B on the path) drawn per step of a
  learned method: ``"uniform"`` (λ ~ U(0, 1)), ``"narrow"`` (λ ~ U(λ₀ − w, λ₀ + w) ∩ [0, 1]) or ``"fixed"``
  (λ = λ₀), ``λ₀ = lambda_value`` ∈ [0, 1], ``w = lambda_width`` ∈ (0, 1]. Learned matching's former
  ``lambda_sampling`` (``"uniform"`` | ``"midpoint"``) still works with a DeprecationWarning (``"midpoint"`` is
  ``lambda_schedule="fixed", lambda_value=0.5``).
"""

from __future__ import annotations

import numbers
from typing import Annotated, Any, Literal

import torch
from pydantic import BeforeValidator, Field

from ..config import StrictConfig


def _int_like(v: Any) -> Any:
    """Integral numbers (numpy ints included) as ``int``; bools and everything else unchanged (rejected below)."""
    return int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v


def _real_like(v: Any) -> Any:
    return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else v


Int = Annotated[int, BeforeValidator(_int_like), Field(strict=True)]
"""An int (numpy ints accepted; bools, floats and strings rejected)."""
PositiveInt = Annotated[int, BeforeValidator(_int_like), Field(strict=True, ge=1)]
Real = Annotated[float, BeforeValidator(_real_like), Field(strict=True, allow_inf_nan=False)]
"""A finite real number (ints accepted; bools, strings, NaN and ±Inf rejected)."""
PositiveReal = Annotated[float, BeforeValidator(_real_like), Field(strict=True, gt=0, allow_inf_nan=False)]
Bool = Annotated[bool, Field(strict=True)]

LAMBDA_SCHEDULES = ("uniform", "narrow", "fixed")


class LambdaSchedule(StrictConfig):
    """The λ schedule fields (module docstring), shared by learned and dual matching."""

    lambda_schedule: Literal["uniform", "narrow", "fixed"] = "uniform"
    lambda_value: Annotated[float, BeforeValidator(_real_like), Field(strict=True, ge=0, le=1)] = 0.5
    lambda_width: Annotated[float, BeforeValidator(_real_like), Field(strict=True, gt=0, le=1)] = 0.1


def draw_lambda(schedule: str, value: float, width: float, gen: torch.Generator,
                dtype: torch.dtype = torch.float64) -> float:
    """One λ of ``schedule`` (module docstring); ``fixed`` draws nothing from ``gen``, the others one ``dtype``
    uniform variate."""
    if schedule == "fixed":
        return value
    u = float(torch.rand((), generator=gen, dtype=dtype))
    if schedule == "uniform":
        return u
    lo, hi = max(0.0, value - width), min(1.0, value + width)
    return lo + (hi - lo) * u
