"""The tracer's rules for what the vision zoo uses (#18), on core-torch replicas (tests/zoo_like.py): each model is
traced with the self-check on, a random element keeps the outputs of a perturbed copy, weight matching recovers a
planted element, and a negative control shows what the rule binds matters."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import zoo_like
from torch import nn

import modeconn as mc
from modeconn.errors import ConfigError, UnsupportedOperationError
from modeconn.symmetry import trace as trace_mod
from modeconn.symmetry.selfcheck import check_function_preserved

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = {
    "vit": (zoo_like.ViT, (2, 3, 8, 8)),
    "resnext": (zoo_like.ResNeXt, (2, 3, 8, 8)),
    "sdpa": (zoo_like.SDPAttention, (2, 5, 6)),
    "convnext-like": (zoo_like.ConvNeXtLike, (2, 3, 8, 8)),
    "split-and-slice": (zoo_like.SplitScales, (2, 3, 8, 8)),
    "dual-path": (zoo_like.DualPath, (2, 3, 8, 8)),
    "split-attention": (zoo_like.SplitAttention, (2, 3, 8, 8)),
    "ghost-residual": (zoo_like.GhostResidual, (2, 3, 8, 8)),
    "shared-and-padded": (zoo_like.SharedAndPadded, (2, 3, 8, 8)),
    "windows": (zoo_like.WindowBlock, (2, 3, 8, 8)),
}


def _register_drop_rows(monkeypatch):
    monkeypatch.setattr(trace_mod, "ELEMENTWISE_RULES", set(trace_mod.ELEMENTWISE_RULES))
    mc.symmetry.register_rule(zoo_like.drop_rows, "elementwise")


@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_patterns_are_traced_bound_and_recovered(name, monkeypatch):
    _register_drop_rows(monkeypatch)
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model, x = cls().eval(), torch.randn(*shape)
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    unbound = [k for k, b in spec.tensors.items() if not b and sd[k].is_floating_point()]
    assert len(unbound) == 1 and unbound[0].endswith(".bias")  # the classifier's bias only: nothing frozen
    assert check_function_preserved(spec, model, (x,), seed=7, rtol=1e-5) <= 1e-5
    g = spec.random_element(seed=3)
    res = mc.weight_matching(spec, sd, spec.apply(sd, g), restarts=1)
    assert spec.equal(res.element, spec.inverse(g))


def test_multihead_attention_value_heads_must_follow_out_proj(monkeypatch):
    """Negative control: the attention's value rows permuted without out_proj's columns change the output."""
    _register_drop_rows(monkeypatch)
    torch.manual_seed(0)
    model, x = zoo_like.ViT().eval(), torch.randn(2, 3, 8, 8)
    spec = mc.symmetry_spec(model, x, check=False)
    vo = next(s for s in spec.spaces if ".vo" in s)
    g = spec.identity() | {vo: torch.roll(torch.arange(spec.spaces[vo].size), 1)}
    sd = model.state_dict()
    broken = dict(spec.tensors)
    broken["layers.0.self_attention.out_proj.weight"] = tuple(
        b for b in broken["layers.0.self_attention.out_proj.weight"] if b.space != vo)
    wrong = dataclasses.replace(spec, tensors=broken)
    moved = zoo_like.ViT().eval()
    moved.load_state_dict(wrong.apply(sd, g))
    right = zoo_like.ViT().eval()
    right.load_state_dict(spec.apply(sd, g))
    with torch.no_grad():
        assert (moved(x) - model(x)).abs().max() > 1e-4 and (right(x) - model(x)).abs().max() < 1e-5


def test_unregistered_elementwise_op_names_its_module_and_register_rule_checks_its_input(monkeypatch):
    monkeypatch.setattr(trace_mod, "ELEMENTWISE_RULES", set())
    with pytest.raises(UnsupportedOperationError, match=r"drop_rows in module 'layers\.0' \(EncoderBlock\).*freezing "
                                                        r"would leave \d+ of \d+ writer layers"):
        mc.symmetry_spec(zoo_like.ViT().eval(), torch.randn(2, 3, 8, 8))
    with pytest.raises(ConfigError, match="rule must be"):
        mc.symmetry.register_rule(nn.GELU, nn.Linear)  # not a subclass of the rule's layer


def test_cross_attention_is_refused():
    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(4, 8)
            self.att, self.head = nn.MultiheadAttention(8, 2, batch_first=True), nn.Linear(8, 2)

        def forward(self, x):
            q, kv = self.a(x), self.b(x)
            return self.head(self.att(q, kv, kv)[0].mean(1))

    with pytest.raises(UnsupportedOperationError, match="cross-attention"):
        mc.symmetry_spec(Cross(), torch.randn(2, 3, 4))


def test_models_in_training_mode_are_traced_in_eval_mode_and_keep_their_flags():
    """A BatchNorm subclass with its own forward is traced as in eval (no running-stat update in the graph)."""
    torch.manual_seed(0)
    model, x = zoo_like.ConvNeXtLike().train(), torch.randn(2, 3, 8, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    spec = mc.symmetry_spec(model, x)
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert {b.space for b in spec.tensors["gamma"]} == {b.space for b in spec.tensors["bn.running_var"]}


def test_a_parameter_read_where_it_cannot_move_is_an_error_not_a_silent_freeze():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.g, self.head = nn.Linear(4, 6), nn.Parameter(torch.rand(6) + 0.5), nn.Linear(6, 2)

        def forward(self, x):
            return self.head(self.fc(x) * self.g + self.g.sum())

    with pytest.raises(UnsupportedOperationError, match="'g' moves with a permuted space"):
        mc.symmetry_spec(Scale(), torch.randn(3, 4))
    spec = mc.symmetry_spec(Scale(), torch.randn(3, 4), on_unsupported="freeze")
    assert not spec.tensors["g"]


def test_token_mixing_linears_pass_the_channel_spaces_through():
    torch.manual_seed(0)
    model, x = zoo_like.MixerBlock().eval(), torch.randn(2, 3, 8, 8)
    spec = mc.symmetry_spec(model, x)
    assert not spec.tensors["tok1.weight"] and not spec.tensors["tok2.bias"]  # they mix tokens, not features
    assert spec.tensors["ch1.weight"] and spec.tensors["norm1.weight"]
    assert check_function_preserved(spec, model, (x,), seed=7, rtol=1e-5) <= 1e-5


def test_slices_that_cut_one_space_inconsistently_are_refused():
    class Cut(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1)

        def forward(self, x):
            h = self.a(x)
            return self.b(torch.cat([h[:, :2], h[:, 1:3]], 1))  # overlapping slices: no split of h's space fits both

    with pytest.raises(UnsupportedOperationError, match="range of whole spaces"):
        mc.symmetry_spec(Cut().eval(), torch.randn(1, 3, 4, 4))


def test_extra_per_output_parameters_of_a_conv_subclass_are_bound(monkeypatch):
    class GainConv(nn.Conv2d):  # timm's ScaledStdConv2d pattern: a learned gain per output channel
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.gain = nn.Parameter(torch.ones(self.out_channels, 1, 1, 1))

        def forward(self, x):
            return nn.functional.conv2d(x, self.weight * self.gain, self.bias, self.stride, self.padding, 1, self.groups)

    model = nn.Sequential(GainConv(3, 4, 3, padding=1), nn.ReLU(), GainConv(4, 4, 1, groups=2), nn.ReLU(),
                          GainConv(4, 4, 1, groups=4), nn.Flatten(), nn.Linear(64, 2))  # plain, grouped, depthwise
    x = torch.randn(2, 3, 4, 4)
    with pytest.raises(mc.errors.SpecError, match=r"module '0' \(GainConv\) subclasses .*Conv2d with a forward of its own"):
        mc.symmetry_spec(model.eval(), x)  # a layer subclass with its own forward is never trusted unregistered
    monkeypatch.setattr(trace_mod, "MODULE_RULES", dict(trace_mod.MODULE_RULES))
    mc.symmetry.register_rule(GainConv, nn.Conv2d)
    spec = mc.symmetry_spec(model.eval(), x)
    assert spec.tensors["0.gain"] and spec.tensors["2.gain"] and spec.tensors["4.gain"]
    monkeypatch.setattr(trace_mod._Tracer, "output_parameters", lambda self, name, n: [f"{name}.weight", f"{name}.bias"])
    with pytest.raises(mc.errors.SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)


def test_softmax_across_heads_must_join_their_spaces(monkeypatch):
    class RadixSoftmax(nn.Module):  # a softmax over the axis indexing per-head spaces is all that ties the heads
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 2)

        def forward(self, x):
            return self.b(self.a(x).view(-1, 2, 3).softmax(dim=1).flatten(1))

    torch.manual_seed(0)
    model, x = RadixSoftmax().eval(), torch.randn(5, 4)
    spec = mc.symmetry_spec(model, x)
    assert len(spec.spaces) == 1  # the two heads joined: one permutation of 3
    monkeypatch.setattr(trace_mod._Tracer, "join_heads", lambda self, node, v: True)  # the broken variant
    with pytest.raises(mc.errors.SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)


def test_operands_whose_layouts_do_not_refine_to_one_are_refused_not_silently_frozen():
    class FlatPlusLinear(nn.Module):  # a flattened conv (units of 4 entries) added to a linear's output (units of 1)
        def __init__(self):
            super().__init__()
            self.c, self.lin, self.head = nn.Conv2d(3, 2, 1), nn.Linear(5, 8), nn.Linear(8, 2)

        def forward(self, x, y):
            return self.head(self.c(x).flatten(1) + self.lin(y))

    args = (torch.randn(2, 3, 2, 2), torch.randn(2, 5))
    with pytest.raises(UnsupportedOperationError, match="do not refine to one"):
        mc.symmetry_spec(FlatPlusLinear().eval(), args)
    spec = mc.symmetry_spec(FlatPlusLinear().eval(), args, on_unsupported="freeze")
    assert not spec.spaces
