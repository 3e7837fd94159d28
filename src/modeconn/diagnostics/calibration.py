"""The calibration ``modeconn check`` ships: the predictor lines fitted on every family of the
``modeconn experiment check-calibration`` run (its ``calibration_pair`` / ``calibration_twin`` /
``calibration_weight_matched`` / ``calibration_activation_matched`` entries, docs/results/check-calibration/results.json).
Rerunning that experiment reproduces these coefficients; a new fit is pasted here, and ``check(..., calibration=...)``
takes any other.
"""

from .predictor import LogLinear

DEFAULT = {
    "pair": LogLinear(
        feature='barrier over λ = 0, 1/2, 1 as they are',
        intercept=0.0070321374176086915, slope=0.992711999349825, lo=-0.05338896460212206, hi=0.11664839886924873, n=63,
        x_floor=0.005,
    ),
    "twin": LogLinear(
        feature='min relative swap cost',
        intercept=-0.7806904189905987, slope=-0.34831017362289224, lo=-2.1646490957918507, hi=2.390117974741226, n=61,
        terms=(
            ('headroom', -0.3749848587471479),
            ('test_loss', -0.9933037933100676),
            ('label_entropy', -1.5207748445687836),
        ),
    ),
    "weight_matched": LogLinear(
        feature='barrier over λ = 0, 1/2, 1 after weight matching',
        intercept=0.002664015527066144, slope=0.9981072973538822, lo=-0.015923324021192342, hi=0.07625722528493625, n=41,
        x_floor=0.005,
    ),
    "activation_matched": LogLinear(
        feature='barrier over λ = 0, 1/2, 1 after activation matching',
        intercept=-0.021808714744864507, slope=0.9874571340355696, lo=-0.08373568647143018, hi=0.1348797907591771, n=41,
        x_floor=0.005,
    ),
}
"""``{"pair", "twin", "weight_matched", "activation_matched"}`` → :class:`~modeconn.diagnostics.predictor.LogLinear`:
one line per prediction, each fitted to its own measured barrier."""
