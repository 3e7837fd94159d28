"""AutoNEB (Draxler et al. 2018): NEB force helpers, insertion at a planted bump, budget, determinism, exact
endpoints, bad inputs, and a functional check on digits (AutoNEB peak < linear peak)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from modeconn.data import load_dataset, make_loader
from modeconn.errors import ConfigError, NonFiniteError, StateDictMismatchError
from modeconn.models import build_model
from modeconn.path import AutoNEBConfig, Path, autoneb, linear_path
from modeconn.path.autoneb import neb_gradient, neb_tangents, perpendicular, spring_forces
from modeconn.path.interpolate import interpolate
from modeconn.path.pathobj import distance, param_names
from modeconn.train import TrainConfig, fit

pytestmark = pytest.mark.usefixtures("one_thread")


def _clone(sd):
    return {k: v.clone() for k, v in sd.items()}


def _same(a, b):
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def _mlp(seed, width=16, norm="none"):
    return build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=2, width=width, norm=norm, seed=seed)


# ------------------------------------------------------------------- a 2-d toy landscape with planted bumps


class Point(nn.Module):
    """The model *is* a point w ∈ R²: its output is w for every input (the loss function sees w)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.expand(x.shape[0], 2)


def _landscape(centre=None, height=1.0, width=0.05, ramp=0.5):
    """``L(w) = ramp·w_x + height·exp(−‖w − centre‖²/(2·width²))`` (no bump for centre=None)."""

    def loss_fn(out, y):
        w = out.mean(0)
        loss = ramp * w[0]
        if centre is not None:
            loss = loss + height * torch.exp(-((w - torch.tensor(centre)) ** 2).sum() / (2 * width ** 2))
        return loss

    return loss_fn


TOY_DATA = TensorDataset(torch.zeros(32, 1), torch.zeros(32, dtype=torch.long))
A, B = {"w": torch.tensor([0.0, 0.0])}, {"w": torch.tensor([1.0, 0.0])}


def _toy(loss_fn, **kw):
    kw = {"batch_size": 8, "eval_batches": 2, "initial_pivots": 3, **kw}
    return autoneb(Point(), A, B, TOY_DATA, loss_fn=loss_fn, **kw)


def _pts(path):
    return torch.stack([p["w"] for p in path])


# --------------------------------------------------------------------------------------- force helpers


def test_projected_gradient_is_orthogonal_to_the_tangent_and_the_spring_acts_along_it():
    g = torch.Generator().manual_seed(0)
    chain = torch.randn(6, 50, generator=g, dtype=torch.float64)
    grads = torch.randn(4, 50, generator=g, dtype=torch.float64)
    tau = neb_tangents(chain)
    assert tau.shape == (4, 50)
    assert torch.allclose(tau.norm(dim=1), torch.ones(4, dtype=torch.float64))
    central = chain[2:] - chain[:-2]
    assert torch.allclose(tau, central / central.norm(dim=1, keepdim=True))
    perp = perpendicular(grads, tau)
    assert (perp * tau).sum(1).abs().max() < 1e-12  # no component along the path
    assert torch.allclose(perp + (grads * tau).sum(1, keepdim=True) * tau, grads)  # only that part removed
    fs = spring_forces(chain, tau, 2.0)
    d_next = (chain[2:] - chain[1:-1]).norm(dim=1)
    d_prev = (chain[1:-1] - chain[:-2]).norm(dim=1)
    assert torch.allclose(fs, 2.0 * (d_next - d_prev)[:, None] * tau)
    assert torch.allclose(neb_gradient(grads, chain, tau, 2.0), perp - fs)
    assert torch.equal(neb_gradient(grads, chain, tau, 0.0), perp)
    # evenly spaced points on a line: the spring is at rest
    line = torch.linspace(0, 1, 5, dtype=torch.float64)[:, None] * torch.ones(3, dtype=torch.float64)
    assert spring_forces(line, neb_tangents(line), 1.0).abs().max() < 1e-12


