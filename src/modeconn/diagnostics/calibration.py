"""The calibration ``modeconn check`` ships: the predictor lines fitted on every family of the full
``modeconn experiment check-calibration`` run (its ``calibration_pair`` / ``calibration_twin`` entries,
docs/results/check-calibration/results.json). Rerunning that experiment reproduces these coefficients; a new fit is
pasted here, and ``check(..., calibration=...)`` takes any other.
"""

from .predictor import LogLinear

DEFAULT = {
    "pair": LogLinear(feature="1 - mean unit correlation", intercept=-0.1746150238657197, slope=1.2454360339878205,
                      lo=-0.9983698441603617, hi=0.7120251790409331, n=32),
    "twin": LogLinear(feature="min relative swap cost", intercept=-1.2050459725733391, slope=-0.36978723334775815,
                      lo=-0.8626601148759844, hi=1.2086292066195068, n=30),
}
"""``{"pair": LogLinear, "twin": LogLinear}`` (:mod:`modeconn.diagnostics.predictor`)."""
