"""Attention whose intermediate values are permuted along two dims, and reshapes that move channels through the batch
axis, on timm's own layers in small networks: DaViT's channel attention (``(kᵀ v)`` softmaxed, then contracted with
qᵀ), EfficientViT's ReLU linear attention (``q (kᵀ v)``, a column of ones padded to v, grouped convolutions over q,
k and v inside the heads), LambdaNet's content and position lambdas (``kᵀ v``, a Conv3d across the value dims),
HaloNet's blocked key/value windows (heads and blocks merged into the batch axis), MobileViT's patch unfolding
(channels into the batch axis and back) and EfficientFormer-V2's talking heads. Each is traced with the self-check
on, a random element keeps the outputs of a perturbed copy and weight matching recovers a planted element; negative
controls show that rules leaving q and k unjoined, taking the channels out of the batch axis wrongly or padding v on
the wrong side are caught."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import modeconn as mc
from spec_checks import assert_kept_and_recovered
from modeconn.errors import SpecError, TraceError
from modeconn.experiments.zoo import frozen_writers
from modeconn.symmetry.selfcheck import perturbed_state
from modeconn.symmetry.trace.ops import attention, elementwise, reshape

timm = pytest.importorskip("timm")
from timm.layers.halo_attn import HaloAttn  # noqa: E402
from timm.layers.lambda_layer import LambdaLayer  # noqa: E402
from timm.models.davit import ChannelBlock  # noqa: E402
from timm.models.efficientformer_v2 import Attention2d  # noqa: E402
from timm.models.efficientvit_mit import LiteMLA  # noqa: E402
from timm.models.mobilevit import MobileVitBlock  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class _Net(nn.Module):
    """A conv stem with BatchNorm, the layer under test, spatial mean and a linear classifier."""

    def __init__(self, layer: nn.Module, c: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.layer = layer
        self.head = nn.Linear(c, 5)

    def forward(self, x):
        return self.head(self.layer(self.stem(x)).mean((2, 3)))


LAYERS = {  # name: (the layer, input size, tensors left unbound besides the classifier's bias)
    "davit": (lambda: ChannelBlock(16, num_heads=2, mlp_ratio=2), 8, []),
    "lambda": (lambda: LambdaLayer(16, num_heads=2, dim_head=4, r=3), 8, []),
    "efficientvit": (lambda: LiteMLA(16, 16, dim=4, scales=(3,)), 8, []),
    "halo": (lambda: HaloAttn(16, num_heads=2, dim_head=4, block_size=4, halo_size=1), 8, []),
    "mobilevit": (lambda: MobileVitBlock(16, 16, transformer_dim=8, transformer_depth=1, patch_size=2, num_heads=2),
                  8, []),
    # the talking-head convolution's outputs index heads, as the attention biases do: within-head permutations never
    # move them (exchanging whole heads is not modelled)
    "efficientformerv2": (lambda: Attention2d(16, key_dim=4, num_heads=2, attn_ratio=2, resolution=4), 4,
                          ["layer.attention_biases", "layer.talking_head2.bias"]),
}


def _build(name: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer, size, _ = LAYERS[name]
    model = _Net(layer()).eval()
    model.load_state_dict(perturbed_state(model, torch.Generator().manual_seed(3)))
    return model, torch.randn(2, 3, size, size)


@pytest.mark.parametrize("name", list(LAYERS))
def test_two_dim_products_and_batch_reshapes_are_traced_kept_and_recovered(name):
    model, x = _build(name)
    spec = mc.symmetry_spec(model, x)  # the self-check: a random element on a perturbed copy
    sd = model.state_dict()
    unbound = [k for k, b in spec.tensors.items() if not b and sd[k].is_floating_point()]
    assert sorted(unbound) == sorted([*LAYERS[name][2], "head.bias"])
    assert set(frozen_writers(spec, model)) == {"head"} | ({"layer.talking_head2"} if name == "efficientformerv2" else set())
    assert_kept_and_recovered(spec, model, x, sd)


def test_channel_attention_joins_queries_with_values_and_carries_the_keys():
    """DaViT: ``softmax(kᵀ v) qᵀ`` contracts the value dims with the query dims; the key dims reach the output."""
    model, x = _build("davit")
    spec = mc.symmetry_spec(model, x)
    d = 8  # per head: 16 channels, 2 heads
    rows = {b.offset: b.space for b in spec.tensors["layer.attn.qkv.weight"] if b.side == "out"}
    q, k, v = ([rows[p * 16 + h * d] for h in range(2)] for p in range(3))
    assert q == v and not set(k) & set(q)
    assert {b.space for b in spec.tensors["layer.attn.proj.weight"] if b.side == "in"} == set(k)


@pytest.mark.parametrize("name", ["davit", "lambda", "efficientvit"])
def test_a_product_rule_that_leaves_the_contracted_dims_unjoined_is_caught(name, monkeypatch):
    model, x = _build(name)
    monkeypatch.setattr(attention, "contract", lambda *a: True)  # q permuted apart from k (davit: from v)
    with pytest.raises(SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)


def _first_part(found):  # the units read from the first part (the samples) instead of the one carrying them
    return (0, found[1])


def _heads_reversed(found):  # the heads' layouts handed back in the wrong order
    return (found[0], found[1][::-1])


@pytest.mark.parametrize(("name", "broken"), [("mobilevit", _first_part), ("halo", _heads_reversed)])
def test_a_reshape_rule_that_takes_the_channels_out_of_the_batch_axis_wrongly_is_caught(name, broken, monkeypatch):
    model, x = _build(name)
    real = reshape.unit_part
    monkeypatch.setattr(reshape, "unit_part", lambda x, sizes: None if real(x, sizes) is None else broken(real(x, sizes)))
    with pytest.raises((SpecError, TraceError)):
        mc.symmetry_spec(model, x)


def test_a_pad_rule_that_puts_the_ones_column_on_the_wrong_side_is_caught(monkeypatch):
    model, x = _build("efficientvit")
    real = elementwise.padded_units
    monkeypatch.setattr(elementwise, "padded_units", lambda tr, node, v, before, after: real(tr, node, v, after, before))
    with pytest.raises((SpecError, TraceError)):
        mc.symmetry_spec(model, x)


def test_talking_head_outputs_move_no_channel_and_exchanging_two_changes_the_outputs():
    model, x = _build("efficientformerv2")
    spec = mc.symmetry_spec(model, x)
    assert not [b for b in spec.tensors["layer.talking_head2.weight"] if b.side == "out"]
    with torch.no_grad():
        ref = model(x)
        for p in (model.layer.talking_head2.weight, model.layer.talking_head2.bias):
            p[[0, 1]] = p[[1, 0]]
        assert not torch.allclose(model(x), ref, rtol=1e-3, atol=1e-4)
