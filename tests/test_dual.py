"""Continuous parameterisations (Cayley / matrix exponential / polar / unconstrained) and dual / one-sided learned
matching (LMC-DM, METHODS.md §3) on tiny absorbed decoders with the full group set: GPT-NeoX (every test) and OLMo
(parameter-free LayerNorm, grouped-query attention; the endpoint, planted-pair and midpoint tests, :data:`FAMILIES`)."""

from __future__ import annotations

import math

import pytest
import torch
from hf_tiny import digest, make
from torch.func import functional_call

import modeconn as mc
from modeconn.errors import ConfigError, SpecError, StateDictMismatchError
from modeconn.match import dual_matching, one_sided_matching
from modeconn.match.dual import DualAlignment, _draw_lambda, default_loss, element_from_state_dict
from modeconn.match.parametrize import PARAMETERIZATIONS, make_transform
from modeconn.symmetry import hf
from modeconn.symmetry.groups import get_group

pytestmark = pytest.mark.usefixtures("one_thread")

FULL = {"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible", "vo": "head_invertible",
        "ffn": "permutation"}
GROUPS = [
    ("orthogonal", {}, 7),
    ("invertible", {}, 6),
    ("scaling", {}, 5),
    ("head_orthogonal", {"dim": 6, "rotary_dims": 4}, 3),
    ("head_invertible", {"dim": 6, "rotary_dims": 4}, 3),
    ("head_invertible", {"dim": 4, "rotary_dims": 4, "rotary_pairing": "interleaved"}, 2),
    ("head_orthogonal", {"dim": 5}, 2),
]


# ------------------------------------------------------------------------------------------ parameterisations
@pytest.mark.parametrize("name,params,n", GROUPS)
@pytest.mark.parametrize("par", ["cayley", "matrix_exp", "unconstrained"])
def test_initialisation_at_a_given_element_is_exact(name, params, n, par):
    group = get_group(name, **params)
    e = group.random(n, torch.Generator().manual_seed(1))
    t = make_transform(group, e, par)
    assert torch.equal(t(), e)
    if par == "unconstrained":  # element() projects onto the group (SVD): exact up to rounding
        assert torch.allclose(t.element(), e, atol=1e-6)
    else:
        assert torch.equal(t.element(), e)


@pytest.mark.parametrize("name,params,n", GROUPS)
@pytest.mark.parametrize("par", ["cayley", "matrix_exp"])
def test_parameterisations_stay_in_the_group_through_adam(name, params, n, par):
    gen = torch.Generator().manual_seed(2)
    group = get_group(name, **params)
    e = group.random(n, gen)
    t = make_transform(group, e, par)
    target = group.random(n, gen)
    if target.dim() >= 2:  # the maps keep the connected component of the start (det sign): aim inside it
        flip = torch.sign(torch.linalg.det(target.double()) * torch.linalg.det(e.double())).float()
        target[..., :, -1] *= flip[..., None]
    target = target + 0.1 * torch.randn(e.shape, generator=gen)  # a random objective: ‖M − target‖²
    opt = torch.optim.Adam(t.parameters(), lr=0.1)
    losses = []
    for _ in range(50):
        loss = ((t() - target) ** 2).sum()
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    m = t().detach()
    assert float(((m - target) ** 2).sum()) < 0.8 * losses[0]  # it moved towards the target ...
    assert not torch.allclose(m, e, atol=1e-2)
    group.check(m, n, "learned")  # ... and stayed orthogonal / invertible / positive / RoPE-commuting
    if name.endswith("orthogonal"):
        eye = torch.eye(m.shape[-1])
        assert float((m.transpose(-1, -2) @ m - eye).abs().max()) < 1e-5  # to fp32 precision
    if "invertible" in name:
        eye = torch.eye(m.shape[-1])
        assert float((torch.linalg.inv(m) @ m - eye).abs().max()) < 1e-4  # invertible in fp32
    if params.get("rotary_dims"):
        assert float((group.project(m) - m).abs().max()) == 0.0  # exact RoPE structure


