"""Trust class 7 (issue #14) — a broken path reported as low-loss.

An LLPF schedule too short for its step ends far from B, and its last segment jumps the rest of the way; the
losses at the points then say nothing about the loss along that jump. A path is *complete* only if it reaches
B and every segment passes the continuity check (its sub-points rise at most ``continuity_tol`` above its
ends) — one definition (:meth:`PathCurve.completeness`) for every method. An incomplete path is said so in
results.json (``complete: false`` with the reasons and the failing segments), in report.md, in the headline
(with the dense peak of the failing segment) and in the CLI's exit status (3, after all outputs are written).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cli_runner import run_cli
from torch.utils.data import DataLoader, TensorDataset
from trust_helpers import TRUNCATED_LLPF, digits, quick_run, results, save_pair, trained_pair

from modeconn.errors import ConfigError
from modeconn.recipes.path import INCOMPLETE_EXIT_CODE
from modeconn.path.autoneb import autoneb
from modeconn.path.pathobj import PathCurve


def assert_trustworthy(res: dict) -> None:
    """The check of this class: a path reported complete reaches B and its peak at the points is its peak (to
    the tolerance); an incomplete one is said to be so in the headline, naming the dense peak it hides."""
    c, s = res["completeness"], res["summary"]
    if res["complete"]:
        assert c["reached_b"], "reported complete, but it does not reach B"
        assert s["dense_peak_train_loss"] <= s["peak_train_loss"] + c["continuity_tol"] + 1e-9, (
            f"reported complete with peak {s['peak_train_loss']:.4f}, but the path rises to "
            f"{s['dense_peak_train_loss']:.4f} between its points")
    else:
        assert "INCOMPLETE" in res["headline"] and c["reasons"]
        if c["worst_segment"] is not None:
            assert f"{c['worst_segment']['dense_peak']:.4f}" in res["headline"]


def test_a_truncated_llpf_schedule_is_incomplete_in_results_report_and_headline(tmp_path):
    res = quick_run(tmp_path / "out", "llpf", TRUNCATED_LLPF)
    assert_trustworthy(res)
    c = res["completeness"]
    n = res["summary"]["points"]
    assert res["complete"] is False and res["summary"]["complete"] is False and c["reached_b"]
    assert c["worst_segment"]["points"] == [n - 2, n - 1]  # the final jump to B
    assert c["worst_segment"]["dense_peak"] > res["summary"]["peak_train_loss"] + 0.05
    assert res["path_info"]["final_gap"] > 0.5
    on_disk = results(tmp_path / "out")
    assert on_disk["complete"] is False and on_disk["completeness"]["failing_segments"]
    assert "INCOMPLETE PATH" in (tmp_path / "out" / "report.md").read_text()


def test_the_cli_exits_3_after_writing_everything_and_0_for_a_complete_path(tmp_path):
    a, b = save_pair(tmp_path)
    common = ["--dataset", "digits", "--eval-limit", "200", "--sub-points", "1"]
    opts = [x for k, v in TRUNCATED_LLPF.items() for x in ("-o", f"{k}={v}")]
    res = run_cli("path", a, b, "--method", "llpf", *opts, *common, "--out", tmp_path / "broken", ok=False)
    assert res.exit_code == INCOMPLETE_EXIT_CODE == 3, res.output
    assert "INCOMPLETE PATH" in res.output and "outputs written to" in res.output
    assert {"results.json", "report.md", "path_loss.png", "path"} <= {p.name for p in (tmp_path / "broken").iterdir()}
    assert results(tmp_path / "broken")["complete"] is False
    ok = run_cli("path", a, b, "--method", "linear", "-o", "n=11", *common, "--out", tmp_path / "line")
    assert "continuous (reaches B" in ok.output and results(tmp_path / "line")["complete"] is True


def test_complete_is_not_low_loss_a_linear_path_over_a_barrier_is_complete(tmp_path):
    res = quick_run(tmp_path / "out", "linear", {"n": 11})
    assert_trustworthy(res)
    assert res["complete"] is True and res["summary"]["peak_over_endpoints"] > 0.1  # a real barrier, honestly shown
    assert res["low_loss"]["low_loss"] is False and "NOT low-loss" in res["headline"]


@pytest.mark.parametrize("case", ["cross-sphere truncated", "llpf stopped early", "no continuity check"])
def test_every_way_a_search_path_can_be_incomplete_is_reported_the_same_way(tmp_path, case):
    method, options, extra, reason = {
        "cross-sphere truncated": ("cross-sphere", {**TRUNCATED_LLPF, "m2o_max_ticks": 2}, {},
                                   "fail the continuity check"),
        "llpf stopped early": ("llpf", {**TRUNCATED_LLPF, "threshold": -1.0, "stop_on_unreached": True}, {},
                               "stopped before reaching B"),
        "no continuity check": ("linear", {"n": 5}, {"sub_points": 0}, "not checked"),
    }[case]
    res = quick_run(tmp_path / "out", method, options, **extra)
    assert_trustworthy(res)
    assert res["complete"] is False and any(reason in r for r in res["completeness"]["reasons"]), res["completeness"]


def _bump_landscape(centre: float = 0.125, height: float = 1.0, width: float = 0.04):
    """A 2-d toy: the model's output is its weight w; the loss is 0.5·w_x plus a narrow bump at (centre, 0)."""

    class Point(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2))

        def forward(self, x):
            return self.w.expand(x.shape[0], 2)

    def mean_loss(out, y):
        w = out.mean(0)
        return 0.5 * w[0] + height * torch.exp(-((w - torch.tensor([centre, 0.0])) ** 2).sum() / (2 * width ** 2))

    return Point, mean_loss


