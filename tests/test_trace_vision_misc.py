"""Vision tracer rules for timm's ConvNeXt-V2 global response norm, BiT's GroupNorm with several groups, ECA
channel attention and EfficientFormer's per-head q/k/v split, on tiny timm builds or replicas: each traced spec keeps
the outputs of a perturbed copy (every parameter, statistic and GRN gamma/beta randomised) under a random element,
weight matching recovers a planted element, and a negative control shows what the rule binds or freezes matters."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from torch import nn

import modeconn as mc
from modeconn.errors import SpecError, TraceError, UnsupportedOperationError
from modeconn.symmetry.selfcheck import check_function_preserved
from modeconn.symmetry.trace.ops import norms

pytestmark = pytest.mark.usefixtures("one_thread")
timm = pytest.importorskip("timm")


def _convnextv2() -> nn.Module:
    from timm.models.convnext import ConvNeXt

    return ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 16, 16, 32), use_grn=True, ls_init_value=None, num_classes=5)


def _bit(groups: int = 8) -> nn.Module:
    from timm.layers import GroupNormAct
    from timm.models.resnetv2 import ResNetV2

    return ResNetV2(layers=(1, 1, 1, 1), channels=(64, 64, 128, 128), stem_chs=16, stem_type="fixed", num_classes=5,
                    norm_layer=functools.partial(GroupNormAct, num_groups=groups))


def _eca() -> nn.Module:
    from timm.models.resnet import Bottleneck, ResNet

    return ResNet(Bottleneck, layers=(1, 1, 1, 1), channels=(8, 8, 16, 16), stem_width=8, num_classes=5,
                  block_args={"attn_layer": "eca"})


def _perturbed(model: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.add_(0.2 * torch.randn(t.shape, generator=g))
    return model.eval()


def _kept_and_recovered(spec: mc.SymmetrySpec, model: nn.Module, x: torch.Tensor) -> None:
    assert check_function_preserved(spec, model, (x,), seed=7, rtol=1e-5) <= 1e-5
    sd = model.state_dict()
    g = spec.random_element(seed=3)
    res = mc.weight_matching(spec, sd, spec.apply(sd, g), restarts=1)
    assert spec.equal(res.element, spec.inverse(g))


def _unbound(spec: mc.SymmetrySpec, model: nn.Module) -> list[str]:
    sd = model.state_dict()
    return [k for k, b in spec.tensors.items() if not b and sd[k].is_floating_point()]


def test_convnextv2_global_response_norm_moves_gamma_and_beta_with_the_channels():
    torch.manual_seed(0)
    model, x = _perturbed(_convnextv2(), 1), torch.randn(2, 3, 32, 32)
    spec = mc.symmetry_spec(model, x)
    assert _unbound(spec, model) == ["head.fc.bias"]
    assert spec.tensors["stages.0.blocks.0.mlp.grn.weight"] and spec.tensors["stages.0.blocks.0.mlp.grn.bias"]
    _kept_and_recovered(spec, model, x)
    # the broken rule: GRN's gamma left in place while its channels move
    broken = dataclasses.replace(spec, tensors={**spec.tensors, "stages.0.blocks.0.mlp.grn.weight": ()})
    with pytest.raises(SpecError, match="changes its function"):
        check_function_preserved(broken, model, (x,), seed=7)


def test_bit_group_norm_admits_the_group_preserving_permutations_only(monkeypatch):
    torch.manual_seed(0)
    model, x = _perturbed(_bit(), 2), torch.randn(2, 3, 32, 32)
    spec = mc.symmetry_spec(model, x)
    assert _unbound(spec, model) == ["head.fc.bias"]
    # 8 groups: the 64-channel residual stream of stage 1 permutes within groups of 8 channels
    assert {s.size for s in spec.spaces.values()} <= {2, 4, 8, 16}
    _kept_and_recovered(spec, model, x)
    # the broken rule (channels moved across the groups): the self-check catches it
    monkeypatch.setattr(norms, "group_preserving", lambda tr, node, x, groups: x)
    with pytest.raises(SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)


def test_group_norm_over_a_space_split_differently_is_refused_or_frozen():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.g = nn.Conv2d(3, 12, 1), nn.GroupNorm(3, 12)
            self.b, self.head = nn.Conv2d(12, 12, 1, groups=4), nn.Linear(12, 2)

        def forward(self, x):  # groups of 3 channels feed the conv, groups of 4 the norm: only the identity fits both
            return self.head(self.g(self.b(self.a(x)) + self.a(x)).mean((2, 3)))

    torch.manual_seed(0)
    model, x = _perturbed(Net(), 3), torch.randn(2, 3, 4, 4)
    with pytest.raises(UnsupportedOperationError, match="cannot be split at the groups' boundaries"):
        mc.symmetry_spec(model, x)
    spec = mc.symmetry_spec(model, x, on_unsupported="freeze")
    assert not spec.tensors["g.weight"]
    assert check_function_preserved(spec, model, (x,), seed=1) <= 1e-5


def test_eca_channel_attention_freezes_the_channels_it_reads_and_keeps_the_others():
    torch.manual_seed(0)
    model, x = _perturbed(_eca(), 4), torch.randn(2, 3, 32, 32)
    with pytest.raises(UnsupportedOperationError, match="freezing would leave"):
        mc.symmetry_spec(model, x)
    spec = mc.symmetry_spec(model, x, on_unsupported="freeze")
    unbound = _unbound(spec, model)
    # the residual stream (every conv3 / downsample output, read by the ECA conv) stays put; the bottlenecks' inner
    # channels (conv1, conv2) still move
    assert {"layer1.0.bn3.weight", "layer1.0.se.conv.weight", "layer2.0.downsample.1.weight"} <= set(unbound)
    assert spec.tensors["layer1.0.conv1.weight"] and spec.tensors["layer2.0.conv2.weight"]
    _kept_and_recovered(spec, model, x)
    # the negative control: a permutation of the channels into the ECA conv does not commute with it
    eca, h = model.layer1[0].se, torch.randn(2, 32, 4, 4)
    p = torch.randperm(32, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(eca(h[:, p]), eca(h)[:, p], atol=1e-4)


class _PerHeadSplit(nn.Module):
    """EfficientFormer's attention: a fused projection reshaped to (B, N, heads, 2·key + value) and split per head."""

    def __init__(self, d: int = 12, heads: int = 2, key: int = 3, value: int = 4):
        super().__init__()
        self.heads, self.key, self.value = heads, key, value
        self.inp, self.qkv = nn.Linear(5, d), nn.Linear(d, heads * (2 * key + value))
        self.proj, self.out = nn.Linear(heads * value, d), nn.Linear(d, 3)

    def forward(self, x):
        h = self.inp(x)
        b, n, _ = h.shape
        qkv = self.qkv(h).reshape(b, n, self.heads, -1).permute(0, 2, 1, 3)
        q, k, v = qkv.split([self.key, self.key, self.value], dim=3)
        a = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.out(h + self.proj((a @ v).transpose(1, 2).reshape(b, n, -1))).mean(1)


