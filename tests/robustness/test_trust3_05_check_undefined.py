"""Issue #29, class 5 — ``check`` verdicts from undefined numbers.

A linear probe (no symmetry space) got "NO-GO, predicted barrier nan" and a recommendation; a collapsed model
(all-zero weights) got "identified independent runs" from 0/0 statistics. Every diagnostic whose formula has no value
(no space, every unit constant on the data, an all-zero tensor, a zero denominator) is None with its reason, and a
verdict resting on one is "not applicable" with that reason: ``go`` None, relationship "undetermined",
recommendation "not applicable" — through the API and ``modeconn check`` — and no NaN is ever printed or written as a
prediction (results.json is strict JSON; a prediction that exists lies inside its interval).
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from cli_runner import run_cli

from modeconn.data import load_dataset
from modeconn.diagnostics import check
from modeconn.diagnostics.predictor import LogLinear
from modeconn.errors import ConfigError
from modeconn.io import save_checkpoint
from modeconn.models import build_model

KW = {"max_batches": 1, "batch_size": 200, "eval_limit": 200}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _mlp(seed: int, depth: int = 2):
    return build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=depth, width=16, seed=seed).eval()


def _zeroed(m, *names: str):
    """``m`` with the named parameters (all of them when none are named) set to 0."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not names or name in names:
                p.zero_()
    return m


PAIRS = {  # name → (model A, model B, a phrase the reason must contain)
    "linear probe": (lambda: (_mlp(0, depth=0), _mlp(1, depth=0)), "no symmetry space"),
    "all-zero weights (one hidden layer)": (lambda: (_zeroed(_mlp(0, 1)), _zeroed(_mlp(1, 1))), "constant on the data"),
    "all-zero weights": (lambda: (_zeroed(_mlp(0)), _zeroed(_mlp(1))), "constant on the data"),
    "one zero denominator (B's head is 0)": (lambda: (_mlp(0), _zeroed(_mlp(1), "head.weight")), "all zeros in model B"),
}
ALONE = {  # model A alone: its twin
    "linear probe": (lambda: _mlp(0, depth=0), "no Linear / Conv2d layer"),
    "all-zero weights": (lambda: _zeroed(_mlp(0)), "0/0"),
}


def not_applicable(res: dict, phrase: str) -> str:
    """The check of this class on a results dict (``CheckResult.to_json()`` or results.json): strict JSON, every
    prediction either finite inside its interval or all None with a reason, and the verdict "not applicable" with a
    reason containing ``phrase``. Returns the reason."""
    json.dumps(res, allow_nan=False)  # ValueError on any NaN/Inf anywhere
    p = res["prediction"]
    for key in ("unaligned", "weight_matched", "activation_matched", "twin"):
        if key in p:
            q = p[key]
            if q["barrier_mean"] is None:
                assert q["low"] is None and q["high"] is None and q["not_applicable"], q
            else:
                assert all(math.isfinite(q[k]) for k in ("barrier_mean", "low", "high")), q
                assert q["low"] <= q["barrier_mean"] <= q["high"], f"the interval does not hold the prediction: {q}"
    assert p["go"] is None, f"a verdict ({'GO' if p['go'] else 'NO-GO'}) from undefined numbers: {p}"
    assert p["not_applicable"] and phrase in p["not_applicable"], p["not_applicable"]
    assert res["recommendation"]["method"] == "not applicable", res["recommendation"]
    if res["pair"]:
        assert res["pair"]["relationship"]["name"] == "undetermined", res["pair"]["relationship"]
    return p["not_applicable"]


# ----------------------------------------------------------------------------------------------------- API
@pytest.mark.parametrize("case", list(PAIRS))
def test_undefined_features_give_no_verdict(digits, case):
    make, phrase = PAIRS[case]
    res = check(*make(), data=digits, **KW).to_json()
    not_applicable(res, phrase)
    undefined = res["pair"]["features"]["undefined"]
    assert undefined and all(res["pair"]["features"][k] is None for k in undefined)


@pytest.mark.parametrize("case", list(ALONE))
def test_undefined_twin_feature_gives_no_verdict(digits, case):
    make, phrase = ALONE[case]
    not_applicable(check(make(), data=digits, **KW).to_json(), phrase)


def test_a_healthy_pair_still_gets_a_verdict_inside_its_interval(digits):
    res = check(_mlp(0), _mlp(1), data=digits, **KW).to_json()
    json.dumps(res, allow_nan=False)
    p = res["prediction"]
    assert p["go"] in (True, False) and p["not_applicable"] is None and not res["pair"]["features"]["undefined"]
    for key in ("unaligned", "weight_matched", "activation_matched", "twin"):
        assert p[key]["low"] <= p[key]["barrier_mean"] <= p[key]["high"]
    assert res["recommendation"]["method"] != "not applicable"


def test_the_predictor_refuses_an_undefined_diagnostic():
    line = LogLinear("x", 0.0, 1.0, -1.0, 1.0, 3)
    for x in (float("nan"), float("inf"), None):
        with pytest.raises(ConfigError, match="finite"):
            line.predict(x)


# ----------------------------------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("case", list(PAIRS))
def test_cli_check_says_not_applicable_and_writes_no_nan(tmp_path, case):
    make, phrase = PAIRS[case]
    paths = [save_checkpoint(tmp_path / n, m, config={"dataset": "digits"}) for n, m in zip("ab", make(), strict=True)]
    out = tmp_path / "out"
    res = run_cli("check", *paths, "--max-batches", 1, "--eval-limit", 200, "--out", out)
    assert "NOT APPLICABLE" in res.output and phrase in res.output, res.output
    results = json.loads((out / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    not_applicable(results, phrase)
    report = (out / "report.md").read_text()
    for text in (res.output, report):
        assert not re.search(r"\b(nan|inf)\b", text, re.IGNORECASE), text
        assert "NO-GO" not in text and "GO:" not in text
    assert "not applicable" in report
