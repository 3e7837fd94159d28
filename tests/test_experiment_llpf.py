"""`modeconn experiment llpf --quick` (the CI size) end to end on Fashion-MNIST: BN ResNet20 endpoints, LLPF
(three seeds), the all-at-once ablation, Bezier and AutoNEB at LLPF's budget, cross-sphere — and the acceptance
checks of issue #5 at this size."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from modeconn.cli import app
from modeconn.path import Path

pytestmark = [pytest.mark.experiment, pytest.mark.usefixtures("one_thread", "shared_data")]


def test_quick_llpf_experiment_meets_the_acceptance_checks(tmp_path):
    out = tmp_path / "llpf"
    res = CliRunner().invoke(app, ["experiment", "llpf", "--quick", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert {"results.json", "report.md", "paths_loss.png", "paths_pca.png", "paths"} <= {p.name for p in out.iterdir()}
    r = json.loads((out / "results.json").read_text())
    rows = {row["method"]: row for row in r["rows"]}
    assert set(rows) == {"linear", "llpf (seed 0)", "llpf (seed 1)", "llpf (seed 2)", "llpf all-at-once", "bezier",
                         "autoneb", "cross-sphere A→C"}
    acc = r["acceptance"]
    assert acc["llpf_peak_within_0.05"] and acc["llpf_seed_spread_within_25pct"]
    assert acc["linear_peak_over_endpoints"] > 0.3  # the barrier LLPF removes
    budget = r["matched_budget_grad_evals"]
    assert rows["llpf (seed 0)"]["grad_evals"] == budget
    assert 0 < rows["bezier"]["grad_evals"] == budget and 0 < rows["autoneb"]["grad_evals"] <= budget
    assert acc["cross_sphere_reached"] is not None
    for label in ("llpf (seed 0)", "bezier", "autoneb", "cross-sphere A→C"):
        path = Path.load(out / "paths" / label)
        assert len(path) == rows[label]["points"]
    assert "| llpf (seed 0) |" in (out / "report.md").read_text()
