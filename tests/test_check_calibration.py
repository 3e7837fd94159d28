"""``modeconn experiment check-calibration --quick`` through the CLI (issue #19): the population is measured, the
predictor is scored on families it was not fitted on, and the qualitative claim holds — pairs that need no alignment
(fine-tunes, W-asymmetric σ_F = 1) are predicted below independent standard MLPs, and ``check`` costs less than the
barrier it predicts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_runner import run_cli
from modeconn.experiments.check_calibration import FORMS

pytestmark = pytest.mark.experiment


def test_check_calibration_quick_ranks_held_out_families(tmp_path, one_thread):
    out = tmp_path / "cal"
    run_cli("experiment", "check-calibration", "--quick", "--out", out)
    for f in ("results.json", "report.md", "calibration.png"):
        assert (out / f).stat().st_size > 0
    r = json.loads((out / "results.json").read_text())
    rows = {(x["family"], x["setting"]): x for x in r["rows"]}
    std, asym, ft = rows[("mlp-mnist", "standard")], rows[("mlp-mnist", "σ_F=1.0")], rows[("finetune-mnist", "fine-tunes")]
    assert std["unaligned_barrier_mean"] > 0.1 > max(asym["unaligned_barrier_mean"], ft["unaligned_barrier_mean"])
    assert std["heldout_pair"] > max(asym["heldout_pair"], ft["heldout_pair"])      # predicted without their family
    assert r["heldout_pair"]["pooled"]["spearman"] > 0.5
    assert r["heldout_pair"]["pooled"]["n"] == len(r["rows"]) and set(r["heldout_pair"]["families"]) == {x[0] for x in rows}
    assert 0 < r["cost"]["ratio"] < 1 and np.isfinite(r["calibration_pair"]["slope"])
    assert "Held-out scores" in (out / "report.md").read_text()
    lm = [x for x in r["rows"] if x["family"] == "lm-neox-austen"]      # a transformer family in the population
    assert {x["setting"] for x in lm} == {"independent", "fine-tunes"} and all(np.isfinite(x["headroom"]) for x in lm)
    standard = {x["family"] for x in r["rows"] if not x["fixed_structure"]}   # aligned lines: no W-asymmetric pair
    assert set(r["heldout_weight_matched"]["families"]) == standard != {x["family"] for x in r["rows"]}
    assert set(r["forms"]["pair"]) == set(FORMS) and "coverage" in r["heldout_pair"]["pooled"]
