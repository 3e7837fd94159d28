"""Symmetry IR and traced specs: function preservation, group laws, validation, tracer coverage."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from archs import ARCH_IDS, digest, make
from hypothesis import given, settings
from hypothesis import strategies as st

import modeconn as mc
from modeconn.errors import SpecError, StateDictMismatchError, UnsupportedOperationError
from modeconn.symmetry import AxisBinding, SymmetrySpec


def _logits(model, sd, x):
    m = copy.deepcopy(model)
    m.load_state_dict(sd)
    with torch.no_grad():
        return m.eval()(x)


@pytest.mark.parametrize("arch", ARCH_IDS)
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_element_preserves_logits(arch, seed):
    model, x = make(arch)
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    before = digest(sd)
    g = spec.random_element(torch.Generator().manual_seed(seed))
    sd_g = spec.apply(sd, g)
    torch.testing.assert_close(_logits(model, sd_g, x), _logits(model, sd, x), atol=1e-5, rtol=1e-5)
    assert digest(sd) == before, "apply mutated its input"
    changed = [k for k in sd if not torch.equal(sd[k], sd_g[k])]
    assert changed, "a random element should move some tensor"


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_group_laws(arch):
    model, x = make(arch)
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    g, h = spec.random_element(seed=1), spec.random_element(seed=2)
    back = spec.apply(spec.apply(sd, g), spec.inverse(g))
    assert all(torch.equal(back[k], sd[k]) for k in sd)
    lhs = spec.apply(spec.apply(sd, h), g)
    rhs = spec.apply(sd, spec.compose(g, h))
    assert all(torch.equal(lhs[k], rhs[k]) for k in sd)
    assert spec.equal(spec.compose(g, spec.inverse(g)), spec.identity())
    ident = spec.apply(sd, spec.identity())
    assert all(torch.equal(ident[k], sd[k]) for k in sd)


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_input_and_output_never_permuted(arch):
    model, x = make(arch)
    spec = mc.symmetry_spec(model, x)
    spec.validate(model)
    layers = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    first, head = layers[0], layers[-1]
    assert all(b.side == "out" for b in spec.tensors[f"{first}.weight"]), "input space must stay fixed"
    assert all(b.side == "in" for b in spec.tensors[f"{head}.weight"]), "output space must stay fixed"
    assert spec.tensors.get(f"{head}.bias", ()) == ()
    for k in spec.tensors:
        if k.endswith("num_batches_tracked"):
            assert spec.tensors[k] == ()


def test_resnet_structure():
    model, x = make("resnet20-bn")
    spec = mc.symmetry_spec(model, x)
    shortcut_convs = [k for k, t in model.state_dict().items() if t.dim() == 4 and t.shape[-1] == 1]
    assert len(shortcut_convs) == 2
    for k in shortcut_convs:  # shortcut conv writes the stage's residual space and reads the previous one
        sides = {b.side for b in spec.tensors[k]}
        assert sides == {"out", "in"}
    # three residual streams (one per stage) + two inner convs per block (9 blocks) + nothing else
    assert len(spec.spaces) == 3 + 9
    assert all(spec.tensors[k] for k in model.state_dict() if "running" in k)


def test_flatten_binds_linear_in_blocks_of_hw():
    model, x = make("vgg-bn")
    spec = mc.symmetry_spec(model, x)
    lin = next(k for k, t in model.state_dict().items() if t.dim() == 2)
    (b_in,) = [b for b in spec.tensors[lin] if b.side == "in"]
    assert b_in.block == 2 * 2 and spec.spaces[b_in.space].size == 16


class _Concat(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(4, 3)
        self.dw = nn.Conv1d(9, 9, 3, padding=1, groups=9)
        self.out = nn.Linear(9, 2)

    def forward(self, x):
        h = torch.cat([F.relu(self.a(x)), torch.tanh(self.b(x))], dim=1)
        h = self.dw(h.unsqueeze(-1).expand(-1, -1, 5).contiguous().flip(1)).mean(-1)
        return self.out(h)


def test_concat_and_depthwise():
    model = _Concat().eval()
    x = torch.randn(7, 4)
    with pytest.raises(UnsupportedOperationError, match="flip"):
        mc.symmetry_spec(model, x)
    spec = mc.symmetry_spec(model, x, on_unsupported="freeze")
    spec.validate(model)

    class Broadcast(_Concat):  # unsqueeze / expand along dims the symmetry does not act on: the channels pass
        def forward(self, x):
            h = torch.cat([F.relu(self.a(x)), torch.tanh(self.b(x))], dim=1)
            return self.out(self.dw(h.unsqueeze(-1).expand(-1, -1, 5).contiguous()).mean(-1))

    assert mc.symmetry_spec(Broadcast().eval(), x).tensors["dw.weight"]

    class Concat2(_Concat):
        def forward(self, x):
            h = torch.cat([F.relu(self.a(x)), torch.tanh(self.b(x))], dim=1)
            return self.out(h)

    m2 = Concat2().eval()
    spec2 = mc.symmetry_spec(m2, x)
    offs = sorted(b.offset for b in spec2.tensors["out.weight"])
    assert offs == [0, 6]
    g = spec2.random_element(seed=0)
    torch.testing.assert_close(_logits(m2, spec2.apply(m2.state_dict(), g), x), m2(x), atol=1e-6, rtol=0)


class _Depthwise(nn.Module):
    def __init__(self, groups):
        super().__init__()
        self.c1 = nn.Conv2d(2, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=groups)
        self.gn = nn.GroupNorm(1, 8)
        self.c2 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.c2(F.relu(self.gn(self.dw(F.relu(self.c1(x)))))).mean((2, 3))


def test_depthwise_and_grouped_convolutions_keep_the_function():
    """Depthwise: every channel its own space. Grouped (groups=2; #18 — refused before): group-preserving
    permutations, each group's output channels permuted on its own, the input channels alike in every group."""
    x = torch.randn(3, 2, 5, 5)
    m = _Depthwise(groups=8).eval()
    spec = mc.symmetry_spec(m, x)
    assert len(spec.spaces) == 1 and {b.side for b in spec.tensors["dw.weight"]} == {"out"}
    g = spec.random_element(seed=4)
    torch.testing.assert_close(_logits(m, spec.apply(m.state_dict(), g), x), m(x), atol=1e-5, rtol=1e-5)
    grouped = _Depthwise(groups=2).eval()
    spec = mc.symmetry_spec(grouped, x)
    assert {b.side for b in spec.tensors["dw.weight"]} == {"in", "out"} and len(spec.spaces) == 3
    g = spec.random_element(seed=4)
    torch.testing.assert_close(_logits(grouped, spec.apply(grouped.state_dict(), g), x), grouped(x), atol=1e-5, rtol=1e-5)
    frozen = mc.symmetry_spec(grouped, x, on_unsupported="freeze")  # nothing unsupported left to freeze
    assert set(frozen.spaces) == set(spec.spaces)


def test_groupnorm_with_groups_permutes_within_each_group():
    """Refused before; now group-preserving permutations (channels within each group, as grouped convolutions)."""
    class GN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.gn, self.h = nn.Conv2d(1, 8, 3), nn.GroupNorm(2, 8), nn.Linear(8, 2)

        def forward(self, x):
            return self.h(self.gn(self.c(x)).mean((2, 3)))

    spec = mc.symmetry_spec(GN(), torch.randn(2, 1, 5, 5))
    assert sorted(s.size for s in spec.spaces.values()) == [4, 4]
    assert {b.offset for b in spec.tensors["gn.weight"]} == {0, 4}


def test_trace_does_not_mutate_model():
    model, x = make("resnet20-bn")
    model.train()
    before = digest(model.state_dict())
    mc.symmetry_spec(model, x)
    assert model.training and all(m.training for m in model.modules())
    assert digest(model.state_dict()) == before


def _handwritten_mlp():
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))