def test_upwind_tangent_points_to_the_higher_neighbour_and_mixes_at_extrema():
    chain = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 1.0]], dtype=torch.float64)  # a kink at point 1
    plus, minus = torch.tensor([[1.0, 1.0]]) / math.sqrt(2), torch.tensor([[1.0, 0.0]])
    up = neb_tangents(chain, torch.tensor([0.0, 1.0, 2.0]))
    down = neb_tangents(chain, torch.tensor([2.0, 1.0, 0.0]))
    assert torch.allclose(up.float(), plus) and torch.allclose(down.float(), minus)
    # a maximum with V_next > V_prev: τ⁺·ΔV_max + τ⁻·ΔV_min with ΔV_max = |2 − 3| = 1, ΔV_min = |2.5 − 3| = 0.5
    top = neb_tangents(chain, torch.tensor([2.0, 3.0, 2.5]))
    want = torch.tensor([[1.0, 1.0]]) * 1.0 + torch.tensor([[1.0, 0.0]]) * 0.5
    assert torch.allclose(top.float(), want / want.norm())
    # equal energies: no upwind direction, the central tangent is used
    flat = neb_tangents(chain, torch.tensor([1.0, 1.0, 1.0]))
    assert torch.allclose(flat, neb_tangents(chain))


# ------------------------------------------------------------------------------------------ insertion


@pytest.mark.parametrize("centre, segment", [((0.7, 0.0), 2), ((0.2, 0.0), 0)])
def test_a_pivot_is_inserted_on_top_of_a_planted_bump(centre, segment):
    # pivots at 0.25/0.5/0.75; probes every 0.025: the bump's top is probe 8 of its segment (s = 0.8)
    path = _toy(_landscape(centre), cycles=2, steps_per_cycle=3, spring=0.0, insert_tol=0.05)
    ins = path.info["records"][0]["inserted"]
    assert ins is not None and ins["segment"] == segment and ins["position"] == pytest.approx(0.8)
    assert ins["loss"] == pytest.approx(0.5 * centre[0] + 1.0, abs=1e-5) and ins["excess"] > 0.3
    assert len(path) == 6 and path.info["n_pivots"] == 4
    # the bump is centred on the line: the perpendicular gradient is zero, so no pivot moves off it
    pts = _pts(path)
    assert torch.allclose(pts[segment + 1], torch.tensor(centre), atol=1e-6)
    assert path.info["records"][1]["pivots"] == 4 and path.info["records"][1]["inserted"] is None  # last cycle
    # a ramp alone is represented exactly by linear segments: nothing to insert
    flat = _toy(_landscape(None), cycles=3, steps_per_cycle=3, insert_tol=0.05)
    assert all(r["inserted"] is None for r in flat.info["records"]) and len(flat) == 5
    assert max(abs(r["max_excess"]) for r in flat.info["records"]) < 1e-5


def test_neb_bends_the_chain_around_an_off_line_bump():
    loss_fn = _landscape((0.5, 0.03), width=0.1, ramp=0.0)
    lin = torch.stack([torch.tensor([s, 0.0]) for s in np.linspace(0, 1, 101)])
    lin_peak = max(float(loss_fn(p[None], None)) for p in lin)
    path = _toy(loss_fn, cycles=2, steps_per_cycle=60, lr=0.002, spring=1.0, insert_tol=10.0)
    pts = _pts(path)
    assert pts[1:-1, 1].max() < -0.1, "the chain moves away from the bump (y < 0)"
    assert path.info["max_dense_loss"] < 0.5 * lin_peak, (path.info["max_dense_loss"], lin_peak)
    seg = (pts[1:] - pts[:-1]).norm(dim=1)
    assert seg.max() / seg.min() < 1.5, "the spring keeps the pivots roughly evenly spaced"
    arc = np.concatenate([[0], np.cumsum(seg.double().numpy())])
    assert np.allclose(path.t, arc / arc[-1])
    adam = _toy(loss_fn, cycles=2, steps_per_cycle=60, lr=0.01, optimizer="adam", insert_tol=10.0)
    assert adam.info["max_dense_loss"] < 0.5 * lin_peak and _pts(adam)[1:-1, 1].max() < -0.1


# --------------------------------------------------------------------------------------------- budget


