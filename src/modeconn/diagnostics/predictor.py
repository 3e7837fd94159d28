"""The stated predictor of ``modeconn check``: log-linear lines from diagnostics to the test-loss ``barrier_mean``.

Pair predictors (two models A, B), as they are and after an alignment ``g`` (weight matching's permutation,
activation matching's optimum): ``x`` = the path's barrier over its endpoints and midpoint alone, measured on
``check``'s evaluation examples (:mod:`modeconn.diagnostics.midpoint`; a line whose ``feature`` is ``1 - mean unit
correlation …`` reads ``1 − q̄(g)``, the mean over spaces of the mean unit correlation under ``g``,
:mod:`modeconn.diagnostics.pair`, instead). Twin predictor (A alone): ``x = min over layers of
relative_swap_cost`` (:mod:`modeconn.diagnostics.structure`; 0 for a standard network). Each line maps ``x`` and
further features ``z_k`` (its ``terms``: the headroom — entropy of the training labels minus the endpoints' mean test
loss —, that test loss, the label entropy, the mean linear CKA; :func:`modeconn.diagnostics.check.endpoint_features`)
to a barrier (nats)::

    log(max(B, B_FLOOR)) = intercept + slope · log(max(x, X_FLOOR)) + Σ_k c_k · log(max(z_k, X_FLOOR))

i.e. ``B̂ = exp(intercept) · x^slope · Π z_k^c_k``. The coefficients are least-squares fits on pairs with measured
barriers (``modeconn experiment check-calibration``), one line per prediction fitted to its own measured barrier
(unaligned, after weight matching, after activation matching); the interval ``[lo, hi]`` bounds the residuals of
``log B`` (multiplicative) — the shipped calibration takes split-conformal bounds (:func:`conformal_bounds`) of
leave-one-family-out residuals, the error on a family the line has not seen — and, for a measured ``x``, widens with
its standard error (:meth:`LogLinear.predict`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ConfigError

B_FLOOR = 0.005
"""Barriers below this (nats, negatives included) are fitted as this value: below it they are measurement noise."""
X_FLOOR = 0.01
"""Diagnostic values below this are fitted as this value."""
Q_LO, Q_HI = 0.05, 0.95
"""Residual quantiles that make the prediction interval."""
Z_90 = 1.6448536269514722
"""The standard normal's 95 % quantile: a 5 %–95 % interval of a normal sampling error is ± Z_90 standard errors."""
GO_THRESHOLD = 0.1
"""Go / no-go: merging without alignment is predicted to work when the predicted ``barrier_mean`` is below this (nats)."""


def _log(value: float, name: str, floor: float = X_FLOOR) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(f"{name} = {value!r}: a prediction needs a finite value of the diagnostic")
    return math.log(max(float(value), floor))


@dataclass(frozen=True)
class LogLinear:
    """``log(B) = intercept + slope · log(max(x, x_floor)) + Σ_k c_k · log(max(z_k, X_FLOOR))`` (``B`` in nats;
    ``terms``: the further features ``(name, c_k)``, none for a one-feature line); ``lo ≤ 0 ≤ hi`` the residual
    quantiles of ``log B`` (clamped at 0, so that the interval always holds the fitted line — an exact fit's
    residuals are rounding noise of either sign); ``n`` points fitted; ``feature`` names ``x``; ``x_floor``: the
    value below which ``x`` is noise (:data:`X_FLOOR`; :data:`B_FLOOR` for an ``x`` that is itself a measured
    barrier)."""

    feature: str
    intercept: float
    slope: float
    lo: float
    hi: float
    n: int
    terms: tuple[tuple[str, float], ...] = ()
    x_floor: float = X_FLOOR

    def predict(self, x: float, x_se: float = 0.0, **features: float) -> dict[str, float]:
        """``{"barrier_mean", "low", "high"}`` in nats for diagnostic value ``x`` and the values of the ``terms``'
        features by name (``low ≤ barrier_mean ≤ high``; ``barrier_mean`` and ``high`` at least :data:`B_FLOOR`, the fit's
        noise floor, and ``low`` 0 where it would be at the floor: a barrier of exactly 0 — identical models — lies in
        the interval).
        ``x_se``: the standard error of a measured ``x`` (its sampling error, absent from the fit's residuals),
        added to the interval in quadrature on the log scale: each side ``sqrt(q² + (Z_90 · slope · x_se / x)²)``.
        Raises ConfigError for a value that is not a finite number or a term's feature not given: an undefined
        diagnostic has no prediction (:func:`not_applicable`)."""
        lx = _log(x, self.feature, self.x_floor)
        mid = self.intercept + self.slope * lx
        for name, c in self.terms:
            if name not in features:
                raise ConfigError(f"this calibration line needs the feature {name!r}, which was not given")
            mid += c * _log(features[name], name)
        spread = (Z_90 * self.slope * float(x_se) / math.exp(lx)) ** 2
        out = {k: max(math.exp(min(mid + d, 700.0)), B_FLOOR)  # 700: no float overflow far outside the fit
               for k, d in (("barrier_mean", 0.0), ("low", -math.sqrt(self.lo ** 2 + spread)),
                            ("high", math.sqrt(self.hi ** 2 + spread)))}
        if out["low"] <= B_FLOOR:
            out["low"] = 0.0  # the fit cannot tell barriers below its floor from none: the interval holds 0
        return out

    def to_json(self) -> dict:
        return {**asdict(self), "terms": [list(t) for t in self.terms]}

    @classmethod
    def from_json(cls, d: Mapping) -> LogLinear:
        """The line :meth:`to_json` wrote."""
        return cls(**{**d, "terms": tuple((str(n), float(c)) for n, c in d.get("terms", ()))})