def test_split_of_per_head_values_cuts_every_head_alike():
    torch.manual_seed(0)
    model, x = _perturbed(_PerHeadSplit(), 6), torch.randn(2, 4, 5)
    spec = mc.symmetry_spec(model, x)
    assert sorted(s.size for n, s in spec.spaces.items() if "qkv" in n) == [3, 3, 4, 4]  # per head: q/k, v
    qkv = spec.tensors["qkv.weight"]
    assert sorted(b.offset for b in qkv if b.axis == 0) == [0, 3, 6, 10, 13, 16]  # q, k, v of head 0 and of head 1
    assert {b.offset for b in spec.tensors["proj.weight"] if b.axis == 1} == {0, 4}
    _kept_and_recovered(spec, model, x)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "size", "classifier"), [("convnextv2_atto", 32, ["head.fc"]),
                                                          ("resnetv2_50x1_bit", 32, ["head.fc"]),
                                                          ("twins_pcpvt_small", 64, ["head"]),
                                                          ("twins_svt_small", 64, ["head"]),
                                                          ("hiera_tiny_224", 224, ["head.fc"]),
                                                          ("crossvit_tiny_240", 240, ["head.0", "head.1"]),
                                                          ("mobilevitv2_050", 64, ["head.fc"])])
def test_real_timm_models_are_fully_supported(name, size, classifier):
    torch.manual_seed(0)
    model, x = _perturbed(timm.create_model(name, pretrained=False, num_classes=10), 5), torch.randn(1, 3, size, size)
    spec = mc.symmetry_spec(model, x)
    assert _unbound(spec, model) == [f"{c}.bias" for c in classifier]
    _kept_and_recovered(spec, model, x)


class _PadsToPatches(nn.Module):
    """MobileViT's pattern: a branch on a size (pad only when the map is not a multiple of the patch), which torch.fx
    cannot trace symbolically."""

    def __init__(self, data_branch: bool = False):
        super().__init__()
        self.data_branch = data_branch
        self.a, self.b, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 2, stride=2), nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.shape[-1] % 2:
            h = nn.functional.pad(h, (0, 1, 0, 1))
        if self.data_branch and h.sum() > 0:  # a branch on values: never decided from the example
            h = -h
        return self.head(torch.relu(self.b(h)).mean((2, 3)))


