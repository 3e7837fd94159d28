"""`modeconn experiment widths --quick` (CI size): an MNIST MLP pair and a Fashion-MNIST ResNet20 pair of different
widths fused into the narrow width, with the qualitative claim asserted."""

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
    for case in r["cases"].values():
        acc = case["test_acc"]
        assert acc["fused"] > acc["truncation average"]  # the claim: matching the units is what makes averaging work
        assert 0 <= acc["fused + 1 epoch"] <= 1
    assert "truncation avg" in (out / "report.md").read_text()
