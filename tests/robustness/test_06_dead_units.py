"""Class 6 — a dead unit (zero variance) makes the correlation matrix NaN, which the LAP rejects.

Dead ReLUs (and constant units) are common in trained nets. Pearson correlation with a zero-variance unit is 0/0;
a naive implementation hands NaN to scipy's LAP, which fails with an unhelpful message (or, worse, returns
garbage). modeconn gives dead units correlation 0 with everything (computed in float64), so activation matching
runs, matches every live unit correctly, and the LAP guard still names the space if NaN ever reaches it.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from archs import make
from rb_helpers import batches
from scipy.optimize import linear_sum_assignment

import modeconn as mc
from modeconn.errors import NonFiniteError
from modeconn.match import solve_lap
from modeconn.match.activation import CorrelationStats

ZERO_DEAD = [0, 3, 7]  # ReLU(0·x − 1) = 0
CONST_DEAD = [5]  # ReLU(0·x + 2) = 2: zero variance, non-zero mean


def _model_with_dead_units():
    model, x = make("mlp")
    with torch.no_grad():
        w, b = model.blocks[0].linear.weight, model.blocks[0].linear.bias
        w[ZERO_DEAD + CONST_DEAD] = 0.0
        b[ZERO_DEAD] = -1.0
        b[CONST_DEAD] = 2.0
        model.blocks[2].linear.weight.zero_()  # a whole layer dead: every unit of its space outputs 0
        model.blocks[2].linear.bias.fill_(-1.0)
    return model, x


def _live(spec):
    n = {s: sp.size for s, sp in spec.spaces.items()}
    dead = {"P_blocks.0.linear": set(ZERO_DEAD + CONST_DEAD), "P_blocks.2.linear": set(range(n["P_blocks.2.linear"]))}
    return {s: [i for i in range(n[s]) if i not in dead.get(s, set())] for s in spec.spaces}


def check_dead_units_handled(model, x) -> None:
    """The check of this class: activation matching runs on a model with dead units, every statistic is finite
    and every live unit of a planted permutation is recovered."""
    spec = mc.symmetry_spec(model, x)
    g = spec.random_element(seed=0)
    model_b = copy.deepcopy(model)
    model_b.load_state_dict(spec.apply(model.state_dict(), g))
    loader = batches(x.shape[1:], n=2, bs=64)
    res = mc.activation_matching(spec, model, model_b, loader)
    assert all(np.isfinite(v) for v in res.stats["mean_matched_correlation"].values())
    undo = spec.compose(res.element, g)
    for s, live in _live(spec).items():
        assert undo[s][live].tolist() == live, f"space {s}: live units not recovered"


def test_activation_matching_with_dead_units():
    check_dead_units_handled(*_model_with_dead_units())


def test_correlation_of_dead_and_constant_units_is_zero_and_finite():
    st = CorrelationStats(4, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    xa = torch.randn(200, 4, generator=g, dtype=torch.float64)
    xa[:, 1] = 0.0  # dead
    xa[:, 2] = 7.5  # constant
    xa[:, 3] = 1e3 + 1e-6 * torch.randn(200, generator=g, dtype=torch.float64)  # E[x²] − m² cancels
    xb = xa[:, [3, 0, 2, 1]]
    st.update(xa, xb)
    c = st.correlation()
    assert torch.isfinite(c).all() and c.abs().max() <= 1
    assert (c[1] == 0).all() and (c[2] == 0).all() and (c[:, 2] == 0).all() and (c[:, 3] == 0).all()
    assert float(c[0, 1]) == pytest.approx(1.0)
    assert solve_lap(c, "P")[0] == 1


def test_weight_matching_with_dead_units_recovers_exactly():
    model, x = _model_with_dead_units()
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    sd_b = spec.apply(sd, spec.random_element(seed=1))
    res = mc.weight_matching(spec, sd, sd_b)
    aligned = res.apply(sd_b)
    assert all(torch.equal(aligned[k], sd[k]) for k in sd)


def _naive_correlation(self):  # broken variant: Pearson without the dead-unit guard
    c = max(self.count, 1)
    ma, mb = self.sa / c, self.sb / c
    cov = self.sab / c - torch.outer(ma, mb)
    sa = (self.saa / c - ma * ma).clamp_min(0).sqrt()
    sb = (self.sbb / c - mb * mb).clamp_min(0).sqrt()
    return cov / torch.outer(sa, sb)


def test_negative_control_naive_correlation_is_caught_and_named(monkeypatch):
    monkeypatch.setattr(CorrelationStats, "correlation", _naive_correlation)
    model, x = _model_with_dead_units()
    with pytest.raises(NonFiniteError, match=r"space 'P_blocks\.0\.linear'.*NaN/Inf"):
        check_dead_units_handled(model, x)


def test_lap_guard_names_the_space_where_scipy_would_not():
    bad = np.array([[np.nan, 1.0], [0.0, 1.0]])
    with pytest.raises(ValueError) as raw:
        linear_sum_assignment(bad, maximize=True)
    assert "P_x" not in str(raw.value)
    with pytest.raises(NonFiniteError, match=r"space 'P_x' \(2×2\) has 1 NaN/Inf"):
        solve_lap(torch.from_numpy(bad), "P_x")
