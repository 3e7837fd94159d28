"""The spec of a streamed table-family checkpoint built from its tensor names and config alone
(:mod:`modeconn.symmetry.hf.skeleton`) equals the spec built from transformers' model class, on every tiny model of
those families (variants included: tied embeddings, partial rotary, Q/K norms, parallel blocks); where the skeleton
cannot stand in (a tensor no table names, a family outside the route) the model class builds it as before."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from hf_tiny import NAMES, make  # noqa: E402

from modeconn.io.lazy import LazyCheckpoint  # noqa: E402
from modeconn.stream import hf_checkpoint_spec, stream_weight_matching  # noqa: E402
from modeconn.symmetry.hf import config_check, skeleton  # noqa: E402

_FIELDS = ("spaces", "tensors", "shapes", "probes", "repair_points", "aliases")
SKELETON_NAMES = [n for n in NAMES if make(n).config.model_type in skeleton.SKELETON_FAMILIES]


def _save(tmp_path, name: str, seed: int = 0):
    d = tmp_path / f"{name}_{seed}"
    make(name, seed).save_pretrained(d)
    return d


def _by_model_class(path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(skeleton, "SKELETON_FAMILIES", frozenset())
        return hf_checkpoint_spec(path)


def _no_model_class(monkeypatch):
    def refuse(*args):
        raise AssertionError("the model class was built")
    monkeypatch.setattr(config_check, "build_meta_model", refuse)


def _differences(a, b) -> list[str]:
    return [f for f in _FIELDS if getattr(a, f) != getattr(b, f)]


def test_every_skeleton_family_has_a_tiny_model():
    assert {make(n).config.model_type for n in SKELETON_NAMES} == skeleton.SKELETON_FAMILIES


@pytest.mark.parametrize("name", SKELETON_NAMES)
def test_skeleton_spec_equals_the_model_class_spec(tmp_path, monkeypatch, name):
    d = _save(tmp_path, name)
    expected = _by_model_class(d, monkeypatch)
    _no_model_class(monkeypatch)
    got = hf_checkpoint_spec(d)
    assert _differences(got, expected) == []
    assert got.aliases == expected.aliases


def test_a_wrong_rotary_width_is_caught(tmp_path, monkeypatch):
    """Negative control: a skeleton that gives every head dim RoPE frequencies (GPT-NeoX rotates a quarter) leaves
    fewer qk dims free: the comparison above sees it."""
    d = _save(tmp_path, "gpt_neox_seq")
    expected = _by_model_class(d, monkeypatch)
    monkeypatch.setattr(skeleton, "_rotary_width", lambda cfg: cfg.hidden_size // cfg.num_attention_heads)
    assert "spaces" in _differences(hf_checkpoint_spec(d), expected)


def test_a_tensor_no_table_names_goes_to_the_model_class(tmp_path, monkeypatch):
    """A stored buffer the model ignores (Pythia's ``attention.masked_bias``) is not the skeleton's to judge: the model
    class builds the spec and carries it unbound, as before."""
    import torch
    from safetensors.torch import load_file, save_file

    d = _save(tmp_path, "gpt_neox")
    sd = load_file(d / "model.safetensors")
    sd["gpt_neox.layers.0.attention.masked_bias"] = torch.tensor(-1e9)
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    ckpt = LazyCheckpoint(d)
    assert skeleton.skeleton_spec(transformers.AutoConfig.from_pretrained(d), {k: i.shape for k, i in ckpt.infos.items()},
                                  ckpt.dtypes) is None
    spec = hf_checkpoint_spec(d)
    assert spec.tensors["gpt_neox.layers.0.attention.masked_bias"] == ()


def test_a_family_outside_the_route_uses_the_model_class(tmp_path, monkeypatch):
    d = _save(tmp_path, "gpt2")
    calls = []
    build = config_check.build_meta_model
    monkeypatch.setattr(config_check, "build_meta_model", lambda *a: calls.append(a) or build(*a))
    hf_checkpoint_spec(d)
    assert len(calls) == 1


def test_streaming_weight_matching_on_the_skeleton_spec_recovers_a_permutation(tmp_path, monkeypatch):
    """Through the public streaming API: B is a permuted copy of A; the element found from the skeleton spec maps B
    back onto A exactly."""
    import torch

    from modeconn.stream import stream_apply

    d = _save(tmp_path, "llama")
    _no_model_class(monkeypatch)
    spec = hf_checkpoint_spec(d)
    g = spec.random_element(generator=torch.Generator().manual_seed(1))
    b = stream_apply(spec, d, g, tmp_path / "b")
    res = stream_weight_matching(spec, d, b)
    back = stream_apply(spec, b, res.element, tmp_path / "back")
    a, out = LazyCheckpoint(d), LazyCheckpoint(back)
    assert all(torch.equal(a[k], out[k]) for k in a)


def test_only_the_tested_causal_lm_classes_take_the_route():
    cfg = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64)
    cfg.architectures = ["LlamaForCausalLM"]
    assert skeleton.table_of(cfg) is not None
    for other in (["LlamaForSequenceClassification"], ["LlamaModel"], ["SomethingElse"], None):
        cfg.architectures = other
        assert skeleton.table_of(cfg) is None
