"""Real torchvision and timm model definitions through modeconn (issue #18): the quick zoo experiment, and the
rules it relies on (fused q/k/v splits, Swin's wrapped attention, REPAIR inside norm+activation modules), each
with a deliberately broken variant that the self-check or the statistics catch."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import modeconn as mc
from modeconn.errors import SpecError
from modeconn.experiments.zoo import MODELS, SIZES
from modeconn.path.repair import channel_stats
from modeconn.symmetry.trace import _Tracer

from cli_runner import run_cli
from repair_check import assert_repaired, trained_like_norms

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.experiment
@pytest.mark.slow
def test_quick_zoo_supports_the_reduced_torchvision_and_timm_models(tmp_path):
    run_cli("experiment", "zoo", "--quick", "--out", tmp_path / "zoo")
    r = json.loads((tmp_path / "zoo" / "results.json").read_text())
    assert list(r["models"]) == list(SIZES["quick"].models)
    for name, row in r["models"].items():
        assert row["status"] != "refused", (name, row)
        assert row["function_rel_err"] <= 1e-5 and row["planted_recovered"], (name, row)
        assert len(row["frozen_writers"]) == 1, (name, row["frozen_writers"])  # the classifier only
        if name.startswith("swin"):  # a bias-free linear writes the residual stream: no place to fold a shift
            assert row["status"] == "partial" and "features.2.reduction" in row["repair"]
        else:
            assert row["status"] == "supported", (name, row)
    assert "14 of 15 supported" in (tmp_path / "zoo" / "report.md").read_text()


def _perturbed(model: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.add_(0.1 * torch.randn(t.shape, generator=g))
    return model.eval()


def test_timm_vit_fused_qkv_gets_per_head_query_key_and_value_spaces():
    model = MODELS["timm/vit (2 layers × 32)"][0]().eval()
    spec = mc.symmetry_spec(model, torch.randn(2, 3, 32, 32))
    sizes = [s.size for s in spec.spaces.values()]
    # per block and head (2 blocks × 2 heads of 16): one query/key space and one value space
    assert sizes.count(16) == 2 * 2 * 2
    qkv = spec.tensors["blocks.0.attn.qkv.weight"]
    assert sorted(b.offset for b in qkv if b.axis == 0) == [0, 16, 32, 48, 64, 80]
    q_head0 = next(b.space for b in qkv if b.axis == 0 and b.offset == 0)
    k_head0 = next(b.space for b in qkv if b.axis == 0 and b.offset == 32)
    v_head0 = next(b.space for b in qkv if b.axis == 0 and b.offset == 64)
    assert q_head0 == k_head0 != v_head0


@pytest.mark.parametrize("name", ["vit (2 layers × 32)", "swin (2 stages × 16)"])
def test_attention_rule_that_forgets_the_qkv_bias_is_caught_by_the_self_check(name, monkeypatch):
    model = _perturbed(MODELS[name][0](), 0)
    x = torch.randn(2, 3, 32, 32)
    mc.symmetry_spec(model, x)  # the real rule passes
    real = _Tracer.fused_self_attention

    def broken(self, node, mod_name, x, h, qkv, proj):
        return real(self, node, mod_name, x, h, (qkv[0], None), proj)

    monkeypatch.setattr(_Tracer, "fused_self_attention", broken)
    with pytest.raises(SpecError, match=r"changes its function.*qk\[0\]"):
        mc.symmetry_spec(model, x)


class _ChunkedAttention(nn.Module):
    """A fused projection split with ``chunk`` along features, heads by ``unflatten``, ``scaled_dot_product_attention``."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.heads, self.qkv, self.proj, self.norm = heads, nn.Linear(d, 3 * d), nn.Linear(d, d), nn.LayerNorm(d)
        self.inp, self.out = nn.Linear(4, d), nn.Linear(d, 3)

    def forward(self, x):
        h = self.inp(x)
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        return self.out(h + self.proj(a)).mean(1)


def test_chunked_qkv_projection_keeps_the_function_on_a_perturbed_copy():
    torch.manual_seed(0)
    model = _perturbed(_ChunkedAttention(), 1)
    spec = mc.symmetry_spec(model, torch.randn(2, 5, 4))
    assert sum(s.size == 8 for s in spec.spaces.values()) == 4  # 2 heads × (query/key, value)


def _bn_act_net(seed: int) -> nn.Module:
    from timm.layers import BatchNormAct2d

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), BatchNormAct2d(8, act_layer=nn.SiLU),
                        nn.Conv2d(8, 8, 3, padding=1, bias=False), BatchNormAct2d(8, act_layer=nn.ReLU),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    return trained_like_norms(net)


def test_repair_inside_timm_batchnorm_act_corrects_the_statistics_before_the_activation():
    spec = mc.symmetry_spec(_bn_act_net(0), torch.randn(2, 3, 8, 8))
    assert spec.repair_points == (("1", 1, "1.drop"), ("3", 1, "3.drop"))
    merged, seen = assert_repaired(_bn_act_net, spec, (3, 8, 8), 5)
    # the broken variant: statistics read after the activation are not what REPAIR set
    after = channel_stats(merged, [("1", 1)], seen["batches"])
    assert not torch.allclose(after["1"][0], seen["targets"]["1"][0], atol=2e-3)


def _timm_layer_net() -> nn.Module:
    """timm's own layers: ``ScaledStdConv2d`` (per-output gain), ``GroupNorm1`` (F.group_norm with one group), ResMLP's
    ``Affine`` (addcmul), BEiT-free token mixing as in MLP-Mixer."""
    from timm.layers import GroupNorm1, ScaledStdConv2d
    from timm.models.mlp_mixer import Affine

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = ScaledStdConv2d(3, 8, 3, padding=1), GroupNorm1(8)
            self.affine, self.fc, self.head = Affine(8), nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x):
            x = self.norm(torch.relu(self.conv(x))).flatten(2).transpose(1, 2)
            return self.head(self.fc(self.affine(x)).mean(1))
    return Net().eval()


def test_timm_layers_scaled_std_conv_group_norm1_and_affine_are_bound():
    torch.manual_seed(0)
    model = _perturbed(_timm_layer_net(), 2)
    spec = mc.symmetry_spec(model, torch.randn(2, 3, 6, 6))
    sd = model.state_dict()
    unbound = [k for k, b in spec.tensors.items() if not b and sd[k].is_floating_point()]
    assert unbound == ["head.bias"]
    assert {"conv.gain", "norm.weight", "affine.alpha", "affine.beta"} <= {k for k, b in spec.tensors.items() if b}


def test_beit_concatenated_qkv_bias_binds_its_parts_and_a_non_constant_buffer_part_stays_fixed():
    model = _perturbed(MODELS["timm/beit (2 layers × 32)"][0](), 3)
    x = torch.randn(2, 3, 32, 32)
    spec = mc.symmetry_spec(model, x)
    assert spec.tensors["blocks.0.attn.q_bias"] and spec.tensors["blocks.0.attn.v_bias"]
    assert "blocks.0.attn.k_bias" not in spec.tensors  # a zero buffer outside the state dict: constant, needs no binding
    n_qk = sum(".qkv" in name and s.size == 16 for name, s in spec.spaces.items())
    for block in model.blocks:  # k_bias no longer constant: the key part (so the query/key heads) must stay fixed
        block.attn.k_bias.normal_()
    spec2 = mc.symmetry_spec(model, x)  # the self-check passes: nothing that moves reads the changed buffer
    assert sum(".qkv" in name and s.size == 16 for name, s in spec2.spaces.items()) < n_qk
