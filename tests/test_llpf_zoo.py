"""`modeconn experiment llpf-zoo`: the reference architectures (torchvision/timm at reduced width, modeconn's CCT)
on 1-channel 28×28 inputs, their Follow-Data-Flow unlock groups, the verdicts, the missing-package error, and
``--quick`` end to end through the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from modeconn.cli import app
from modeconn.errors import ConfigError
from modeconn.experiments import llpf_zoo
from modeconn.path.llpf import fdf_groups

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", llpf_zoo.PAPER_ORDER)
def test_each_architecture_reads_one_channel_28x28_and_is_grouped_in_data_flow_order(name):
    arch = llpf_zoo.ARCHS.get(name)
    net = llpf_zoo.seeded(arch, 0).eval()
    with torch.no_grad():
        assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    groups = llpf_zoo.unlock_groups(net, arch.fdf_level, 4)
    flat = [k for g in groups for k in g]
    assert 2 <= len(groups) <= 4
    assert sorted(flat) == sorted(n for n, _ in net.named_parameters())  # every parameter exactly once
    assert flat == [k for g in fdf_groups(net, arch.fdf_level) for k in g]  # data-flow order kept
    first_conv = next(m for m in net.modules() if isinstance(m, torch.nn.Conv2d))
    assert first_conv.in_channels == 1
    assert any(k.startswith(first_conv_name(net, first_conv)) for k in groups[0])  # the stem unlocks first


def first_conv_name(net: torch.nn.Module, conv: torch.nn.Module) -> str:
    return next(n for n, m in net.named_modules() if m is conv)


def test_seeded_builds_are_reproducible_and_leave_the_global_generator_alone():
    arch = llpf_zoo.ARCHS.get("shufflenetv2")
    state = torch.random.get_rng_state()
    a, b, c = (llpf_zoo.seeded(arch, s) for s in (0, 0, 1))
    assert torch.equal(torch.random.get_rng_state(), state)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_compare_says_lower_only_when_every_repeat_is_below():
    assert llpf_zoo.compare([0.1, 0.2], 0.3) == "lower"
    assert llpf_zoo.compare([0.3, 0.4], 0.3) == "higher"
    assert llpf_zoo.compare([0.1, 0.4, 0.5], 0.3) == "mixed (1 of 3 lower)"


def test_missing_packages_are_named_before_any_work(tmp_path, monkeypatch):
    # torchvision "installed", timm not (whatever this environment really has)
    monkeypatch.setattr(llpf_zoo.importlib.util, "find_spec", lambda name, *a: None if name == "timm" else object())
    out = tmp_path / "zoo"
    with pytest.raises(ConfigError, match=r"needs timm .*pip install timm"):
        llpf_zoo.run_llpf_zoo(out, quick=True)
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.experiment
@pytest.mark.usefixtures("shared_data")
def test_quick_llpf_zoo_runs_every_architecture_and_pair_at_a_matched_budget(tmp_path):
    out = tmp_path / "llpf-zoo"
    res = CliRunner().invoke(app, ["experiment", "llpf-zoo", "--quick", "--out", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads((out / "results.json").read_text())
    size = llpf_zoo.SIZES["quick"]
    assert list(r["archs"]) == list(llpf_zoo.PAPER_ORDER)
    expected = {"linear", "bezier", "autoneb"} | {f"llpf (seed {s})" for s in size.seeds}
    report = (out / "report.md").read_text()
    for name, entry in r["archs"].items():
        assert set(entry["pairs"]) == set(llpf_zoo.PAIRS)
        for pair, p in entry["pairs"].items():
            rows = {row["method"]: row for row in p["rows"]}
            assert set(rows) == expected
            llpf = [rows[f"llpf (seed {s})"] for s in size.seeds]
            budget = p["matched_budget_grad_evals"]
            assert budget == round(sum(x["grad_evals"] for x in llpf) / len(llpf)) > 0
            assert rows["bezier"]["grad_evals"] == budget and 0 < rows["autoneb"]["grad_evals"] <= budget
            assert p["llpf_reached_b"]
            assert p["llpf_dense_peaks"] == [x["dense_peak_train_loss"] for x in llpf]
            assert all(x["dense_peak_train_loss"] >= x["peak_train_loss"] for x in rows.values())
            assert p["vs"]["bezier"] == llpf_zoo.compare(p["llpf_dense_peaks"], rows["bezier"]["dense_peak_train_loss"])
            assert 2 <= p["fdf_groups"] <= size.max_groups
            assert (out / f"paths_{name}_{pair}.png").stat().st_size > 0
            assert f"### {name}, {pair}" in report
        assert f"**{name}**" in report
    assert (out / "peaks.png").stat().st_size > 0