@pytest.mark.parametrize("name,params,n", [g for g in GROUPS if "orthogonal" in g[0]])
def test_unconstrained_orthogonal_leaves_the_group_and_element_projects_back(name, params, n):
    gen = torch.Generator().manual_seed(3)
    group = get_group(name, **params)
    t = make_transform(group, group.random(n, gen), "unconstrained")
    opt = torch.optim.Adam(t.parameters(), lr=0.1)
    target = 2 * torch.randn(t().shape, generator=gen)
    for _ in range(10):
        loss = ((t() - target) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with pytest.raises(SpecError):
        group.check(t().detach(), n, "raw")
    group.check(t.element(), n, "projected")


def test_parameterisation_registry_and_errors():
    assert PARAMETERIZATIONS.names() == ["cayley", "matrix_exp", "unconstrained"]
    with pytest.raises(ConfigError, match="parameterization 'cayly'.*cayley, matrix_exp, unconstrained"):
        make_transform(get_group("orthogonal"), torch.eye(3), "cayly")
    with pytest.raises(SpecError, match="permutation"):
        make_transform(get_group("permutation"), torch.arange(3))
    with pytest.raises(SpecError, match="not orthogonal"):
        make_transform(get_group("orthogonal"), 2 * torch.eye(3))


# ------------------------------------------------------------------------------------------ dual matching
#: the tiny decoders the endpoint, planted-pair and midpoint tests run on (hf_tiny names)
FAMILIES = ["gpt_neox", "olmo"]
#: (Adam steps, lr) of the planted-pair test from the identity's continuous parts, per family: the Llama-style tiny
#: decoders (OLMo; Llama and Mistral behave alike: grouped-query attention, full rotary, SwiGLU) need more steps
#: to undo a random residual rotation and OV transforms than the tiny GPT-NeoX
PLANTED_BUDGET = {"gpt_neox": (30, 0.03), "olmo": (200, 0.05)}
_LMS: dict[str, dict] = {}
_WMS: dict[str, object] = {}


def _lm(name: str) -> dict:
    """Two independently initialised tiny absorbed ``name`` LMs, the full-group spec, random-token batches
    (labels: A's argmax predictions, so the endpoint loss is low and a misaligned path shows a barrier)."""
    if name not in _LMS:
        ma = mc.absorb_normalization(make(name, 0))
        mb = mc.absorb_normalization(make(name, 1))
        spec = hf.hf_symmetry_spec(ma, groups=FULL)
        gen = torch.Generator().manual_seed(0)
        xs = torch.randint(0, 50, (3, 8, 12), generator=gen)
        with torch.no_grad():
            ys = torch.stack([ma(x).logits.argmax(-1) for x in xs])
        _LMS[name] = {"name": name, "model": ma, "spec": spec, "a": ma.state_dict(), "b": mb.state_dict(),
                      "loader": list(zip(xs, ys, strict=False))}
    return _LMS[name]


def _wm(lm: dict):
    if lm["name"] not in _WMS:
        _WMS[lm["name"]] = mc.weight_matching(lm["spec"], lm["a"], lm["b"], seed=0, restarts=1, max_iter=3)
    return _WMS[lm["name"]]


@pytest.fixture(scope="module")
def lm():
    """:func:`_lm` of GPT-NeoX (the option, error and resume tests)."""
    return _lm("gpt_neox")


@pytest.fixture(scope="module", params=FAMILIES)
def family_lm(request):
    """:func:`_lm` of each of :data:`FAMILIES`."""
    return _lm(request.param)


@pytest.fixture(scope="module")
def wm_independent(lm):
    return _wm(lm)


@pytest.fixture(scope="module")
def family_wm(family_lm):
    return _wm(family_lm)


def test_olmo_pair_is_absorbed_from_parameter_free_layernorms():
    """OLMo's LayerNorms have no weight or bias; absorption centres and folds them all the same (the function is
    kept), and the full group is bound on the absorbed model."""
    from hf_tiny import outputs

    raw = make("olmo", 0)
    assert not any("norm" in k for k in raw.state_dict())  # parameter-free: nothing to fold but the centring
    lm = _lm("olmo")
    x = {"input_ids": lm["loader"][0][0]}
    torch.testing.assert_close(outputs(lm["model"], x)["logits"], outputs(raw, x)["logits"], atol=1e-4, rtol=1e-4)
    assert {n.kind for n in hf.describe(lm["model"]).stream.norms} == {"rms"}
    assert lm["spec"].spaces["residual"].group == "orthogonal"
    assert {sp.group for s, sp in lm["spec"].spaces.items() if s.endswith((".qk", ".vo"))} == {"head_invertible"}


def _path_loss(lm, sd_a, sd_b, lam):
    theta = {k: (a + lam * (sd_b[k] - a)) if a.is_floating_point() else a for k, a in sd_a.items()}
    with torch.no_grad():
        return sum(float(default_loss(functional_call(lm["model"], theta, (x,)), y)) for x, y in lm["loader"]) / len(lm["loader"])


def _barrier(lm, sd_a, sd_b):
    losses = [_path_loss(lm, sd_a, sd_b, lam) for lam in (0.0, 0.25, 0.5, 0.75, 1.0)]
    return max(losses) - (losses[0] + losses[-1]) / 2


def _logits(lm, sd):
    with torch.no_grad():
        return torch.cat([functional_call(lm["model"], sd, (x,)).logits for x, _ in lm["loader"]])


def test_dual_matching_never_changes_either_endpoints_function(family_lm, family_wm):
    lm, wm_independent = family_lm, family_wm
    spec, a, b = lm["spec"], lm["a"], lm["b"]
    before = digest(lm["model"]), {k: v.clone() for k, v in a.items()}, {k: v.clone() for k, v in b.items()}
    calls = []
    res = dual_matching(spec, lm["model"], a, b, lm["loader"], steps=6, lr=0.05, weight_alignment=wm_independent,
                        progress=lambda stage, done, total, **metrics: calls.append((done, total, set(metrics))))
    assert calls == [(i, 6, {"loss", "lam"}) for i in range(1, 7)]
    assert isinstance(res, DualAlignment) and res.method == "dual"
    assert digest(lm["model"]) == before[0]
    assert all(torch.equal(a[k], before[1][k]) and torch.equal(b[k], before[2][k]) for k in a)  # inputs untouched
    assert not spec.equal(res.element_a, spec.identity())  # A's transform moved: the check below is not vacuous
    for sd, apply in ((a, res.apply_a), (b, res.apply_b)):
        assert float((_logits(lm, apply(sd)) - _logits(lm, sd)).abs().max()) < 1e-4
    # discrete parts on B only; the relative element g_A^{-1}∘g_B gives the same path (gauge equivalence)
    assert all(torch.equal(res.element_a[s], torch.arange(sp.size)) for s, sp in spec.spaces.items() if sp.group == "permutation")
    dual_mid = _logits(lm, mc.interpolate(res.apply_a(a), res.apply_b(b), 0.5))
    rel_mid = _logits(lm, mc.interpolate(a, res.apply(b), 0.5))
    assert not torch.allclose(rel_mid, _logits(lm, a), atol=1e-2)
    # the two paths differ by the symmetry g_A, which leaves the logits unchanged
    assert float((dual_mid - rel_mid).abs().max()) < 1e-4
    assert res.stats["steps"] == 6 and len(res.history[0]) == 6 and res.stats["seconds"] > 0
    assert res.stats["max_output_change_a"] < 1e-4 and res.stats["max_output_change_b"] < 1e-4


@pytest.mark.parametrize("one_sided", [False, True])
def test_planted_pair_reaches_a_near_zero_barrier(family_lm, one_sided):
    lm = family_lm
    spec, a = lm["spec"], lm["a"]
    b = spec.apply(a, spec.random_element(seed=3))  # θ_B = g·θ_A, g a random full-group element
    wm = mc.weight_matching(spec, a, b, seed=0, restarts=1)
    # discrete parts from WM, continuous parts from the identity: a large barrier to start from
    start = {s: (wm.element[s] if spec.group_of(s).exact else t) for s, t in spec.identity().items()}
    initial = _barrier(lm, a, spec.apply(b, start))
    steps, lr = PLANTED_BUDGET[lm["name"]]
    res = dual_matching(spec, lm["model"], a, b, lm["loader"], steps=steps, lr=lr, init="identity",
                        one_sided=one_sided, weight_alignment=wm, seed=1)
    final = _barrier(lm, res.apply_a(a), res.apply_b(b))
    assert initial > 1.0
    assert final < 0.1
    mid = _path_loss(lm, res.apply_a(a), res.apply_b(b), 0.5)
    assert mid < _path_loss(lm, a, a, 0.0) + 0.1  # the interpolated model's loss ≈ the endpoint loss
    assert res.method == ("one_sided" if one_sided else "dual")
    if one_sided:
        assert spec.equal(res.element_a, spec.identity()) and spec.equal(res.element, res.element_b)


def test_dual_and_one_sided_lower_the_midpoint_loss_below_weight_matching(family_lm, family_wm):
    lm, wm_independent = family_lm, family_wm
    spec, a, b = lm["spec"], lm["a"], lm["b"]
    wm_mid = _path_loss(lm, a, wm_independent.apply(b), 0.5)
    opts = {"steps": 12, "lr": 0.01, "lambda_schedule": "fixed", "lambda_value": 0.5, "weight_alignment": wm_independent}
    dual = dual_matching(spec, lm["model"], a, b, lm["loader"], **opts)
    one = one_sided_matching(spec, lm["model"], a, b, lm["loader"], **opts)
    for res in (dual, one):
        mid = _path_loss(lm, res.apply_a(a), res.apply_b(b), 0.5)
        assert mid < wm_mid - 0.1, (res.method, mid, wm_mid)
        assert res.history[0][-1] < res.history[0][0]
        assert res.stats["lambdas"] == [0.5] * 12


def test_lambda_schedules():
    gen = torch.Generator().manual_seed(0)
    base = {"lambda_value": 0.5, "lambda_width": 0.1}
    uniform = [_draw_lambda({**base, "lambda_schedule": "uniform"}, gen) for _ in range(200)]
    narrow = [_draw_lambda({**base, "lambda_schedule": "narrow"}, gen) for _ in range(200)]
    edge = [_draw_lambda({"lambda_schedule": "narrow", "lambda_value": 0.95, "lambda_width": 0.1}, gen) for _ in range(200)]
    assert min(uniform) < 0.1 and max(uniform) > 0.9
    assert 0.4 <= min(narrow) and max(narrow) <= 0.6 and max(narrow) - min(narrow) > 0.15
    assert 0.85 <= min(edge) and max(edge) <= 1.0
    assert _draw_lambda({**base, "lambda_schedule": "fixed"}, gen) == 0.5


def _bad_loader():
    raise AssertionError("the loader must not be touched before the options are validated")
    yield  # pragma: no cover


class _Untouchable:
    def __iter__(self):
        return _bad_loader()


@pytest.mark.parametrize("option,value", [
    ("steps", 0), ("steps", 2.5), ("lr", 0.0), ("lr", math.nan), ("lambda_schedule", "gaussian"),
    ("lambda_value", 1.5), ("lambda_value", -0.1), ("lambda_width", 0.0), ("init", "random"),
    ("parameterization", "householder"), ("one_sided", "yes"), ("checkpoint_every", 0), ("seed", None),
])
def test_bad_options_raise_config_error_naming_the_option_before_any_work(lm, option, value):
    with pytest.raises(ConfigError, match=option):
        dual_matching(lm["spec"], lm["model"], lm["a"], lm["b"], _Untouchable(), **{option: value})


def test_mismatched_state_dicts_and_empty_loader(lm):
    spec, a, b = lm["spec"], lm["a"], lm["b"]
    bad = dict(b)
    bad["lm_head.bias"] = torch.zeros(51)
    with pytest.raises(StateDictMismatchError, match="lm_head.bias"):
        dual_matching(spec, lm["model"], a, bad, _Untouchable())
    missing = {k: v for k, v in b.items() if k != "lm_head.bias"}
    with pytest.raises(StateDictMismatchError, match="lm_head.bias"):
        dual_matching(spec, lm["model"], a, missing, _Untouchable())
    with pytest.raises(ConfigError, match="empty loader"):
        dual_matching(spec, lm["model"], a, b, [])
    perm_spec = hf.hf_symmetry_spec(lm["model"], groups="permutation")
    with pytest.raises(ConfigError, match="no continuous space"):
        dual_matching(perm_spec, lm["model"], a, b, _Untouchable())
    with pytest.raises(ConfigError, match="one_sided"):
        one_sided_matching(spec, lm["model"], a, b, _Untouchable(), one_sided=False)


def test_resume_gives_the_same_bytes_and_export_round_trips(lm, wm_independent, tmp_path):
    spec, a, b = lm["spec"], lm["a"], lm["b"]
    opts = {"lr": 0.02, "weight_alignment": wm_independent, "seed": 5, "checkpoint_every": 2, "verify": False}
    whole = dual_matching(spec, lm["model"], a, b, lm["loader"], steps=7, checkpoint_dir=tmp_path / "whole", **opts)
    first = dual_matching(spec, lm["model"], a, b, lm["loader"], steps=4, checkpoint_dir=tmp_path / "split", **opts)
    resumed = dual_matching(spec, lm["model"], a, b, lm["loader"], steps=7, checkpoint_dir=tmp_path / "split", **opts)
    assert first.history[0] == resumed.history[0][:4] and resumed.stats["resumed_from"] == 4
    assert whole.history[0] == resumed.history[0] and whole.stats["lambdas"] == resumed.stats["lambdas"]
    ex_w, ex_r = whole.export_transforms(), resumed.export_transforms()
    for side in ("a", "b"):
        for s, t in ex_w[side].items():
            assert t.dtype == ex_r[side][s].dtype and t.numpy().tobytes() == ex_r[side][s].numpy().tobytes()
    # other options with the same directory: refused, naming the problem
    with pytest.raises(ConfigError, match="other options"):
        dual_matching(spec, lm["model"], a, b, lm["loader"], steps=7, checkpoint_dir=tmp_path / "split",
                      **{**opts, "lr": 0.03})
    # exported transforms are safetensors-compatible and load back as valid elements
    from safetensors.torch import load_file, save_file

    save_file(ex_r["b"], str(tmp_path / "b.safetensors"))
    g_b = element_from_state_dict(spec, load_file(str(tmp_path / "b.safetensors")))
    assert all(torch.equal(g_b[s], resumed.element_b[s]) for s in spec.spaces)
