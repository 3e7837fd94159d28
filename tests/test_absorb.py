"""Normalization absorption: function preservation, untouched input, the orthogonal residual symmetry it exposes."""

from __future__ import annotations

import pytest
import torch
from hf_tiny import digest, loaded, make, max_diff, outputs
from torch import nn

import modeconn as mc
from modeconn.errors import ConfigError, SpecError, UnsupportedOperationError
from modeconn.symmetry import absorb as absorb_mod
from modeconn.symmetry import hf
from modeconn.symmetry.absorb import AbsorptionError, load_absorbed, save_absorbed
from modeconn.symmetry.groups import GROUPS

pytestmark = pytest.mark.usefixtures("one_thread")
ABSORBABLE = ["gpt_neox", "gpt_neox_seq", "gpt2", "llama", "llama_tied_mqa", "vit"]


def _tol(ref: dict) -> float:
    return 1e-5 * max(1.0, max(float(v.abs().max()) for v in ref.values()))


@pytest.mark.parametrize("name", ABSORBABLE)
def test_absorption_preserves_outputs_and_leaves_input_untouched(name):
    model = make(name)
    before = digest(model)
    x = hf.example_inputs(model)
    ref = outputs(model, x)
    absorbed = mc.absorb_normalization(model)
    assert digest(model) == before, "absorb_normalization modified its input"
    assert absorbed is not model
    assert max_diff(ref, outputs(absorbed, x)) <= _tol(ref)
    x2 = hf.example_inputs(model, torch.Generator().manual_seed(9))  # not the input the code path checked on
    assert max_diff(outputs(model, x2), outputs(absorbed, x2)) <= _tol(outputs(model, x2))
    norms = [m for m in absorbed.modules() if isinstance(m, nn.LayerNorm) or hasattr(m, "variance_epsilon")]
    assert not norms and any(isinstance(m, hf.ScaleFreeRMSNorm) for m in absorbed.modules())
    assert absorbed.config.tie_word_embeddings is False
    assert absorbed.config.modeconn_absorbed["norms"]


def _rotate(spec, sd, q):
    """Rotate every residual binding by the orthogonal q by hand (out side: Q·v; in side: Q^{-T}·v = Q·v)."""
    out = dict(sd)
    for key, b in spec.bindings_by_space["residual"]:
        t = out[key]
        x = t.movedim(b.axis, 0)
        out[key] = (q @ x.reshape(q.shape[0], -1)).reshape(x.shape).movedim(0, b.axis)
    return out


def _haar(n, seed):
    z = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    qm, r = torch.linalg.qr(z)
    return (qm * torch.sign(torch.diagonal(r))).float()


@pytest.mark.parametrize("name", ABSORBABLE)
def test_orthogonal_residual_symmetry_after_absorption(name):
    model = make(name)
    absorbed = mc.absorb_normalization(model)
    x = hf.example_inputs(model)
    ref = outputs(absorbed, x)
    spec = mc.symmetry_spec(absorbed)  # permutation spec of the absorbed model: norms carry no parameters now
    spec.validate(absorbed)
    assert not any("norm" in k or ".ln_" in k for k in spec.tensors)
    q = _haar(spec.spaces["residual"].size, seed=4)
    rotated = _rotate(spec, absorbed.state_dict(), q)
    assert max_diff(ref, outputs(loaded(absorbed, rotated), x)) < 1e-4
    # negative control: the same rotation of the original (LayerNorm/RMSNorm with scales) breaks it
    spec0 = mc.symmetry_spec(model)
    broken = _rotate(spec0, model.state_dict(), q)
    assert max_diff(outputs(model, x), outputs(loaded(model, broken), x)) > 1e-3
    # the spec builder binds the residual stream to the registered orthogonal group once absorbed
    if "orthogonal" in GROUPS:
        spec_o = hf.hf_symmetry_spec(absorbed, groups={"residual": "orthogonal"})
        g = spec_o.identity() | {"residual": q}
        sd_o = spec_o.apply(absorbed.state_dict(), g)
        assert max_diff(ref, outputs(loaded(absorbed, sd_o), x)) < 1e-4
        assert all(torch.allclose(sd_o[k], rotated[k], atol=1e-5) for k in rotated)
        g = spec_o.random_element(seed=1)
        assert max_diff(ref, outputs(loaded(absorbed, spec_o.apply(absorbed.state_dict(), g)), x)) < 1e-4
        with pytest.raises(SpecError, match="absorb_normalization"):
            hf.hf_symmetry_spec(model, groups={"residual": "orthogonal"})


@pytest.mark.parametrize("name", ABSORBABLE)
def test_full_transformer_symmetry_group_after_absorption(name):
    """The LMC-DM group (METHODS §3): orthogonal residual, head permutation with per-head invertible QK (RoPE
    pairs: scaled rotations) and OV maps, FFN permutation, GLU scaling — all at once on the absorbed model."""
    model = make(name)
    absorbed = mc.absorb_normalization(model)
    groups = {"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible", "vo": "head_invertible"}
    if name.startswith("llama"):
        groups["ffn_scale"] = "scaling"
    spec = hf.hf_symmetry_spec(absorbed, groups=groups)
    x = hf.example_inputs(model)
    ref = outputs(model, x)
    sd_g = spec.apply(absorbed.state_dict(), spec.random_element(seed=2))
    assert max_diff(ref, outputs(loaded(absorbed, sd_g), x)) < 1e-4


def test_bert_and_base_models_are_refused_with_the_reason():
    with pytest.raises(UnsupportedOperationError, match="post-LN"):
        mc.absorb_normalization(make("bert_cls"))
    with pytest.raises(UnsupportedOperationError, match="model output"):
        mc.absorb_normalization(make("vit_base"))
    absorbed = mc.absorb_normalization(make("gpt2"))
    with pytest.raises(UnsupportedOperationError, match="already absorbed"):
        mc.absorb_normalization(absorbed)


def test_a_step_that_changes_the_function_is_caught(monkeypatch):
    real = absorb_mod._center

    def bad_center(root, st, note):
        real(root, st, note)
        w = absorb_mod._param(root, st.stream.writers[-1].key)
        with torch.no_grad():
            w.mul_(1.5)

    monkeypatch.setattr(absorb_mod, "_center", bad_center)
    with pytest.raises(AbsorptionError, match="'center'"):
        mc.absorb_normalization(make("gpt_neox"))


def test_save_and_load_absorbed(tmp_path):
    absorbed = mc.absorb_normalization(make("gpt2"))
    x = hf.example_inputs(absorbed)
    save_absorbed(absorbed, tmp_path / "m")
    back = load_absorbed(tmp_path / "m")
    assert type(back) is type(absorbed)
    assert max_diff(outputs(absorbed, x), outputs(back, x)) == 0
    with pytest.raises(ConfigError, match="not an absorbed model"):
        save_absorbed(make("gpt2"), tmp_path / "n")


def test_wrapped_and_bf16_models():
    class Wrap(nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

    model = Wrap(make("llama").to(torch.bfloat16))
    absorbed = mc.absorb_normalization(model)
    assert isinstance(absorbed, Wrap) and absorbed.lm.model.embed_tokens.weight.dtype == torch.bfloat16
    assert set(absorbed.lm.config.modeconn_absorbed["norms"]) >= {"model.norm"}  # paths relative to the HF model
