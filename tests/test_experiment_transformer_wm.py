"""`modeconn experiment transformer-wm --quick` (CI size): a GPT-NeoX pair trained on the Austen text — naive vs
weight matching (permutations) vs weight matching (full group after absorption) — and the planted MiniLM
recovery, with the qualitative claims asserted."""

from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

pytestmark = [pytest.mark.experiment, pytest.mark.usefixtures("one_thread", "shared_data")]


def test_quick_transformer_wm_lowers_the_barrier_and_recovers_planted_minilm(tmp_path):
    out = tmp_path / "tw"
    run_cli("experiment", "transformer-wm", "--quick", "--out", out)
    assert {"results.json", "report.md", "lm_barrier.png", "minilm_recovery.png"} <= {p.name for p in out.iterdir()}
    r = json.loads((out / "results.json").read_text())
    b = {k: v["barrier_mean"] for k, v in r["lm_barriers"].items()}
    assert b["WM (permutations)"] < b["naive"] and b["WM (full group, absorbed)"] < b["naive"]
    for v in r["lm_barriers"].values():  # all three paths share the endpoints (absorption keeps the function)
        assert v["endpoint_loss"] == pytest.approx(r["lm_barriers"]["naive"]["endpoint_loss"], abs=1e-4)
    m = r["minilm"]
    assert m["max_recovered_rel_error"] < 1e-5 < 0.1 < m["min_planted_rel_error"]
    assert m["max_output_diff_recovered"] < 1e-4 * (1 + m["output_scale"])
    with pytest.raises(AssertionError):
        run_cli("experiment", "transformer-wm", "--quick", "--pairs", "2", "--out", tmp_path / "x")
