"""Rotary position embeddings in timm's EVA02 and DINOv3: the rotation pins the query/key dims of every head (a
permutation of them would change which angle rotates which dim), so the tracer freezes them and keeps the value
spaces per head. Each model is traced with the self-check on, a random element keeps the outputs of a perturbed
copy, weight matching recovers a planted element; negative controls: a within-head swap of query/key dims changes
the outputs, and a rotary rule that forgets to freeze them is caught by the self-check."""

from __future__ import annotations

import pytest
import torch

import modeconn as mc
from spec_checks import assert_kept_and_recovered
from modeconn.errors import SpecError
from modeconn.experiments.zoo import frozen_writers
from modeconn.symmetry.selfcheck import perturbed_state
from modeconn.symmetry.trace import library

timm = pytest.importorskip("timm")

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {  # reduced configurations of the real definitions (2 heads of 16): (kwargs, input size)
    "eva02_tiny_patch14_224": (dict(img_size=28, depth=2, embed_dim=32, num_heads=2), 28),
    "vit_small_patch16_dinov3": (dict(img_size=32, depth=2, embed_dim=32, num_heads=2), 32),
}
QKV = "blocks.0.attn.qkv"


def _perturbed(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Perturbed norm affines, biases and weights (the timm init leaves tiny logits), loaded into ``model``."""
    keys = model.state_dict().keys()
    sd = {k: v for k, v in perturbed_state(model, torch.Generator().manual_seed(3)).items() if k in keys}
    model.load_state_dict(sd)
    return sd


def _build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model with weights of a trained model's scale: timm's initialisation leaves the attention logits so small
    that the softmax is uniform and no permutation of queries and keys could change the outputs."""
    torch.manual_seed(0)
    kwargs, size = SMALL[name]
    model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5 * (4 if "qkv" in key else 1))
    return model, torch.randn(2, 3, size, size)


@pytest.mark.parametrize("name", list(SMALL))
def test_rotary_models_keep_value_heads_and_fix_query_key_dims(name):
    model, x = _build(name)
    spec = mc.symmetry_spec(model, x)
    assert frozen_writers(spec, model) == ["head"]
    rows = sorted((b.offset, spec.spaces[b.space].size) for b in spec.tensors[f"{QKV}.weight"] if b.side == "out")
    assert rows == [(64, 16), (80, 16)]  # the value rows of each head; query (0–31) and key (32–63) rows fixed
    assert_kept_and_recovered(spec, model, x, _perturbed(model))


@pytest.mark.parametrize("name", list(SMALL))
def test_a_within_head_swap_of_query_key_dims_changes_the_outputs(name):
    model, x = _build(name)
    _perturbed(model)
    with torch.no_grad():
        ref = model(x)
        w = model.get_submodule(QKV).weight
        for r, s in ((0, 2), (32, 34)):  # query dims 0 ↔ 2 of head 0 and the same key dims: q·k kept without rotary
            w[[r, s]] = w[[s, r]]
        assert not torch.allclose(model(x), ref, rtol=1e-3, atol=1e-4)
        for r, s in ((0, 2), (32, 34)):  # back, then value dims 0 ↔ 2 of head 0 and the projection's inputs: kept
            w[[r, s]] = w[[s, r]]
        w[[64, 66]] = w[[66, 64]]
        proj = model.get_submodule("blocks.0.attn.proj").weight
        proj[:, [0, 2]] = proj[:, [2, 0]]
        bias = getattr(model.get_submodule("blocks.0.attn"), "v_bias", None)
        if bias is not None:
            bias[[0, 2]] = bias[[2, 0]]
        torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(SMALL))
def test_a_rotary_rule_that_does_not_fix_query_key_dims_is_caught(name, monkeypatch):
    model, x = _build(name)
    rules = dict(library._LIBRARY["timm.layers.pos_embed_sincos"])
    rules["apply_rot_embed_cat"] = lambda tr, node: tr.value(node.args[0])  # passes q/k spaces through the rotation
    monkeypatch.setitem(library._LIBRARY, "timm.layers.pos_embed_sincos", rules)
    with pytest.raises(SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)


def _stock(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model at timm's own initialisation (attention weights of std 0.02), as `pretrained=False` builds it."""
    torch.manual_seed(0)
    kwargs, size = SMALL[name]
    return timm.create_model(name, pretrained=False, num_classes=10, **kwargs).eval(), torch.randn(2, 3, size, size)


def _broken_rotary(monkeypatch) -> None:
    rules = dict(library._LIBRARY["timm.layers.pos_embed_sincos"])
    rules["apply_rot_embed_cat"] = lambda tr, node: tr.value(node.args[0])  # passes q/k spaces through the rotation
    monkeypatch.setitem(library._LIBRARY, "timm.layers.pos_embed_sincos", rules)


@pytest.mark.parametrize("name", list(SMALL))
def test_the_self_check_sees_a_wrong_query_key_binding_at_stock_initialisation(name, monkeypatch):
    """The self-check's perturbed state scales weight matrices up to unit gain, so a wrong query/key binding changes
    the outputs even where the model's own small initialisation makes the softmax uniform; without that scaling the
    same broken rule goes unnoticed (the negative control)."""
    from modeconn.symmetry import selfcheck

    model, x = _stock(name)
    _broken_rotary(monkeypatch)
    with pytest.raises(SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)
    monkeypatch.setattr(selfcheck, "_unit_gain", lambda name, w: w)
    mc.symmetry_spec(model, x)  # blind without it
