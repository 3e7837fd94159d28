"""Trust class 8 (issue #14) — ``--budget`` ignored.

Every path method honours a gradient-evaluation budget, and its schedule scales to it where the user left the
schedule open (LLPF ≈ 2·√budget ticks, AutoNEB's steps per cycle; ``modeconn path`` gives every searching method a
default budget): LLPF caps each tick's refinement at its fair share
``⌊(budget − spent)/ticks left⌋`` (so the whole schedule fits; a budget below one step per tick is refused before
any work), Bezier/polychain train exactly ``budget`` steps, AutoNEB stops before a step that would exceed it. The
spend is stated (results.json ``budget``, report.md, the headline), the evaluation is bounded (an LLPF search
stores at most ``max_points`` points; ``--eval-limit`` examples per split, default 2000) and stated, and long
searches show a progress bar with ETA — or, without a terminal, a log line every few seconds.
"""

from __future__ import annotations

import json

import pytest
from trust_helpers import digits, quick_run, trained_pair

from modeconn.cli import _app as cli_app
from modeconn.errors import ConfigError
from modeconn.path.methods import find_path
from modeconn.path import llpf as llpf_mod


def assert_within_budget(path, budget: int) -> None:
    """The check of this class: the search spent at most ``budget`` gradient evaluations."""
    spent = path.compute["grad_evals"]
    assert 0 < spent <= budget, f"{path.method}: {spent} gradient evaluations for a budget of {budget}"


def _find(method, options, budget, **kw):
    a, b = trained_pair()
    return find_path(method, a, a.state_dict(), b.state_dict(), digits().train, options, budget=budget, **kw)


def test_llpf_with_its_default_schedule_fits_the_budget_and_reaches_b():
    path = _find("llpf", {"batch_size": 64}, 500, max_points=16)  # no ticks given: 2·√500 ≈ 45 ticks
    assert_within_budget(path, 500)
    info = path.info
    assert info["ticks_done"] == 45 and info["reached_b"] and info["budget"] == 500
    assert info["settings"]["step"] == pytest.approx(6 / 45)
    assert all(r["steps"] >= 1 for r in info["records"])  # every tick refined at least once
    assert all(r["steps"] <= r.get("steps_cap", 2000) for r in info["records"])
    assert len(path) <= 16 + 2 and info["settings"]["record_every"] == 3  # bounded storage and evaluation


@pytest.mark.parametrize("method,options,budget", [
    ("cross-sphere", {"ticks": 20, "m2o_max_ticks": 5, "step": 0.2, "batch_size": 64, "lr": 0.05}, 60),
    ("bezier", {"lr": 0.05, "n_points": 5}, 40),
    ("polychain", {"lr": 0.05, "n_points": 5}, 40),
    ("autoneb", {"lr": 0.05, "steps_per_cycle": 5}, 40),
    ("llpf", {"ticks": 10, "step": 0.3, "lr": 0.05, "threshold": -1.0, "batch_size": 64}, 37),  # never reached
])
def test_every_method_honours_the_budget(method, options, budget):
    assert_within_budget(_find(method, options, budget), budget)


def test_unspent_llpf_steps_roll_over_and_the_last_tick_gets_them():
    path = _find("llpf", {"ticks": 10, "step": 0.3, "lr": 0.05, "threshold": -1.0, "batch_size": 64}, 37)
    steps = [r["steps"] for r in path.info["records"]]
    assert sum(steps) == 37 and steps[0] == 3 and steps[-1] == 4  # ⌊37/10⌋ first, the remainder rolls over


def test_a_budget_that_cannot_pay_one_step_per_tick_is_refused_before_any_work():
    with pytest.raises(ConfigError, match=r"budget of 100 .*ticks = 500"):
        _find("llpf", {"ticks": 500}, 100)
    with pytest.raises(ConfigError, match=r"m2o_max_ticks \+ ticks = 1500"):
        _find("cross-sphere", {"ticks": 500, "m2o_max_ticks": 1000}, 1000)
    with pytest.raises(ConfigError, match="given twice"):
        _find("llpf", {"budget": 300}, 500)


def test_results_report_and_headline_state_the_spend_and_the_evaluation_size(tmp_path):
    res = quick_run(tmp_path / "out", "llpf", {"ticks": 40, "step": 0.2, "lr": 0.05, "threshold": 0.3, "batch_size": 64},
                    budget=120, max_points=8)
    ev, n = res["evaluation"], res["summary"]["points"]
    assert res["budget"] == {"requested": 120, "used": res["summary"]["grad_evals"], "honoured": True}
    assert n <= 8 + 2 and ev["points"] == n and ev["models_evaluated"] == n + (n - 1) * 1
    assert ev["examples"] == {"train": 200, "test": 200}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "of a budget of 120" in report and f"{n} points" in report and "200 train and 200 test" in report
    assert f"{res['summary']['grad_evals']} gradient evaluations (budget 120)" in res["headline"]