def test_an_autoneb_chain_with_a_bump_between_its_pivots_is_incomplete():
    Point, mean_loss = _bump_landscape()
    data = TensorDataset(torch.zeros(16, 1), torch.zeros(16, dtype=torch.long))
    a, b = {"w": torch.tensor([0.0, 0.0])}, {"w": torch.tensor([1.0, 0.0])}
    path = autoneb(Point(), a, b, data, loss_fn=mean_loss, initial_pivots=3, max_pivots=3, cycles=1,
                   steps_per_cycle=2, lr=1e-4, batch_size=8, eval_batches=1)  # no insertion: the bump stays inside
    curve = path.evaluate(Point(), DataLoader(data, batch_size=16), sub_points=7,
                          loss_fn=lambda out, y: mean_loss(out, y) * len(y))
    c = curve.completeness()
    assert path.info["reached_b"] and c["reached_b"] and not c["complete"]
    assert c["worst_segment"]["segment"] == 0 and c["worst_segment"]["dense_peak"] > 0.5  # the bump, at t ≈ 0.125
    assert curve.peak() < c["worst_segment"]["dense_peak"] - 0.5  # the pivots alone never see it


def test_completeness_rejects_a_bad_tolerance_and_a_nan_segment_fails():
    curve = PathCurve(lambdas=np.array([0.0, 0.5, 1.0]), metrics={"train": {"loss": np.array([0.1, 0.1, 0.1]),
                                                                            "acc": np.ones(3)}},
                      bn="keep", sub_points=1, segment_peaks=np.array([0.12, np.nan]), continuity_split="train")
    c = curve.completeness(0.05)
    assert not c["complete"] and [f["segment"] for f in c["failing_segments"]] == [1]
    assert not curve.completeness(0.05, reached_b=True)["complete"]
    assert curve.completeness(0.05, reached_b=False)["reasons"][0] == "the search stopped before reaching B"
    with pytest.raises(ConfigError, match="continuity tolerance"):
        curve.completeness(-1.0)


def test_negative_control_without_the_continuity_check_the_broken_path_is_reported_complete(tmp_path, monkeypatch):
    monkeypatch.setattr(PathCurve, "segment_excess", lambda self: np.zeros(len(self.segment_peaks)))
    res = quick_run(tmp_path / "out", "llpf", TRUNCATED_LLPF)
    assert res["complete"] is True  # the old answer: "complete", with a peak far below the path's real peak
    with pytest.raises(AssertionError, match="rises to"):
        assert_trustworthy(res)


def test_the_trained_pair_has_a_barrier_so_the_broken_jump_is_visible():
    a, b = trained_pair()  # guards the fixture itself: without a barrier the tests above would prove nothing
    from modeconn.path import linear_path

    curve = linear_path(a.state_dict(), b.state_dict(), 5).evaluate(a, DataLoader(digits().train, batch_size=512))
    assert curve.peak() - max(curve.values("eval")[[0, -1]]) > 0.3


def test_every_report_shows_the_linear_path_beside_the_path_and_says_whether_it_is_low_loss(tmp_path):
    """A searched path's results, report and headline carry the straight line A → B as the baseline (evaluated the
    same way), and the verdict separates continuous from low-loss."""
    res = quick_run(tmp_path / "out", "bezier", {"steps": 20, "control_points": 1})
    assert set(res["linear"]) >= {"peak_train_loss", "dense_peak_train_loss"}
    low = res["low_loss"]
    assert low["low_loss"] == (low["dense_peak"] <= low["endpoint_max"] + low["margin"])
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| linear" in report and "straight line A → B" in report
    if res["complete"]:
        assert "the linear path's peak train loss" in res["headline"]
        assert ("**Low-loss**" if low["low_loss"] else "**Not low-loss**") in report
    # the linear path over the digits pair's barrier is higher than the searched path's points would suggest
    assert res["linear"]["peak_train_loss"] > max(res["endpoint_train_loss"]) + 0.1


def test_ctrl_c_says_how_to_resume_a_checkpointing_search(tmp_path, monkeypatch):
    import modeconn.recipes.path as recipe

    a, b = save_pair(tmp_path)

    def interrupted(*args, **kwargs):
        recipe.work_dir_for(tmp_path / "p").mkdir()  # the search had checkpointed
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe, "path", interrupted)
    res = run_cli("path", a, b, "--dataset", "digits", "--out", tmp_path / "p", ok=False)
    assert res.exit_code == 130 and "--resume" in res.output and "--overwrite" in res.output, res.output
    monkeypatch.setattr(recipe, "path", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    res = run_cli("path", a, b, "--dataset", "digits", "--out", tmp_path / "q", ok=False)
    assert res.exit_code == 130 and "nothing was written" in res.output, res.output


def test_a_budget_too_small_for_the_schedule_names_one_that_fits(tmp_path):
    with pytest.raises(ConfigError, match=r"--budget 6 or more, or -o ticks=4"):
        quick_run(tmp_path / "out", "llpf", budget=4)
