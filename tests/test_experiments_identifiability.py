"""The identifiability experiments at their --quick (CI) size, through the CLI, with the paper's
qualitative claims asserted (METHODS.md §1)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from modeconn.cli import app

pytestmark = pytest.mark.experiment

runner = CliRunner()


def _run(name, out):
    res = runner.invoke(app, ["experiment", name, "--quick", "--out", str(out)])
    assert res.exit_code == 0, res.output
    for f in ("results.json", "report.md", "summary.png"):
        assert (out / f).exists()
    return {s["label"]: s["summary"] for s in json.loads((out / "results.json").read_text())["settings"]}


def test_sigma_sweep_breaks_symmetry(tmp_path):
    s = _run("identifiability-sigma", tmp_path / "sigma")
    std, asym = s["standard"], s["σ_F=1.0"]
    assert asym["unaligned_barrier_mean"]["mean"] < 0.5 * std["unaligned_barrier_mean"]["mean"]
    assert asym["identity_ratio"]["mean"] > 0.9 > std["identity_ratio"]["mean"]


def test_k_sweep_swap_costs_grow_with_k(tmp_path):
    s = _run("identifiability-k", tmp_path / "k")
    assert s["k=16"]["swap_cost_median"]["mean"] > s["k=2"]["swap_cost_median"]["mean"]
    assert s["k=2"]["unaligned_acc_drop_pct"]["mean"] > s["k=16"]["unaligned_acc_drop_pct"]["mean"]


def test_coherence_sweep_lowers_the_unaligned_barrier(tmp_path):
    s = _run("identifiability-coherence", tmp_path / "coh")
    (lo, lo_s), (hi, hi_s) = sorted(s.items(), key=lambda kv: float(kv[0].split("=")[1]))
    assert hi_s["unaligned_barrier_mean"]["mean"] < lo_s["unaligned_barrier_mean"]["mean"]


def test_unknown_experiment_lists_valid_names(tmp_path):
    res = runner.invoke(app, ["experiment", "identifiability-sigam", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "identifiability-sigma" in res.output


@pytest.mark.parametrize("name", ["identifiability-resnet"])
def test_resnet_quick_runs(tmp_path, name):
    s = _run(name, tmp_path / "resnet")
    assert set(s) == {"standard", "σ_F=1.0"}
    assert all(v["unaligned_barrier_mean"]["mean"] is not None for v in s.values())
