"""The automatic fallback grants a group only where a random element of that group keeps the function (#34 item 1).

transformers' own classes of model types without an adapter, at tiny sizes with every parameter perturbed: Helium
and ERNIE-4.5 (interleaved RoPE: per-head Q/K maps do not commute with it) and the eight types the fallback
supports (Granite, SmolLM3, Ministral, Seed-OSS, Cohere2, OLMo3, EXAONE-4, and Llava's language model). For each,
every granted (role, group) and the largest granted combination are applied as a random element and the outputs
compared; a group not granted is refused by :func:`~modeconn.symmetry.hf.hf_symmetry_spec`. Negative control: the
old fallback (a permutation verified, then every richer group granted) fails the same assertion on Helium.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
from hf_tiny import randomize

from modeconn.errors import SpecError
from modeconn.symmetry import hf
from modeconn.symmetry.hf import infer

T.logging.set_verbosity_error()

_LM = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
       "num_hidden_layers": 2, "vocab_size": 50, "max_position_embeddings": 32, "bos_token_id": 0, "eos_token_id": 0,
       "pad_token_id": 0}
_VISION = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64, "num_hidden_layers": 2,
           "image_size": 8, "patch_size": 4}


def _llava_language_model():
    cfg = T.LlavaConfig(vision_config=_VISION, text_config={"model_type": "llama", **_LM}, image_token_index=1)
    return T.LlavaForConditionalGeneration(cfg).model.language_model


FALLBACK = {  # model type → (transformers class names it needs, builder)
    "helium": (("HeliumForCausalLM",), lambda: T.HeliumForCausalLM(T.HeliumConfig(head_dim=8, **_LM))),
    "ernie4_5": (("Ernie4_5ForCausalLM",), lambda: T.Ernie4_5ForCausalLM(T.Ernie4_5Config(head_dim=8, **_LM))),
    "granite": (("GraniteForCausalLM",), lambda: T.GraniteForCausalLM(T.GraniteConfig(
        embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=2.0, **_LM))),
    "smollm3": (("SmolLM3ForCausalLM",), lambda: T.SmolLM3ForCausalLM(T.SmolLM3Config(**_LM))),
    "ministral": (("MinistralForCausalLM",), lambda: T.MinistralForCausalLM(T.MinistralConfig(
        head_dim=8, sliding_window=4, **_LM))),
    "seed_oss": (("SeedOssForCausalLM",), lambda: T.SeedOssForCausalLM(T.SeedOssConfig(head_dim=8, **_LM))),
    "cohere2": (("Cohere2ForCausalLM",), lambda: T.Cohere2ForCausalLM(T.Cohere2Config(sliding_window=4, **_LM))),
    "olmo3": (("Olmo3ForCausalLM",), lambda: T.Olmo3ForCausalLM(T.Olmo3Config(sliding_window=4, **_LM))),
    "exaone4": (("Exaone4ForCausalLM",), lambda: T.Exaone4ForCausalLM(T.Exaone4Config(sliding_window=4, **_LM))),
    "llava_language_model": (("LlavaForConditionalGeneration",), _llava_language_model),
}
SILENTLY_WRONG_BEFORE = ("helium", "ernie4_5")  # the two: inferred as Llama, richer groups changed outputs


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.setattr(infer, "_CACHE", {})


def _model(name: str):
    needs, build = FALLBACK[name]
    assert all(hasattr(T, c) for c in needs), (f"transformers {T.__version__} has no {needs}: these checks need the "
                                               "release pyproject's range installs")
    torch.manual_seed(0)
    return randomize(build(), 0)


def _inputs(model) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [hf.example_inputs(model), {"input_ids": torch.randint(0, 50, (2, 30), generator=gen)}]


def _outputs(model, x) -> torch.Tensor:
    with torch.no_grad():
        out = model.eval()(**x)
    return out["logits"] if "logits" in out else out["last_hidden_state"]


def _change(model, groups) -> float:
    spec = hf.hf_symmetry_spec(model, groups)
    moved = copy.deepcopy(model)
    moved.load_state_dict(spec.apply(model.state_dict(), spec.random_element(seed=3)))
    return max(float((_outputs(model, x) - _outputs(moved, x)).abs().max()) for x in _inputs(model))


def _requests(granted) -> list[dict[str, str | None]]:
    """One request per granted (role, group), and the largest granted combination."""
    out = []
    for role, gs in granted.items():
        for g in gs:
            out.append({"heads": g, "qk": None, "vo": None} if role == "heads" else {role: g})
    largest = {r: gs[1] if len(gs) > 1 else gs[0] for r, gs in granted.items()}  # head_invertible over permutation
    if "heads" in largest:
        largest |= {r: largest.get(r) if largest.get(r) in ("head_invertible", "head_orthogonal") else None
                    for r in ("qk", "vo")}
    return [*out, largest]


def _groups_that_change_outputs(model) -> list[tuple[dict, float]]:
    return [(req, err) for req in _requests(hf.adapter_for(model).groups) if not (err := _change(model, req)) < 1e-4]


@pytest.mark.parametrize("name", list(FALLBACK))
def test_every_group_the_fallback_grants_keeps_the_function(name):
    model = _model(name)
    adapter = hf.adapter_for(model)
    assert "inferred" in adapter.family or name == "llava_language_model"  # Llava's LM is a plain Llama
    if adapter.groups is None:  # a registered adapter: every group the builder supports is tested with its family
        return
    assert _groups_that_change_outputs(model) == []
    for role, g in (("qk", "head_orthogonal"), ("vo", "head_orthogonal"), ("ffn_scale", "scaling")):
        if g not in adapter.groups.get(role, ()):
            with pytest.raises(SpecError, match="were not shown to keep this model's function"):
                hf.hf_symmetry_spec(model, {role: g})


@pytest.mark.parametrize("name", SILENTLY_WRONG_BEFORE)
def test_helium_and_ernie_get_only_the_groups_that_hold(name):
    """Interleaved RoPE pairs (2i, 2i + 1), not Llama's (i, i + d/2): per-head Q/K maps are refused, and they really
    do change the outputs (built past the check); head permutations, V/O maps and FFN scaling are granted."""
    model = _model(name)
    adapter = hf.adapter_for(model)
    assert adapter.groups["qk"] == ("permutation",)
    assert adapter.groups["heads"] == ("permutation",) and "head_invertible" in adapter.groups["vo"]
    unverified = hf.build_spec(hf.describe(model), model.state_dict(), {"qk": "head_orthogonal"})
    moved = copy.deepcopy(model)
    moved.load_state_dict(unverified.apply(model.state_dict(), unverified.random_element(seed=3)))
    x = hf.example_inputs(model)
    assert (_outputs(model, x) - _outputs(moved, x)).abs().max() > 1e-2


def test_negative_control_granting_after_a_permutation_check_only_fails(monkeypatch):
    """The old fallback: one random permutation verified, then every richer group granted."""
    monkeypatch.setattr(infer._Check, "granted", lambda self, describe: {
        r: hf.SUPPORTED[r] for r in hf.ROLES if r != "residual"} | {"residual": ("permutation",)})
    bad = _groups_that_change_outputs(_model("helium"))
    assert bad and all(err > 1e-2 for _, err in bad)
    assert any(req.get("qk") == "head_invertible" for req, _ in bad)
