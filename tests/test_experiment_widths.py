"""`modeconn experiment widths --quick` (CI size): an MNIST MLP pair and a Fashion-MNIST ResNet20 pair of different
widths fused into the narrow width. The claim is asserted on the MLPs; ResNet20s trained for one epoch on 300 images
are at chance, so their case is only checked to run (the full size measures it, docs/results/widths/)."""

from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

pytestmark = [pytest.mark.experiment, pytest.mark.usefixtures("one_thread", "shared_data")]


def test_quick_width_fusion_beats_the_truncation_average(tmp_path):
    out = tmp_path / "w"
    run_cli("experiment", "widths", "--quick", "--out", out)
    r = json.loads((out / "results.json").read_text())
    assert set(r["cases"]) == {"mlp", "resnet20"}
    acc = r["cases"]["mlp"]["test_acc"]
    assert acc["fused"] > acc["truncation average"] + 0.05  # the claim: matching the units makes averaging work
    assert all(0 <= x <= 1 for c in r["cases"].values() for x in c["test_acc"].values())
    assert "truncation avg" in (out / "report.md").read_text()