def test_the_budget_is_respected_exactly_and_compute_is_counted():
    bump = _landscape((0.7, 0.0))
    calls = []
    kw = {"cycles": 3, "steps_per_cycle": 4, "spring": 0.0, "insert_tol": 0.05}
    # 4 steps × 3 pivots = 12, insert (12 + 4 ≤ 20), then 2 steps × 4 pivots = 20: the third would be 24
    p = _toy(bump, budget=20, progress=lambda s, n: calls.append((s, n)), **kw)
    assert p.compute["grad_evals"] == 20 and p.info["budget_left"] == 0 and p.info["stopped"] == "budget"
    assert [(r["steps"], r["pivots"]) for r in p.info["records"]] == [(4, 3), (2, 4)]
    assert calls == [(i, 12) for i in range(1, 7)]
    assert _toy(bump, budget=23, **kw).compute["grad_evals"] == 20  # 3 left: less than one step of 4 pivots
    # 12 spent; an inserted pivot could not be paid one step (12 + 4 > 14), so none is inserted
    q = _toy(bump, budget=14, **kw)
    assert q.compute["grad_evals"] == 12 and q.info["budget_left"] == 2 and len(q) == 5
    assert [r["inserted"] for r in q.info["records"]] == [None]
    # unlimited: every step of every cycle; forward evals = dense checks (endpoints once) + upwind energies
    for tangent, per_step in (("central", 0), ("upwind", 2)):
        r = _toy(bump, tangent=tangent, **kw)
        recs = r.info["records"]
        assert r.compute["grad_evals"] == sum(x["steps"] * x["pivots"] for x in recs) == 4 * (3 + 4 + 5)
        dense = sum(x["pivots"] + (x["pivots"] + 1) * 9 for x in recs) + 2
        assert r.compute["forward_evals"] == 2 * dense + per_step * 12, tangent
        assert set(r.compute) == {"grad_evals", "forward_evals", "wall_time_s"}


# --------------------------------------------------------------------------- exactness and determinism


def test_endpoints_exact_inputs_untouched_and_the_same_seed_gives_the_same_bytes():
    model = _mlp(0, norm="batchnorm")
    model.eval()
    sd_a, sd_b = _clone(model.state_dict()), _clone(_mlp(1, norm="batchnorm").state_dict())
    sd_b = {k: (v + 0.5 if k.endswith("running_mean") else v) for k, v in sd_b.items()}  # distinct buffers
    keep_a, keep_b, keep_m = _clone(sd_a), _clone(sd_b), _clone(model.state_dict())
    kw = {"cycles": 2, "steps_per_cycle": 5, "lr": 0.05, "batch_size": 16, "insert_tol": 0.0, "eval_batches": 2, "seed": 3}
    path = autoneb(model, sd_a, sd_b, _data(), **kw)
    assert isinstance(path, Path) and path.method == "autoneb"
    assert _same(path[0], keep_a) and _same(path[-1], keep_b), "endpoints are bit-identical copies"
    assert _same(sd_a, keep_a) and _same(sd_b, keep_b) and _same(model.state_dict(), keep_m), "inputs not mutated"
    assert not model.training
    assert json.loads(json.dumps(path.info))["records"] == path.info["records"]  # JSON-ready (Path.save)
    assert path.info["records"][0]["inserted"] is not None and len(path) == 6
    # inner pivots: moved parameters, buffers interpolated at the pivot's t (integer buffers from A)
    names = param_names(model)
    lerp = interpolate(sd_a, sd_b, float(path.t[2]))
    for k, v in path[2].items():
        if k in names:
            assert v.dtype == sd_a[k].dtype and not torch.equal(v, lerp[k])
        else:
            assert torch.equal(v, lerp[k]), k
    # t is the normalised arc length over the parameters
    arc = np.cumsum([0.0] + [distance(path[i], path[i + 1], names) for i in range(len(path) - 1)])
    assert np.allclose(path.t, arc / arc[-1]) and path.t[0] == 0.0 and path.t[-1] == 1.0

    again = autoneb(model, sd_a, sd_b, _data(), **kw)
    assert len(again) == len(path) and all(_same(again[i], path[i]) for i in range(len(path)))
    assert again.t.tolist() == path.t.tolist() and again.info["records"] == path.info["records"]
    other = autoneb(model, sd_a, sd_b, _data(), **{**kw, "seed": 4})
    assert not all(_same(other[i], path[i]) for i in range(min(len(other), len(path))))
    # through a config object, with an override, the run is the same
    cfg = AutoNEBConfig(**{**kw, "seed": 0})
    assert all(_same(a, b) for a, b in zip(autoneb(model, sd_a, sd_b, _data(), cfg, seed=3), path, strict=False))

    x, y = _data().tensors
    loader = [(x[i:i + 32], y[i:i + 32]) for i in (0, 32)]
    curve = path.evaluate(model, {"train": loader}, bn_loader=loader)
    assert np.isfinite(curve.values("train")).all()