def test_branches_on_sizes_are_traced_at_the_example_shapes():
    torch.manual_seed(0)
    model, x = _perturbed(_PadsToPatches(), 7), torch.randn(2, 3, 5, 5)
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(model)
    spec = mc.symmetry_spec(model, x)
    assert _unbound(spec, model) == ["head.bias"]
    _kept_and_recovered(spec, model, x)
    with pytest.raises(TraceError, match="could not trace"):  # the negative control: a branch on values stays refused
        mc.symmetry_spec(_PadsToPatches(data_branch=True), x)


def test_mobilevit_traces_at_the_example_shapes_with_its_unfolded_transformer():
    torch.manual_seed(0)
    model = _perturbed(timm.create_model("mobilevit_xxs", pretrained=False, num_classes=10), 8)
    x = torch.randn(1, 3, 64, 64)
    spec = mc.symmetry_spec(model, x)  # patch unfolding moves the channels through the batch axis and back
    assert _unbound(spec, model) == ["head.fc.bias"]
    _kept_and_recovered(spec, model, x)


class _CachedBiasAttention(nn.Module):
    """timm's EfficientFormer attention (per-head q/k/v split, an attention-bias gather memoised per device in eval)."""

    def __init__(self):
        super().__init__()
        from timm.models.efficientformer import Attention

        self.inp, self.attn, self.head = nn.Linear(5, 16), Attention(16, key_dim=4, num_heads=2, resolution=2), nn.Linear(16, 3)

    def forward(self, x):
        h = self.inp(x)
        return self.head(h + self.attn(h)).mean(1)


def test_memoised_attention_biases_are_recomputed_by_every_forward_of_the_check(monkeypatch):
    from modeconn.symmetry import selfcheck

    torch.manual_seed(0)
    model, x = _perturbed(_CachedBiasAttention(), 9), torch.randn(2, 4, 5)
    before = model(x)
    spec = mc.symmetry_spec(model, x)
    torch.testing.assert_close(model(x), before)  # nothing of the perturbed copies is left in the model's cache
    assert _unbound(spec, model) == ["attn.attention_biases", "head.bias"]
    _kept_and_recovered(spec, model, x)
    monkeypatch.setattr(selfcheck, "MEMO_CACHES", frozenset())  # the negative control: an unknown cache is refused
    with pytest.raises(SpecError, match="attention_bias_cache"):
        mc.symmetry_spec(model, x)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["efficientformer_l1", "efficientvit_m0", "tiny_vit_5m_224"])
def test_real_timm_models_with_memoised_attention_biases_are_supported(name):
    torch.manual_seed(0)
    model, x = _perturbed(timm.create_model(name, pretrained=False, num_classes=10), 10), torch.randn(1, 3, 224, 224)
    spec = mc.symmetry_spec(model, x)
    assert all(k.endswith(("attention_biases", "head.bias", "head_dist.bias", ".fc.bias", "head.l.bias", "head.linear.bias"))
               for k in _unbound(spec, model)), _unbound(spec, model)
    _kept_and_recovered(spec, model, x)


class _SubSampleAttention(nn.Module):
    """Twins-PCPVT's attention with one head: keys/values from a fused ``kv`` reshaped to (B, N, 2, 1, head_dim)."""

    def __init__(self):
        super().__init__()
        from timm.models.twins import GlobalSubSampleAttn

        self.embed, self.attn, self.head = nn.Conv2d(3, 16, 2, stride=2), GlobalSubSampleAttn(16, 1, sr_ratio=2), nn.Linear(16, 3)

    def forward(self, x):
        h = self.embed(x)
        size = h.shape[2:]
        h = h.flatten(2).transpose(1, 2)
        return self.head(h + self.attn(h, size)).mean(1)


def test_unbinding_per_part_values_gives_keys_and_values_their_own_spaces(monkeypatch):
    from modeconn.symmetry.trace import registry
    from modeconn.symmetry.trace.ops import indexing

    torch.manual_seed(0)
    model, x = _perturbed(_SubSampleAttention(), 11), torch.randn(2, 3, 8, 8)
    spec = mc.symmetry_spec(model, x)
    assert _unbound(spec, model) == ["head.bias"]
    assert {b.offset for b in spec.tensors["attn.kv.weight"] if b.axis == 0} == {0, 16}  # keys and values apart
    _kept_and_recovered(spec, model, x)
    real = indexing.unbind

    def swapped(tr, node, x):  # the broken rule: keys carry the values' space and values the keys'
        out = real(tr, node, x)
        return out[::-1] if isinstance(out, tuple) else out

    monkeypatch.setitem(registry.METHOD_OPS, "unbind", lambda tr, node: swapped(tr, node, tr.arg_val(node)))
    with pytest.raises(SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)