def test_without_a_terminal_progress_is_logged_with_an_eta(capsys):
    assert not cli_app.console.is_terminal  # pytest captures the output: no terminal
    with cli_app.progress_bar(log_every_s=0.0) as progress:
        for i in range(1, 5):
            progress("search", i, 4)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "search:" in ln]
    assert len(lines) == 4 and "4/4 (100%)" in lines[-1] and all("ETA" in ln for ln in lines)


def test_without_a_terminal_many_short_stages_make_no_flood_of_lines(capsys):
    """A hundred weight-matching sweeps of a few milliseconds each: no line per sweep in a log file."""
    with cli_app.progress_bar(log_every_s=10.0) as progress:
        for sweep in range(1, 101):
            for j in range(4):
                progress(f"run 1/1 sweep {sweep}", j + 1, 4)
    assert len([ln for ln in capsys.readouterr().out.splitlines() if "sweep" in ln]) <= 1


def test_negative_control_an_llpf_that_ignores_the_budget_is_caught(monkeypatch):
    monkeypatch.setattr(llpf_mod._Run, "_step_limits", lambda self: (self.cfg["max_steps"], self.cfg["min_steps"]))
    path = _find("llpf", {"ticks": 10, "step": 0.3, "lr": 0.05, "threshold": -1.0, "max_steps": 20,
                          "batch_size": 64}, 37)
    with pytest.raises(AssertionError, match="200 gradient evaluations for a budget of 37"):
        assert_within_budget(path, 37)


def test_the_schedules_scale_with_the_budget_and_keep_what_the_user_set():
    from modeconn.path import LLPFConfig
    from modeconn.path.autoneb import AutoNEBConfig

    ticks = {g: LLPFConfig(budget=g).for_budget().ticks for g in (100, 1_000, 10_000, 100_000)}
    assert ticks == {100: 20, 1_000: 63, 10_000: 200, 100_000: 632}  # ticks and steps per tick both grow as √budget
    assert LLPFConfig(budget=10_000, ticks=50).for_budget().ticks == 50  # set explicitly: kept
    assert LLPFConfig(budget=10_000, ticks=50).for_budget().step == 0.01
    assert LLPFConfig().for_budget().ticks == 500  # no budget: the library's fixed defaults
    cross = LLPFConfig(budget=10_000).for_budget(cross=True)
    assert cross.ticks + cross.m2o_max_ticks <= 10_000 and cross.m2o_max_ticks == cross.ticks == 200
    neb = AutoNEBConfig(budget=5_000).for_budget()
    assert neb.steps_per_cycle == 5_000 // (3 + 4 + 5 + 6)
    assert AutoNEBConfig(budget=5_000, steps_per_cycle=7).for_budget().steps_per_cycle == 7


def test_autoneb_sized_to_its_budget_spends_most_of_it():
    path = _find("autoneb", {"lr": 0.05}, 90)
    assert_within_budget(path, 90)
    assert path.compute["grad_evals"] >= 45, path.compute  # not 4 × 100 steps cut off, nor a few steps


def test_negative_control_a_schedule_that_ignores_the_budget_is_caught(monkeypatch):
    monkeypatch.setattr(llpf_mod.LLPFConfig, "for_budget", lambda self, cross=False: self)
    with pytest.raises(ConfigError, match="ticks = 500"):  # 500 fixed ticks cannot be paid by 300
        _find("llpf", {"batch_size": 64}, 300)


def test_cli_path_gives_every_searching_method_a_stated_default_budget(tmp_path):
    from cli_runner import run_cli
    from trust_helpers import FAST_LLPF, save_pair

    from modeconn.path.methods import DEFAULT_BUDGET, PATH_METHODS

    assert DEFAULT_BUDGET == 5000 and all(PATH_METHODS.get(m).default_budget == DEFAULT_BUDGET
                                          for m in PATH_METHODS if m != "linear")
    help_text = " ".join(run_cli("path", "--help").output.split())
    assert f"default {DEFAULT_BUDGET}" in help_text and "20000+" in help_text
    a, b = save_pair(tmp_path)
    for method, opts, requested in (("llpf", FAST_LLPF, DEFAULT_BUDGET), ("linear", {}, None)):
        out = tmp_path / method
        options = [x for k, v in opts.items() for x in ("-o", f"{k}={v}")]
        res = run_cli("path", a, b, "--dataset", "digits", "--method", method, *options, "--eval-limit", "100",
                      "--sub-points", "0", "--out", out, ok=False)
        r = json.loads((out / "results.json").read_text())
        assert r["budget"]["requested"] == requested and r["budget"]["honoured"], res.output


def test_progress_names_its_unit_per_stage(tmp_path):
    stages, calls = [], []
    quick_run(tmp_path / "out", "llpf", progress=lambda d, t: calls.append((stages[-1], d, t)),
              on_stage=stages.append)
    assert stages == ["search (LLPF ticks)", "evaluating the path (models)", "evaluating the linear path (models)"]
    assert {c[0] for c in calls} == set(stages)
