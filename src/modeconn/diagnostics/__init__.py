"""``modeconn check``: "will these two merge?" without evaluating the path (docs/methods.md §1, "Prediction").

- :func:`check` — relationship, identifiability and predicted barriers of a pair (or of model A alone: its twin);
- :mod:`~modeconn.diagnostics.pair` — per-space activation statistics, CKA, per-layer weight cosine;
- :mod:`~modeconn.diagnostics.structure` — per-layer realization costs, swap costs, margins, k, ν(U);
- :mod:`~modeconn.diagnostics.predictor` — the stated mapping from a diagnostic to a barrier, and its fit.
"""

from .check import RECOMMENDATIONS, RELATIONSHIPS, CheckResult, check
from .predictor import GO_THRESHOLD, LogLinear, fit_loglinear

__all__ = ["GO_THRESHOLD", "RECOMMENDATIONS", "RELATIONSHIPS", "CheckResult", "LogLinear", "check", "fit_loglinear"]