# ------------------------------------------------------------------------------------------ bad inputs


def test_bad_options_raise_config_error_naming_the_option():
    model = _mlp(0)
    sd_a, sd_b = model.state_dict(), _mlp(1).state_dict()
    wide = _mlp(1, width=24).state_dict()
    cases = [
        ({"spring_constant": 1.0}, "spring_constant"),
        ({"lr": 0.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"optimizer": "lbfgs"}, "optimizer"),
        ({"tangent": "bisector"}, "tangent"),
        ({"initial_pivots": 3, "max_pivots": 2}, "max_pivots"),
        ({"budget": 2}, "budget"),
        ({"insert_probe": 0}, "insert_probe"),
        ({"cycles": 0}, "cycles"),
        ({"momentum": 1.0}, "momentum"),
        ({"spring": -1.0}, "spring"),
    ]
    for opts, name in cases:
        # options are checked first: even with endpoints of another architecture it is the option that fails
        with pytest.raises(ConfigError, match=name):
            autoneb(model, sd_a, wide, _data(), **opts)
    with pytest.raises(ConfigError, match="'cycle'.*did you mean 'cycles'"):
        autoneb(model, sd_a, sd_b, _data(), {"cycle": 2})
    with pytest.raises(ConfigError, match="AutoNEBConfig"):
        autoneb(model, sd_a, sd_b, _data(), config=[1, 2])
    with pytest.raises(ConfigError, match="training data"):
        autoneb(model, sd_a, sd_b, 42)
    with pytest.raises(StateDictMismatchError):
        autoneb(model, sd_a, wide, _data(), cycles=1, steps_per_cycle=1)


def test_a_nan_loss_raises_non_finite_error_naming_where():
    def nan_loss(out, y):
        return out.sum() * float("nan")

    with pytest.raises(NonFiniteError, match="cycle 0, step 0, pivot 1"):
        _toy(nan_loss, cycles=1, steps_per_cycle=2)
    bad = {"w": torch.tensor([float("nan"), 0.0])}
    with pytest.raises(NonFiniteError, match="A"):
        autoneb(Point(), bad, B, TOY_DATA, loss_fn=_landscape(None))
    # a step that diverges (perpendicular to the path): the next minibatch loss overflows
    with pytest.raises(NonFiniteError, match="step 1"):
        _toy(lambda out, y: (out.mean(0)[1] - 1.0) ** 2, lr=1e30, cycles=1, steps_per_cycle=3)


# ------------------------------------------------------------------------------------------ functional


@pytest.fixture(scope="module")
def digits_modes():
    ds = load_dataset("digits")
    sds = []
    for seed in (0, 1):
        m = build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=2, width=32, seed=seed)
        fit(m, ds.train, TrainConfig(epochs=8, lr=0.05, batch_size=64, seed=seed, weight_decay=0.0, warmup_epochs=0),
            progress=False)
        sds.append(_clone(m.state_dict()))
    return ds, m, sds


def test_autoneb_between_independent_mlps_on_digits_has_a_lower_peak_than_the_linear_path(digits_modes):
    ds, m, (sd_a, sd_b) = digits_modes
    keep = copy.deepcopy(m.state_dict())
    loaders = {"train": make_loader(ds.train, 512)}
    lin = linear_path(sd_a, sd_b, 11).evaluate(m, loaders)
    path = autoneb(m, sd_a, sd_b, ds.train, cycles=3, steps_per_cycle=40, lr=0.05, batch_size=64, eval_batches=2)
    curve = path.evaluate(m, loaders, sub_points=3)
    assert lin.peak("train") > 0.4, "independent modes: a real barrier on the straight line"
    assert curve.dense_peak("train") < 0.5 * lin.peak("train"), (curve.dense_peak("train"), lin.peak("train"))
    assert curve.values("train")[0] == pytest.approx(lin.values("train")[0], abs=1e-6)
    assert path.compute["grad_evals"] == sum(r["steps"] * r["pivots"] for r in path.info["records"])
    assert _same(m.state_dict(), keep)