class _WindowedQKV(nn.Module):
    """Hiera's and Twins' windowed attention: one reshape splits the tokens into (windows, window) and the fused
    projection into (3, heads, head_dim); ``mix=True`` instead regroups the channels with the tokens into rows of 9
    (no symmetry: 9 does not divide the 24 channels, so a row mixes channels of different units)."""

    def __init__(self, mix: bool = False):
        super().__init__()
        self.mix, self.heads = mix, 2
        self.inp, self.qkv, self.proj, self.out = nn.Linear(5, 8), nn.Linear(8, 24), nn.Linear(8, 8), nn.Linear(8, 3)
        if mix:
            self.mixed = nn.Linear(9, 3)

    def forward(self, x):
        h = self.inp(x)
        b, n, c = h.shape
        if self.mix:
            return self.mixed(self.qkv(h).reshape(b, n * 24 // 9, 9).mean(1))
        qkv = self.qkv(h).reshape(b, 2, n // 2, 3, self.heads, c // self.heads).permute(3, 0, 4, 1, 2, 5)
        q, k, v = qkv.unbind(0)
        a = (q @ k.transpose(-2, -1)).softmax(-1) @ v  # (B, heads, windows, window, head_dim)
        a = a.permute(0, 2, 3, 1, 4).reshape(b, n, c)
        return self.out(h + self.proj(a)).mean(1)


def test_a_reshape_of_several_dim_groups_splits_the_fused_projection_per_part_and_head():
    torch.manual_seed(0)
    model, x = _perturbed(_WindowedQKV(), 12), torch.randn(2, 6, 5)
    spec = mc.symmetry_spec(model, x)
    assert _unbound(spec, model) == ["out.bias"]
    assert sorted(s.size for n, s in spec.spaces.items() if "qkv" in n) == [4, 4, 4, 4]  # 2 heads × (q/k, v)
    _kept_and_recovered(spec, model, x)
    with pytest.raises(UnsupportedOperationError, match="neither merges adjacent dims nor splits one|regroups dims"):
        mc.symmetry_spec(_perturbed(_WindowedQKV(mix=True), 12), x)  # channels regrouped with tokens: refused


class _TwoHeads(nn.Module):
    """CrossViT's ends: the class token taken with ``x[:, 0:1, ...]`` and two classifier heads stacked, then averaged."""

    def __init__(self):
        super().__init__()
        self.inp, self.a, self.b = nn.Linear(5, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.heads = nn.ModuleList([nn.Linear(8, 3), nn.Linear(8, 3)])

    def forward(self, x):
        h = self.inp(x)[:, 0:1, ...].flatten(1)
        return torch.stack([self.heads[0](torch.relu(self.a(h))), self.heads[1](torch.relu(self.b(h)))]).mean(0)


def test_stacked_heads_share_their_output_space_and_ellipsis_indexing_keeps_the_channels(monkeypatch):
    from modeconn.symmetry.trace import registry

    torch.manual_seed(0)
    model, x = _perturbed(_TwoHeads(), 13), torch.randn(2, 4, 5)
    spec = mc.symmetry_spec(model, x)
    assert _unbound(spec, model) == ["heads.0.bias", "heads.1.bias"]
    assert spec.tensors["inp.weight"] and spec.tensors["a.weight"]
    _kept_and_recovered(spec, model, x)
    # the broken rule: stacked values keep separate spaces (the mean over the stack mixes them)
    monkeypatch.setitem(registry.FUNCTION_OPS, torch.stack, lambda tr, node: tr.value(node.args[0][0]).remap(
        lambda d: d + 1, 3))
    with pytest.raises(SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)


class _LinearSelfAttention(nn.Module):
    """MobileViT-v2's separable attention: a one-channel query's softmax scores broadcast over the key channels."""

    def __init__(self):
        super().__init__()
        from timm.models.mobilevit import LinearSelfAttention

        self.inp, self.attn, self.head = nn.Conv2d(3, 8, 1), LinearSelfAttention(8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.inp(x)
        return self.head((h + self.attn(h)).mean((2, 3)))


def test_a_one_channel_operand_broadcasts_over_the_channels_it_multiplies():
    torch.manual_seed(0)
    model, x = _perturbed(_LinearSelfAttention(), 14), torch.randn(2, 3, 4, 6)
    spec = mc.symmetry_spec(model, x)
    assert _unbound(spec, model) == ["head.bias"]
    assert {b.offset for b in spec.tensors["attn.qkv_proj.weight"] if b.axis == 0} == {0, 1, 9}  # query (one unit), key, value
    _kept_and_recovered(spec, model, x)
