"""Class 5 — an absolute convergence tolerance that stops at once (or never) depending on the model's scale.

The objective ``J = Σ⟨θ_A, g·θ_B⟩`` grows with the number and size of the weights, so an absolute tolerance on the
per-sweep gain means something different on every model: on a large model it never triggers, on a small-scale one
it stops after the first sweep. modeconn stops when a sweep gains less than ``rtol·|J|``, so coordinate descent is
invariant to rescaling the weights: the same sweeps, the same element, the objective scaled by s². Iterations,
the objective per sweep, the restart objectives and the Cauchy–Schwarz bound are reported.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from rb_helpers import res_mlp

import modeconn as mc
from modeconn.errors import ConfigError
from modeconn.match import weight as weight_mod

SCALES = (2.0**-20, 1.0, 2.0**20)  # powers of two: every product and sum scales exactly, decisions are bitwise equal


def _pair():
    a, b = res_mlp(0, width=16, blocks=4), res_mlp(1, width=16, blocks=4)  # independent nets: several sweeps
    spec = mc.symmetry_spec(a, torch.randn(2, 10))
    return spec, a.state_dict(), b.state_dict()


def _scaled(sd, s):
    return {k: v * s for k, v in sd.items()}


def check_scale_invariant(spec, sd_a, sd_b, **kw) -> list:
    """The check of this class: identical sweeps and element at every scale; J scales by s²."""
    runs = [mc.weight_matching(spec, _scaled(sd_a, s), _scaled(sd_b, s), **kw) for s in SCALES]
    ref = runs[1]
    assert max(ref.stats["iterations"]) > 1, "test setup: coordinate descent should need several sweeps"
    for s, res in zip(SCALES, runs, strict=False):
        assert res.stats["iterations"] == ref.stats["iterations"], f"scale {s}: {res.stats['iterations']} vs {ref.stats['iterations']}"
        assert spec.equal(res.element, ref.element), f"scale {s}: a different element"
        for h, h_ref in zip(res.history, ref.history, strict=False):
            assert h == pytest.approx([v * s * s for v in h_ref], rel=1e-6)
    return runs


def test_convergence_is_scale_invariant():
    spec, sd_a, sd_b = _pair()
    check_scale_invariant(spec, sd_a, sd_b, restarts=2)


def test_negative_control_absolute_tolerance_is_caught(monkeypatch):
    def absolute(self, g, gen, max_iter, rtol):  # broken variant: stops when the gain is below 1e-3, absolutely
        spaces = list(self.spec.spaces)
        hist = [self.objective(g)]
        for _ in range(max_iter):
            for i in torch.randperm(len(spaces), generator=gen).tolist():
                s = spaces[i]
                score = self.score(s, g)
                new = weight_mod.solve_lap(score, s, self.timer)
                idx = torch.arange(len(new))
                if score[idx, new].sum() > score[idx, g[s]].sum():
                    g[s] = new
            hist.append(self.objective(g))
            if hist[-1] - hist[-2] <= 1e-3:
                break
        return g, hist

    monkeypatch.setattr(weight_mod._Problem, "coordinate_descent", absolute)
    spec, sd_a, sd_b = _pair()
    with pytest.raises(AssertionError, match="scale"):
        check_scale_invariant(spec, sd_a, sd_b, restarts=2)


def test_iterations_and_objective_are_reported_consistently():
    spec, sd_a, sd_b = _pair()
    res = mc.weight_matching(spec, sd_a, sd_b, restarts=3, seed=1)
    st = res.stats
    assert st["restarts_run"] == len(res.history) == len(st["iterations"]) == len(st["restart_objectives"])
    for hist, its, final in zip(res.history, st["iterations"], st["restart_objectives"], strict=False):
        assert its == len(hist) - 1 >= 1 and final == hist[-1]
        assert all(b >= a - 1e-6 * abs(a) for a, b in itertools.pairwise(hist)), "a sweep never lowers J"
    assert res.objective == max(st["restart_objectives"])
    aligned = res.apply(sd_b)
    recomputed = sum(float((sd_a[k].double() * aligned[k].double()).sum()) for k, b in spec.tensors.items() if b)
    assert res.objective == pytest.approx(recomputed, rel=1e-5)
    assert res.objective <= st["upper_bound"] * (1 + 1e-6)
    assert st["seconds"] >= st["lap_seconds"] >= 0 and st["lap_calls"] > 0


@pytest.mark.parametrize("rtol", [-1e-9, 1.0, float("nan"), "1e-9"])
def test_bad_tolerance_is_rejected_up_front(rtol):
    spec, sd_a, sd_b = _pair()
    with pytest.raises(ConfigError, match="rtol"):
        mc.weight_matching(spec, sd_a, sd_b, rtol=rtol)
