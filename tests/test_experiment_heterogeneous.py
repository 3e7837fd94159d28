"""`modeconn experiment heterogeneous --quick` (CI size): an MoE pair averaged plainly and after alignment, dense →
MoE in the branched and independent settings, width fusion. The quick models are barely trained, so the tests check
that every row is there and the claims that hold at any size: alignment lowers the MoE pair's merged loss, and for
independently initialised dense models the aligned MoEs (permutations, full group) beat the unaligned one (the
shared parts only average well after alignment). The full size's numbers are in docs/results/heterogeneous/."""

from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

pytestmark = [pytest.mark.experiment, pytest.mark.usefixtures("one_thread", "shared_data")]


def test_quick_heterogeneous_has_every_row_and_alignment_helps_where_it_must(tmp_path):
    out = tmp_path / "h"
    run_cli("experiment", "heterogeneous", "--quick", "--out", out)
    r = json.loads((out / "results.json").read_text())
    pair = r["moe_pair"]["heldout_loss"]
    assert pair["aligned average"] < pair["plain average"]
    rows = r["dense_to_moe"]["independent"]["heldout_loss"]
    assert set(r["dense_to_moe"]) == {"branched", "independent"} and len(rows) == 15
    unaligned = rows["MoE, unaligned, router from data"]
    for aligned in (rows["MoE, permutations, router from data"], rows["MoE, full group, router from data"]):
        assert all(a < u for a, u in zip(aligned, unaligned, strict=True))
    assert set(r["widths"]["test_acc"]) >= {"fused", "truncation average"}
    report = (out / "report.md").read_text()
    assert "## Where alignment helps" in report and "(b) independent" in report
