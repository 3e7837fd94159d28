"""`modeconn experiment llpf-budget`: LLPF, Bezier and AutoNEB swept over gradient-evaluation budgets (quick size
through the CLI on real Fashion-MNIST models), the sweep's order and time limit, and its summary arithmetic."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
from cli_runner import run_cli

from modeconn.experiments import EXPERIMENTS
from modeconn.experiments.llpf_budget import SIZES, cells, first_low, llpf_options, run_llpf_budget, summarize

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.experiment
def test_quick_sweep_runs_every_method_at_every_budget_within_it(tmp_path):
    run_cli("experiment", "llpf-budget", "--quick", "--out", tmp_path / "out")
    r = json.loads((tmp_path / "out" / "results.json").read_text())
    size = SIZES["quick"]
    assert {"report.md", "results.json", "peaks.png"} <= {p.name for p in (tmp_path / "out").iterdir()}
    assert r["not_run"] == [] and len(r["rows"]) == len(list(cells(size)))
    for row in r["rows"]:
        assert 0 < row["grad_evals"] <= row["budget"], row  # every method within its budget
        assert row["dense_peak_train_loss"] >= row["peak_train_loss"]
        assert row["low_loss"] == (row["complete"] and row["dense_peak_train_loss"]
                                   <= max(row["endpoint_train_loss"]) + 0.1)
    llpf = {(row["pair"], row["budget"]): row["ticks"] for row in r["rows"] if row["method"] == "llpf"}
    assert llpf[("shufflenetv2/wd", 30)] > llpf[("shufflenetv2/wd", 12)]  # the schedule grows with the budget
    assert {row["pair"] for row in r["rows"]} == {"shufflenetv2/wd", "shufflenetv2/cross"}
    assert "llpf all-at-once" in {row["method"] for row in r["rows"]}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "first complete and low-loss" in report and "shufflenetv2/cross" in report


def test_a_time_limit_lists_the_paths_it_did_not_run(tmp_path):
    size = replace(SIZES["quick"], time_limit_s=0.0)
    r = run_llpf_budget(tmp_path / "out", size=size, log=lambda s: None)
    assert r["rows"] == [] and len(r["not_run"]) == len(list(cells(size)))
    assert "Not run" in (tmp_path / "out" / "report.md").read_text()


def test_the_first_repeat_sweeps_every_budget_before_the_next_repeat_starts():
    order = list(cells(SIZES["full"]))
    first_other_seed = next(i for i, c in enumerate(order) if c.seed != 0)
    assert {c.budget for c in order[:first_other_seed]} == set(SIZES["full"].budgets)
    assert all(c.seed == 0 for c in order if c.label.startswith("llpf "))  # the ablations: first repeat only
    assert max(SIZES["full"].budgets) >= 30 * min(SIZES["full"].budgets) and max(SIZES["full"].budgets) >= 5000
    assert len(SIZES["full"].archs) >= 3 and len(SIZES["full"].seeds) == 3 and SIZES["full"].cross_arch


def _row(budget, seed, low, peak=0.5):
    return {"pair": "p/wd", "method": "llpf", "budget": budget, "seed": seed, "dense_peak_train_loss": peak,
            "endpoint_train_loss": [0.4, 0.45], "complete": True, "low_loss": low, "grad_evals": budget}


def test_the_first_low_loss_budget_needs_a_majority_of_repeats():
    rows = [_row(100, 0, True), _row(100, 1, False), _row(100, 2, False),
            _row(1000, 0, True), _row(1000, 1, True), _row(1000, 2, False)]
    s = summarize(rows)
    assert first_low(s) == {"p/wd": {"llpf": 1000}}
    assert [x["low_loss"] for x in sorted(s, key=lambda x: x["budget"])] == [1, 2]
    assert first_low(summarize(rows[:3])) == {"p/wd": {"llpf": None}}  # negative control: 1 of 3 is not enough


def test_llpf_budget_is_registered():
    assert "llpf-budget" in EXPERIMENTS and "two-cores" in EXPERIMENTS.get("llpf-budget").sizes


def test_the_acceptance_size_runs_llpf_in_every_repeat_and_the_baselines_in_the_first():
    size = SIZES["acceptance"]
    order = list(cells(size))
    assert {c.budget for c in order} == {5000} and len(size.archs) >= 3
    assert {c.seed for c in order if c.label == "llpf"} == {0, 1, 2}
    assert {c.seed for c in order if c.label in ("bezier", "autoneb")} == {0}
    pairs = len(size.archs) + (size.cross_arch is not None)
    assert len(order) == pairs * (3 + 2)
    assert len(list(cells(replace(size, baseline_repeats=None)))) == pairs * 9  # control: every repeat


@pytest.mark.parametrize("cross", [False, True])
def test_the_acceptance_size_stores_every_tick_with_the_target_at_the_endpoints(cross):
    """At 5,000 evaluations every tick is a stored point (M2O ticks too), so the continuity check sees each tick's
    segment, and the target is the endpoints' own train-mode loss (margin 0)."""
    size = SIZES["acceptance"]
    opts = llpf_options(size, SimpleNamespace(cross=cross, groups=[["a"]]), 0, 5000)
    assert opts["record_every"] == 1 and opts["threshold_margin"] == 0.0
    assert opts["verify_batches"] > 0 and opts["closing_ticks"] > 0  # each point checked in the evaluation's terms
    assert size.eval_limit >= size.limit_train  # the train loss along the path on the whole training set
    assert llpf_options(SIZES["quick"], SimpleNamespace(cross=cross, groups=[["a"]]), 0, 30)["verify_batches"] == 0
    assert llpf_options(replace(size, max_points=24), SimpleNamespace(cross=cross, groups=[["a"]]), 0,
                        5000)["record_every"] > 1  # control: a bounded number of points skips ticks
