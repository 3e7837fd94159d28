"""`modeconn experiment merge-rules --quick` (CI size): a GPT-NeoX pair trained on the Austen text merged by each
rule after no alignment, weight matching (permutations) and the full group, with the qualitative claim asserted."""

from __future__ import annotations

import json
import math

import pytest
from cli_runner import run_cli

pytestmark = [pytest.mark.experiment, pytest.mark.usefixtures("one_thread", "shared_data")]


def test_quick_merge_rules_alignment_lowers_the_merged_loss(tmp_path):
    out = tmp_path / "mr"
    run_cli("experiment", "merge-rules", "--quick", "--out", out)
    assert {"results.json", "report.md"} <= {p.name for p in out.iterdir()}
    r = json.loads((out / "results.json").read_text())
    losses = r["losses"]
    assert len(losses) == 7 and all(math.isfinite(x) for row in losses.values() for x in row.values())
    linear = losses["linear (0.5 / 0.5)"]
    # the claim: alignment is what makes averaging independent models work
    assert linear["weight (permutations)"] < linear["none"] and linear["weight (full group, absorbed)"] < linear["none"]
    # task arithmetic with base A and weight 0.5 is A + 0.5 (B − A): the linear midpoint, in every alignment
    for align, x in losses["task_arithmetic (base A, w 0.5)"].items():
        assert x == pytest.approx(linear[align], abs=1e-4)
    assert "merge rule" in (out / "report.md").read_text()
