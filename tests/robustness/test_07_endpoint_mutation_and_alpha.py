"""Class 7 — an endpoint mutated in place by align/merge; the α convention flipped.

Every alignment, path and merge function takes state dicts and models as read-only inputs: a byte-level digest of
every input (and the model's training flags) is identical afterwards. The convention is ``θ(λ) = (1−λ)θ_A + λθ_B``:
λ=0 (weights [1, 0]) gives A *exactly* — in every dtype, float64 included — and λ=1 gives B's floating tensors.
"""

from __future__ import annotations

import copy

import pytest
import torch
from archs import digest, make
from rb_helpers import batches

import modeconn as mc
from modeconn.path import evaluate as evaluate_mod
from modeconn.path import evaluate_model, weighted_average

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def assert_inputs_untouched(fn, *inputs, models=()) -> None:
    """The mutation check: ``fn()`` leaves every input state dict and model (weights and flags) as it was."""
    before = [digest(sd) for sd in inputs]
    model_before = [(digest(m.state_dict()), [x.training for x in m.modules()]) for m in models]
    fn()
    for i, (sd, d) in enumerate(zip(inputs, before, strict=False)):
        changed = [k for k in d if digest(sd)[k] != d[k]]
        assert not changed, f"input {i} was mutated in place: {changed}"
    for m, (d, flags) in zip(models, model_before, strict=False):
        assert digest(m.state_dict()) == d, f"model {type(m).__name__} was mutated"
        assert [x.training for x in m.modules()] == flags, "training flags not restored"


@pytest.fixture(scope="module")
def pair():
    a, x = make("mlp-bn", seed=0)
    b, _ = make("mlp-bn", seed=1)
    a.train()  # a caller's model in train mode must come back in train mode
    spec = mc.symmetry_spec(a, x)
    return a, b, x, spec


def _calls(a, b, x, spec):
    sa, sb = a.state_dict(), b.state_dict()
    loader = batches(x.shape[1:], n=2)
    res = mc.weight_matching(spec, sa, sb)
    return {
        "spec.apply": lambda: spec.apply(sb, spec.random_element(seed=0)),
        "weight_matching": lambda: mc.weight_matching(spec, sa, sb, restarts=2),
        "Alignment.apply": lambda: res.apply(sb),
        "activation_matching": lambda: mc.activation_matching(spec, a, b, loader),
        "learned_matching": lambda: mc.learned_matching(spec, a, sa, sb, loader, steps=2, init=res.element),
        "interpolate": lambda: [mc.interpolate(sa, sb, lam) for lam in (0.0, 0.3, 1.0)],
        "weighted_average": lambda: weighted_average([sa, sb, sa], [0.2, 0.3, 0.5]),
        "merge": lambda: mc.merge([sa, sb], model=a, bn_loader=loader),
        "merge-repair": lambda: mc.merge([sa, sb], model=a, bn="repair", bn_loader=loader, spec=spec),
        "evaluate_path": lambda: mc.evaluate_path(a, sa, sb, loader, lambdas=3, bn_loader=loader),
    }


@pytest.mark.parametrize("name", ["spec.apply", "weight_matching", "Alignment.apply", "activation_matching", "learned_matching",
                                  "interpolate", "weighted_average", "merge", "merge-repair", "evaluate_path"])
def test_no_function_mutates_its_inputs(pair, name):
    a, b, x, spec = pair
    fn = _calls(a, b, x, spec)[name]
    assert_inputs_untouched(fn, a.state_dict(), b.state_dict(), models=(a, b))


def test_negative_control_in_place_merge_is_caught(pair, monkeypatch):
    a, b, _, _ = pair
    sa, sb = ({k: v.clone() for k, v in m.state_dict().items()} for m in (a, b))

    def in_place(state_dicts, weights, check=True, **_):  # broken variant: accumulates into the first endpoint
        out = state_dicts[0]
        for k, t in out.items():
            if t.is_floating_point():
                t.mul_(weights[0]).add_(state_dicts[1][k], alpha=weights[1])
        return dict(out)

    monkeypatch.setattr(evaluate_mod, "weighted_average", in_place)
    with pytest.raises(AssertionError, match="mutated in place"):
        assert_inputs_untouched(lambda: mc.merge([sa, sb]), sa, sb)


def check_alpha_convention(model, sd_a, sd_b, loader) -> None:
    """λ=0 / weights [1, 0] is A exactly, λ=1 / weights [0, 1] is B (floats); the path starts at A."""
    for k, v in mc.interpolate(sd_a, sd_b, 0.0).items():
        assert torch.equal(v, sd_a[k]) and v.dtype == sd_a[k].dtype, k
    for k, v in mc.interpolate(sd_a, sd_b, 1.0).items():
        assert torch.equal(v, sd_b[k] if v.is_floating_point() else sd_a[k]), k
    for k, v in mc.merge([sd_a, sd_b], [1.0, 0.0]).items():
        assert torch.equal(v, sd_a[k]), f"merge([a, b], [1, 0]) differs from a at {k}"
    for k, v in mc.merge([sd_a, sd_b], [0.0, 1.0]).items():
        assert torch.equal(v, sd_b[k] if v.is_floating_point() else sd_a[k]), k
    quarter = mc.interpolate(sd_a, sd_b, 0.25)
    k = next(k for k, v in sd_a.items() if v.is_floating_point() and not torch.equal(v, sd_b[k]))
    assert (quarter[k].double() - sd_a[k].double()).norm() < (quarter[k].double() - sd_b[k].double()).norm()
    curve = mc.evaluate_path(model, sd_a, sd_b, loader, lambdas=3, bn_loader=loader)
    assert curve.lambdas[0] == 0.0 and curve.lambdas[-1] == 1.0
    m = {s: copy.deepcopy(model) for s in "ab"}
    m["a"].load_state_dict(sd_a)
    m["b"].load_state_dict(sd_b)
    assert curve.values()[0] == evaluate_model(m["a"], loader)["loss"], "the path does not start at A"
    assert curve.values()[-1] == evaluate_model(m["b"], loader)["loss"], "the path does not end at B"


def test_alpha_convention(pair):
    a, b, x, _ = pair
    check_alpha_convention(a, a.state_dict(), b.state_dict(), batches(x.shape[1:], n=2))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_weights_one_zero_give_a_exactly_in_every_dtype(dtype):
    g = torch.Generator().manual_seed(0)
    sa = {"w": torch.randn(64, generator=g, dtype=torch.float64).to(dtype), "n": torch.tensor(3)}
    sb = {"w": torch.randn(64, generator=g, dtype=torch.float64).to(dtype), "n": torch.tensor(8)}
    for k, v in mc.merge([sa, sb], [1.0, 0.0]).items():
        assert v.dtype == sa[k].dtype and torch.equal(v, sa[k]), (dtype, k)
    assert torch.equal(mc.interpolate(sa, sb, 0.0)["w"], sa["w"])


def test_negative_control_flipped_alpha_is_caught(pair, monkeypatch):
    a, b, x, _ = pair
    original = evaluate_mod.interpolate
    monkeypatch.setattr(evaluate_mod, "interpolate", lambda sd_a, sd_b, lam: original(sd_a, sd_b, 1.0 - lam))
    with pytest.raises(AssertionError, match="does not start at A"):
        check_alpha_convention(a, a.state_dict(), b.state_dict(), batches(x.shape[1:], n=2))
