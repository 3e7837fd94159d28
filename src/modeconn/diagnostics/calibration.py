"""The calibration ``modeconn check`` ships: the predictor lines fitted on every family of the
``modeconn experiment check-calibration`` run (its ``calibration_pair`` / ``calibration_twin`` /
``calibration_weight_matched`` / ``calibration_activation_matched`` entries, docs/results/check-calibration/results.json).
Rerunning that experiment reproduces these coefficients; a new fit is pasted here, and ``check(..., calibration=...)``
takes any other.
"""

from .predictor import LogLinear

DEFAULT = {
    "pair": LogLinear(
        feature='1 - mean unit correlation',
        intercept=0.36146973378960795, slope=1.0832714917318247, lo=-1.4458838295395415, hi=1.0607582421546375, n=49,
        terms=(
            ('headroom', 0.049885613671764355),
            ('test_loss', -0.13047478331400772),
            ('label_entropy', -1.063667988837531),
            ('cka', -0.47016159178352845),
        )),
    "twin": LogLinear(
        feature='min relative swap cost',
        intercept=-0.5206427833280042, slope=-0.32853742974475814, lo=-2.047969945147053, hi=2.3030102563573713, n=47,
        terms=(
            ('headroom', -0.3357651235916242),
            ('test_loss', -0.9192314952510643),
            ('label_entropy', -1.6145529499809943),
        )),
    "weight_matched": LogLinear(
        feature="1 - mean unit correlation under weight matching's permutation",
        intercept=1.991356492146876, slope=0.6070351392103839, lo=-1.1360284002588534, hi=1.2480257896981866, n=25,
        terms=(
            ('headroom', 0.46405934584578157),
            ('test_loss', 0.8873118469947868),
            ('label_entropy', -3.8150851078721293),
            ('cka', -1.4851631715889162),
        )),
    "activation_matched": LogLinear(
        feature="1 - mean unit correlation under activation matching's permutation",
        intercept=1.4864955650423517, slope=0.5351551050109125, lo=-0.9473432135196069, hi=0.9851111488545125, n=25,
        terms=(
            ('headroom', 0.3681643697757424),
            ('test_loss', 0.9284626839858867),
            ('label_entropy', -3.621793264470033),
            ('cka', -1.7415774173093745),
        )),
}
"""``{"pair", "twin", "weight_matched", "activation_matched"}`` → :class:`~modeconn.diagnostics.predictor.LogLinear`:
one line per prediction, each fitted to its own measured barrier."""