def not_applicable(reason: str) -> dict[str, float | str | None]:
    """The prediction of an undefined diagnostic: ``barrier_mean``, ``low`` and ``high`` None, ``not_applicable``
    the reason (never a NaN standing in for a number)."""
    return {"barrier_mean": None, "low": None, "high": None, "not_applicable": reason}


def conformal_bounds(residuals: Sequence[float]) -> tuple[float, float]:
    """``(lo, hi)``: split-conformal bounds of held-out residuals at the levels ``Q_LO`` / ``Q_HI`` — the
    ``⌊(n + 1)·Q_LO⌋``-th smallest and the ``⌈(n + 1)·Q_HI⌉``-th smallest of the ``n`` residuals (clipped to the
    sample), so that a new exchangeable residual falls inside with probability ≥ ``Q_HI − Q_LO`` (Vovk et al. 2005;
    Lei et al. 2018), where plain sample quantiles undercover by about 1 / n; clamped to hold 0. ConfigError for no
    residual."""
    r = np.sort(np.asarray(residuals, float))
    if len(r) == 0:
        raise ConfigError("conformal_bounds needs at least one residual")
    n = len(r)
    lo = r[min(max(math.floor((n + 1) * Q_LO), 1), n) - 1]
    hi = r[min(max(math.ceil((n + 1) * Q_HI), 1), n) - 1]
    return min(float(lo), 0.0), max(float(hi), 0.0)


def fit_loglinear(feature: str, x: Sequence[float], barrier: Sequence[float],
                  terms: Mapping[str, Sequence[float]] | None = None,
                  fixed: Mapping[str, tuple[float, Sequence[float]]] | None = None,
                  x_floor: float = X_FLOOR) -> LogLinear:
    """Least-squares fit of :class:`LogLinear` to points ``(x, barrier)`` (equal lengths, ≥ 3 points; nats) and, in
    ``terms``, further features by name (one value per point) whose coefficients are fitted; ``fixed``: features
    ``name → (coefficient, values)`` whose coefficient is given (e.g. 1: the barrier proportional to the feature);
    ``x_floor``: the line's :attr:`LogLinear.x_floor`.

    A slope is fitted only for a feature that varies (else 0). Raises ConfigError for too few or mismatched points.
    """
    terms, fixed = dict(terms or {}), dict(fixed or {})
    if len(x) != len(barrier) or len(x) < 3 or any(len(v) != len(x) for v in
                                                   [*terms.values(), *(v for _, v in fixed.values())]):
        raise ConfigError(f"fit_loglinear needs ≥ 3 points and as many barriers (and feature values) as x, got "
                          f"{len(x)} and {len(barrier)}")
    log = lambda v: np.log(np.maximum(np.asarray(v, float), X_FLOOR))  # noqa: E731
    cols = [np.log(np.maximum(np.asarray(x, float), x_floor)), *(log(v) for v in terms.values())]
    ly = np.log(np.maximum(np.asarray(barrier, float), B_FLOOR))
    ly_free = ly - sum((c * log(v) for c, v in fixed.values()), np.zeros_like(ly))
    varies = [np.ptp(c) > 0 for c in cols]
    design = np.column_stack([np.ones_like(ly)] + [c for c, v in zip(cols, varies, strict=True) if v])
    coef = np.linalg.lstsq(design, ly_free, rcond=None)[0]
    it = iter(coef[1:])
    slopes = [float(next(it)) if v else 0.0 for v in varies]
    res = ly_free - design @ coef
    return LogLinear(feature, float(coef[0]), slopes[0], min(float(np.quantile(res, Q_LO)), 0.0),
                     max(float(np.quantile(res, Q_HI)), 0.0), len(ly),
                     (*zip(terms, slopes[1:], strict=True), *((n, float(c)) for n, (c, _) in fixed.items())), x_floor)
