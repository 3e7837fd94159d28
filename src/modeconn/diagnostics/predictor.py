"""The stated predictor of ``modeconn check``: a log-log line from one diagnostic to the test-loss ``barrier_mean``.

Pair predictor (two models A, B): for an assignment ``π`` of B's units to A's (the identity, weight matching's, or
activation matching's optimum), ``x = 1 − q̄(π)`` where ``q̄(π)`` is the mean over spaces of the mean unit
correlation ``q(π) = (1/n) Σ_i corr[i, π(i)]`` (:mod:`modeconn.diagnostics.pair`). Twin predictor (A alone):
``x = min over layers of relative_swap_cost`` (:mod:`modeconn.diagnostics.structure`; 0 for a standard network).
Both map ``x`` to a barrier (nats) through::

    log(max(B, B_FLOOR)) = intercept + slope · log(max(x, X_FLOOR))

i.e. ``B̂ = exp(intercept) · x^slope``. The coefficients are least-squares fits on pairs with measured unaligned
barriers (``modeconn experiment check-calibration``); the interval is the fit's residual quantiles ``[Q_LO, Q_HI]``
(multiplicative). The aligned predictions read the same line at ``x = 1 − q̄(π)`` for weight matching's and activation
matching's permutation; ``check`` takes lines of their own where a calibration gives them (``"weight_matched"``,
``"activation_matched"``) — the shipped one does not: on the calibration population such lines, fitted to aligned
barriers, rank held-out aligned barriers worse than the pair line does (docs/results/check-calibration).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ConfigError

B_FLOOR = 0.005
"""Barriers below this (nats, negatives included) are fitted as this value: below it they are measurement noise."""
X_FLOOR = 0.01
"""Diagnostic values below this are fitted as this value."""
Q_LO, Q_HI = 0.1, 0.9
"""Residual quantiles that make the prediction interval."""
GO_THRESHOLD = 0.1
"""Go / no-go: merging without alignment is predicted to work when the predicted ``barrier_mean`` is below this (nats)."""


@dataclass(frozen=True)
class LogLinear:
    """``log(B) = intercept + slope · log(max(x, X_FLOOR))`` (``B`` in nats); ``lo ≤ 0 ≤ hi`` the residual quantiles
    of ``log B`` (clamped at 0, so that the interval always holds the fitted line — an exact fit's residuals are
    rounding noise of either sign); ``n`` points fitted; ``feature`` names ``x``."""

    feature: str
    intercept: float
    slope: float
    lo: float
    hi: float
    n: int

    def predict(self, x: float) -> dict[str, float]:
        """``{"barrier_mean", "low", "high"}`` in nats for diagnostic value ``x`` (``low ≤ barrier_mean ≤ high``).
        Raises ConfigError for an ``x`` that is not a finite number: an undefined diagnostic has no prediction
        (:func:`not_applicable`)."""
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
            raise ConfigError(f"{self.feature} = {x!r}: a prediction needs a finite value of the diagnostic")
        mid = self.intercept + self.slope * math.log(max(float(x), X_FLOOR))
        return {"barrier_mean": math.exp(mid), "low": math.exp(mid + self.lo), "high": math.exp(mid + self.hi)}

    def to_json(self) -> dict:
        return asdict(self)


def not_applicable(reason: str) -> dict[str, float | str | None]:
    """The prediction of an undefined diagnostic: ``barrier_mean``, ``low`` and ``high`` None, ``not_applicable``
    the reason (never a NaN standing in for a number)."""
    return {"barrier_mean": None, "low": None, "high": None, "not_applicable": reason}


def fit_loglinear(feature: str, x: Sequence[float], barrier: Sequence[float]) -> LogLinear:
    """Least-squares fit of :class:`LogLinear` to points ``(x, barrier)`` (equal lengths, ≥ 3 points; nats).

    A slope is fitted only when ``x`` varies (else 0, the mean). Raises ConfigError for too few or mismatched points.
    """
    if len(x) != len(barrier) or len(x) < 3:
        raise ConfigError(f"fit_loglinear needs ≥ 3 points and as many barriers as x, got {len(x)} and {len(barrier)}")
    lx = np.log(np.maximum(np.asarray(x, float), X_FLOOR))
    ly = np.log(np.maximum(np.asarray(barrier, float), B_FLOOR))
    if np.ptp(lx) > 0:
        slope, intercept = np.polyfit(lx, ly, 1)
    else:
        slope, intercept = 0.0, float(ly.mean())
    res = ly - (intercept + slope * lx)
    return LogLinear(feature, float(intercept), float(slope), min(float(np.quantile(res, Q_LO)), 0.0),
                     max(float(np.quantile(res, Q_HI)), 0.0), len(lx))