def test_validate_names_missing_and_duplicate_tensors():
    model = _handwritten_mlp()
    axes = {
        "0.weight": ("P0", None), "0.bias": ("P0",), "2.weight": ("P1", "P0"), "2.bias": ("P1",),
        "3.weight": ("P1",), "3.bias": ("P1",), "3.running_mean": ("P1",), "3.running_var": ("P1",),
        "3.num_batches_tracked": (), "5.weight": (None, "P1"), "5.bias": (None,),
    }
    spec = SymmetrySpec.from_axes({"P0": 5, "P1": 3}, axes)
    spec.validate(model)
    missing = dict(axes)
    del missing["3.running_var"]
    with pytest.raises(SpecError, match=r"3\.running_var"):
        SymmetrySpec.from_axes({"P0": 5, "P1": 3}, missing).validate(model)
    with pytest.raises(SpecError, match=r"'2\.weight' is named twice"):
        SymmetrySpec.from_axes({"P0": 5, "P1": 3}, list(axes.items()) + [("2.weight", ("P1", "P0"))])
    with pytest.raises(SpecError, match="bound twice"):
        SymmetrySpec({"P0": mc.Space("P0", 5)}, {"w": (AxisBinding(0, "P0"), AxisBinding(0, "P0"))})
    wrong = SymmetrySpec.from_axes({"P0": 4, "P1": 3}, axes)
    with pytest.raises(SpecError, match=r"'0\.weight' axis 0 has size 5 but space 'P0'"):
        wrong.validate(model)


def test_spec_from_another_architecture():
    m1, x1 = make("mlp")
    m2, x2 = make("cnn")
    spec = mc.symmetry_spec(m1, x1)
    with pytest.raises(SpecError, match="not covered by the spec"):
        spec.validate(m2)
    with pytest.raises(StateDictMismatchError, match="not in the spec"):
        spec.apply(m2.state_dict(), spec.identity())


def test_bad_elements_are_rejected():
    model, x = make("mlp")
    spec = mc.symmetry_spec(model, x)
    g = spec.random_element(seed=0)
    s = next(iter(g))
    bad = dict(g, **{s: torch.zeros_like(g[s])})
    with pytest.raises(SpecError, match="not a permutation"):
        spec.apply(model.state_dict(), bad)
    with pytest.raises(SpecError, match="missing spaces"):
        spec.apply(model.state_dict(), {})
    with pytest.raises(SpecError, match="explicit torch.Generator"):
        spec.random_element()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_apply_keeps_dtype_exactly(dtype):
    model, x = make("mlp-ln")
    spec = mc.symmetry_spec(model, x)
    sd = {k: v.to(dtype) for k, v in model.state_dict().items()}
    g = spec.random_element(seed=5)
    out = spec.apply(sd, g)
    ref = spec.apply(model.state_dict(), g)
    for k in sd:
        assert out[k].dtype == dtype
        assert torch.equal(out[k], ref[k].to(dtype))
