"""The calibration ``modeconn check`` ships: the predictor lines fitted on every family of the full
``modeconn experiment check-calibration`` run (its ``calibration_pair`` / ``calibration_twin`` entries,
docs/results/check-calibration/results.json). Rerunning that experiment reproduces these coefficients; a new fit is
pasted here, and ``check(..., calibration=...)`` takes any other.
"""

from .predictor import LogLinear

DEFAULT = {
    "pair": LogLinear(feature="1 - mean unit correlation", intercept=-0.2289104864424126, slope=1.2266836617813506,
                      lo=-1.0010908815858643, hi=0.7619692695422278, n=30),
    "twin": LogLinear(feature="min relative swap cost", intercept=-1.1831459327113418, slope=-0.37655253438876807,
                      lo=-0.9176047681155306, hi=1.323432742258754, n=28),
}
"""``{"pair": LogLinear, "twin": LogLinear}`` (:mod:`modeconn.diagnostics.predictor`)."""
