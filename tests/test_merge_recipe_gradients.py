"""Recipes with layer gradients (`t: [0, 0.5, 1]`, per model and inside filter lists) equal `mergekit-yaml`.

Tiny sharded 4-layer Llama / Mistral / Qwen2 checkpoints (fp32 and bf16); mergekit 0.1.5's own entry point
(`mergekit.merge.run_merge`, what `mergekit-yaml` runs) against `modeconn merge --config` with `align: none`: the same
tensor names, values (bit for bit), dtypes and config fields; the recipe written beside the output re-runs to the
same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as T
import yaml

from cli_runner import run_cli
from hf_tiny import randomize
from mergekit_parity import run_mergekit, tensors

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

pytest.importorskip("mergekit")

SEED = 3
_LM = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
       "num_hidden_layers": 4, "vocab_size": 50, "max_position_embeddings": 32, "bos_token_id": 0,
       "eos_token_id": 0, "pad_token_id": 0}
FAMILIES = {"llama": (T.LlamaConfig, T.LlamaForCausalLM), "mistral": (T.MistralConfig, T.MistralForCausalLM),
            "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM)}

HUB_SLERP_T = [{"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
               {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]}, {"value": 0.5}]
"""The `t` of the SLERP recipe most often published on the hub (a gradient per module kind, 0.5 elsewhere)."""

CASES = {
    "slerp_hub": {"merge_method": "slerp", "base_model": "a", "models": [{"model": "a"}, {"model": "b"}],
                  "parameters": {"t": HUB_SLERP_T}},
    "slerp_gradient": {"merge_method": "slerp", "base_model": "a", "models": [{"model": "a"}, {"model": "b"}],
                       "parameters": {"t": [0.1, 0.9, 0.4]}},
    "linear_per_model": {"merge_method": "linear",
                         "models": [{"model": "a", "parameters": {"weight": [1.0, 0.2]}},
                                    {"model": "b", "parameters": {"weight": [{"filter": "mlp", "value": [0, 0.8]},
                                                                             {"value": 0.5}]}}]},
    "ties_per_model": {"merge_method": "ties", "base_model": "a",
                       "models": [{"model": "b", "parameters": {"weight": [0.3, 1.0], "density": [0.2, 0.9]}},
                                  {"model": "c", "parameters": {"weight": 0.6,
                                                                "density": [{"filter": "self_attn", "value": [0.7, 0.3]},
                                                                            {"value": 0.5}]}}],
                       "parameters": {"normalize": True}},
    "dare_ties_gradient": {"merge_method": "dare_ties", "base_model": "a",
                           "models": [{"model": "b", "parameters": {"weight": 1.0}},
                                      {"model": "c", "parameters": {"weight": [0.2, 0.8]}}],
                           "parameters": {"density": [0.3, 0.6, 0.9], "lambda": [1.0, 0.5]}},
    "ties_flags_by_index": {"merge_method": "ties", "base_model": "a",
                            "models": [{"model": "b", "parameters": {"weight": 0.7}},
                                       {"model": "c", "parameters": {"weight": 0.4}}],
                              "parameters": {"density": 0.5, "normalize": [True, False, True]}},
}

SLICES = {
    "passthrough": {"merge_method": "passthrough", "dtype": "float32",
                    "slices": [{"sources": [{"model": "a", "layer_range": [0, 3]}]},
                               {"sources": [{"model": "b", "layer_range": [1, 4]}]}]},
    "passthrough_same_depth": {"merge_method": "passthrough",
                               "slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}]},
                                          {"sources": [{"model": "b", "layer_range": [2, 4]}]}]},
    "passthrough_scaled": {"merge_method": "passthrough",
                           "slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}]},
                                      {"sources": [{"model": "b", "layer_range": [2, 4], "parameters": {
                                          "scale": [{"filter": "o_proj", "value": [0.0, 1.0]}, {"value": 1.0}]}}]},
                                      {"sources": [{"model": "a", "layer_range": [3, 4]}]}]},
    "slerp_per_slice": {"merge_method": "slerp", "base_model": "a", "parameters": {"t": 0.5},
                        "slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}, {"model": "b", "layer_range": [0, 2]}],
                                    "parameters": {"t": HUB_SLERP_T}},
                                   {"sources": [{"model": "a", "layer_range": [2, 3]}, {"model": "b", "layer_range": [1, 2]}]},
                                   {"sources": [{"model": "b", "layer_range": [3, 4]}, {"model": "c", "layer_range": [0, 1]}],
                                    "base_model": "c", "parameters": {"t": [0.2, 0.8]}}]},
    "linear_slices": {"merge_method": "linear", "parameters": {"weight": 0.5},
                      "slices": [{"sources": [{"model": "a", "layer_range": [0, 4], "parameters": {"weight": [1.0, 0.0]}},
                                              {"model": "b", "layer_range": [0, 4]}]},
                                 {"sources": [{"model": "b", "layer_range": [2, 4]},
                                              {"model": "c", "layer_range": [0, 2], "parameters": {"weight": 0.25}}],
                                  "parameters": {"normalize": False}}]},
    "ties_slices": {"merge_method": "ties", "base_model": "a", "parameters": {"density": [0.3, 0.9], "weight": 1.0},
                    "slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}, {"model": "b", "layer_range": [2, 4]},
                                            {"model": "c", "layer_range": [0, 2], "parameters": {"weight": [0.2, 0.7]}}]},
                               {"sources": [{"model": "a", "layer_range": [2, 4]}, {"model": "b", "layer_range": [0, 2]},
                                            {"model": "c", "layer_range": [2, 4]}], "parameters": {"density": 0.6}}]},
    "dare_ties_slices": {"merge_method": "dare_ties", "base_model": "a", "parameters": {"density": [0.3, 0.9]},
                         "slices": [{"sources": [{"model": "a", "layer_range": [0, 2]},
                                                 {"model": "b", "layer_range": [0, 2], "parameters": {"weight": 0.8}},
                                                 {"model": "c", "layer_range": [0, 2], "parameters": {"weight": [0.2, 0.7]}}]},
                                    {"sources": [{"model": "a", "layer_range": [2, 4]},
                                                 {"model": "c", "layer_range": [0, 2], "parameters": {"weight": 1.0}},
                                                 {"model": "b", "layer_range": [2, 4], "parameters": {"weight": 0.5}}]}]},
}
"""Recipes with ``slices``: stacking (passthrough, frankenmerges), and per-slice merges by other rules."""


def _save(family: str, seed: int, dtype: torch.dtype, path: Path) -> Path:
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(seed)
    model = randomize(model_class(config_class(**_LM)), seed).to(dtype)
    model.save_pretrained(path, max_shard_size="40KB")
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Per (family, dtype): three tiny 4-layer checkpoints a, b, c, sharded."""
    root = tmp_path_factory.mktemp("gradients")
    out = {}
    for family in FAMILIES:
        for dtype in (torch.float32, torch.bfloat16):
            d = root / f"{family}-{str(dtype).removeprefix('torch.')}"
            for seed, name in enumerate("abc"):
                _save(family, seed, dtype, d / name)
            out[family, dtype] = d
    return out


def _resolved(recipe: dict, root: Path) -> dict:
    """``recipe`` with every model name a path under ``root``."""
    recipe = json.loads(json.dumps(recipe))
    if "base_model" in recipe:
        recipe["base_model"] = str(root / recipe["base_model"])
    for m in recipe.get("models", []):
        m["model"] = str(root / m["model"])
    for s in recipe.get("slices", []):
        if "base_model" in s:
            s["base_model"] = str(root / s["base_model"])
        for src in s["sources"]:
            src["model"] = str(root / src["model"])
    return recipe


def differing(ours: dict, ref: dict) -> list[str]:
    """Names whose tensors differ (after checking the names, shapes and dtypes agree)."""
    assert sorted(ours) == sorted(ref)
    for k, r in ref.items():
        assert ours[k].dtype == r.dtype and ours[k].shape == r.shape, k
    return [k for k in ref if not torch.equal(ours[k], ref[k])]


CONFIG_FIELDS = ("num_hidden_layers", "hidden_size", "vocab_size", "model_type", "architectures", "dtype", "torch_dtype")


def ours_equal_mergekit(recipe: dict, root: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """Run both on ``recipe`` (names under ``root``); assert bitwise equality, config fields and the re-run."""
    resolved = _resolved(recipe, root)
    run_mergekit(resolved, tmp / "mergekit", SEED)
    file = tmp / "recipe.yml"
    file.write_text(yaml.safe_dump({**resolved, "align": {"method": "none"}}))
    run_cli("merge", "--config", file, "--seed", SEED, "--out", tmp / "ours")
    ours, ref = tensors(tmp / "ours"), tensors(tmp / "mergekit")
    assert differing(ours, ref) == []
    mine, theirs = (json.loads((tmp / d / "config.json").read_text()) for d in ("ours", "mergekit"))
    assert {k: mine.get(k) for k in CONFIG_FIELDS} == {k: theirs.get(k) for k in CONFIG_FIELDS}
    # the recipe written beside the output re-runs to the same bytes
    again = root / f"again-{tmp.name}.yml"
    again.write_text((tmp / "ours" / "merge_recipe.yml").read_text())
    run_cli("merge", "--config", again, "--out", tmp / "again")
    rerun = tensors(tmp / "again")
    assert all(torch.equal(ours[k], rerun[k]) for k in ours)
    assert str(root) not in (tmp / "ours" / "merge_recipe.yml").read_text()
    return ours


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_hub_slerp_recipe_equals_mergekit(models, tmp_path, family, dtype):
    ours_equal_mergekit(CASES["slerp_hub"], models[family, dtype], tmp_path)


@pytest.mark.parametrize("case", [c for c in CASES if c != "slerp_hub"])
def test_gradient_recipes_equal_mergekit(models, tmp_path, case):
    ours_equal_mergekit(CASES[case], models["llama", torch.float32], tmp_path)


@pytest.mark.parametrize("case", ["ties_per_model", "linear_per_model"])
def test_gradient_recipes_equal_mergekit_bf16_qwen2(models, tmp_path, case):
    ours_equal_mergekit(CASES[case], models["qwen2", torch.bfloat16], tmp_path)


def test_negative_control_a_gradient_is_not_a_constant(models, tmp_path):
    """The old reading of the hub recipe (each gradient's first value everywhere, as a constant `t`) differs from
    mergekit's in most tensors: the comparison above can fail."""
    root = models["llama", torch.float32]
    run_mergekit(_resolved(CASES["slerp_hub"], root), tmp_path / "mergekit", SEED)
    constant = [{"filter": e.get("filter"), "value": e["value"][0] if isinstance(e["value"], list) else e["value"]}
                for e in HUB_SLERP_T]
    constant = [{k: v for k, v in e.items() if v is not None} for e in constant]
    run_mergekit({**_resolved(CASES["slerp_hub"], root), "parameters": {"t": constant}}, tmp_path / "constant", SEED)
    ref, old = tensors(tmp_path / "mergekit"), tensors(tmp_path / "constant")
    assert len(differing(old, ref)) > len(ref) // 2


@pytest.mark.parametrize("edit, match", [
    ({"parameters": {"t": [{"filter": "mlp", "value": [[0, 1]]}]}}, "parameters.t"),
    ({"parameters": {"t": []}}, "parameters.t"),
    ({"parameters": {"t": [0.0, 1.5]}}, "'t' (gradient value 1)"),
])
def test_malformed_gradients_are_refused_naming_the_key(models, tmp_path, edit, match):
    root = models["llama", torch.float32]
    file = tmp_path / "r.yml"
    file.write_text(yaml.safe_dump({**_resolved(CASES["slerp_hub"], root), **edit, "align": {"method": "none"}}))
    res = run_cli("merge", "--config", file, "--out", tmp_path / "out", ok=False)
    assert res.exit_code != 0 and match in res.output, res.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", list(SLICES))
def test_slices_equal_mergekit(models, tmp_path, case):
    ours_equal_mergekit(SLICES[case], models["llama", torch.float32], tmp_path)


@pytest.mark.parametrize("family, dtype", [("mistral", torch.bfloat16), ("qwen2", torch.float32),
                                           ("qwen2", torch.bfloat16)], ids=["mistral-bf16", "qwen2-fp32", "qwen2-bf16"])
@pytest.mark.parametrize("case", ["passthrough_same_depth", "slerp_per_slice", "ties_slices"])
def test_slices_equal_mergekit_families(models, tmp_path, case, family, dtype):
    ours_equal_mergekit(SLICES[case], models[family, dtype], tmp_path)


def test_mistral_bf16_frankenmerge_equals_mergekit(models, tmp_path):
    ours_equal_mergekit(SLICES["passthrough"], models["mistral", torch.bfloat16], tmp_path)


def test_qwen2_frankenmerge_config_lists_layer_types(models, tmp_path):
    """A Qwen2 config lists each layer's type: the stacked model's list follows its layers' sources (mergekit 0.1.5
    writes the old list beside the new count, a config transformers refuses), so transformers loads it."""
    root = models["qwen2", torch.float32]
    file = tmp_path / "r.yml"
    file.write_text(yaml.safe_dump({**_resolved(SLICES["passthrough"], root), "align": {"method": "none"}}))
    run_cli("merge", "--config", file, "--out", tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["num_hidden_layers"] == 6 and len(config["layer_types"]) == 6
    model = T.AutoModelForCausalLM.from_pretrained(tmp_path / "ours")
    ours, b = tensors(tmp_path / "ours"), tensors(root / "b")
    assert len(model.model.layers) == 6
    assert torch.equal(ours["model.layers.5.self_attn.q_proj.weight"], b["model.layers.3.self_attn.q_proj.weight"])


def test_passthrough_stacks_layers_renumbered(models, tmp_path):
    """The frankenmerge's layer k is the source layer it names, renumbered; a 5-layer model that transformers loads."""
    root = models["llama", torch.float32]
    ours = ours_equal_mergekit(SLICES["passthrough"], root, tmp_path)
    a, b = tensors(root / "a"), tensors(root / "b")
    key = "model.layers.{}.mlp.down_proj.weight"
    assert [torch.equal(ours[key.format(i)], src[key.format(j)])
            for i, (src, j) in enumerate([(a, 0), (a, 1), (a, 2), (b, 1), (b, 2), (b, 3)])] == [True] * 6
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["num_hidden_layers"] == 6
    model = T.AutoModelForCausalLM.from_pretrained(tmp_path / "ours")
    assert len(model.model.layers) == 6


def test_recipe_dtype_alone_is_the_written_dtype(models, tmp_path):
    """`dtype:` without `out_dtype:` is also the dtype mergekit writes."""
    recipe = {**CASES["slerp_gradient"], "dtype": "bfloat16"}
    ours = ours_equal_mergekit(recipe, models["llama", torch.float32], tmp_path)
    assert all(t.dtype == torch.bfloat16 for t in ours.values())


@pytest.mark.parametrize("edit, match", [
    ({"modules": {"text_decoder": {}}}, "'modules': per-module merges"),
    ({"slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}], "residual_weight": 0.5}]},
     "slices[0].residual_weight: mergekit 0.1.5 reads it but never applies it"),
    ({"slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}, {"model": "b", "layer_range": [0, 3]}]}]},
     "slices[0]: every source must give as many layers"),
    ({"slices": [{"sources": [{"model": "a", "layer_range": [2, 6]}]}]}, "slices[0].sources[0].layer_range [2, 6]"),
    ({"models": [{"model": "a"}]}, "give exactly one of 'models'"),
    ({"merge_method": "ties", "base_model": "c"}, "slices[0]: the base model is not among the slice's sources"),
    ({"merge_method": "slerp"}, "slices[0]"),
])
def test_bad_slices_are_refused_naming_the_key(models, tmp_path, edit, match):
    root = models["llama", torch.float32]
    recipe = {**SLICES["passthrough"], **edit}
    if "models" in edit:
        recipe["slices"] = SLICES["passthrough"]["slices"]
    file = tmp_path / "r.yml"
    file.write_text(yaml.safe_dump({**_resolved(recipe, root), "align": {"method": "none"}}))
    res = run_cli("merge", "--config", file, "--out", tmp_path / "out", ok=False)
    assert res.exit_code != 0 and match in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_slices_compose_with_alignment(models, tmp_path):
    """`align: weight` aligns every model the slices name to the reference before stacking: a frankenmerge of A's
    first layers and the last layers of B = A with permuted units computes A's function (naive stacking does not)."""
    import shutil

    from modeconn.stream import hf_checkpoint_spec, stream_apply

    a = models["llama", torch.float32] / "a"
    spec = hf_checkpoint_spec(a)
    b = stream_apply(spec, a, spec.random_element(seed=1), tmp_path / "b")
    shutil.copy(a / "config.json", b / "config.json")
    recipe = {"merge_method": "passthrough",
              "slices": [{"sources": [{"model": str(a), "layer_range": [0, 2]}]},
                         {"sources": [{"model": str(b), "layer_range": [2, 4]}]}]}
    x = torch.randint(0, 50, (2, 7))
    logits = {}
    for method in ("weight", "none"):
        file = tmp_path / f"{method}.yml"
        align = {"method": method, "reference": str(a), **({"restarts": 1} if method == "weight" else {})}
        file.write_text(yaml.safe_dump({**recipe, "align": align}))
        run_cli("merge", "--config", file, "--out", tmp_path / method)
        with torch.no_grad():
            logits[method] = T.AutoModelForCausalLM.from_pretrained(tmp_path / method)(x).logits
    with torch.no_grad():
        ref = T.AutoModelForCausalLM.from_pretrained(a)(x).logits
    assert torch.allclose(logits["weight"], ref, atol=1e-4)
    assert not torch.allclose(logits["none"], ref, atol=1e-2)
    # the recipe written beside the output (models named relative to it, the alignment's settings) re-runs
    run_cli("merge", "--config", tmp_path / "weight" / "merge_recipe.yml", "--out", tmp_path / "rerun")
    ours, rerun = tensors(tmp_path / "weight"), tensors(tmp_path / "rerun")
    assert all(torch.equal(ours[k], rerun[k]) for k in ours)


def test_randomised_slices_with_an_undefined_draw_order_are_refused(models, tmp_path):
    """mergekit schedules its merges by the largest input tensor name; where two output tensors share it, the order of
    their draws is its task graph's, and modeconn refuses rather than guess."""
    root = models["llama", torch.float32]
    recipe = json.loads(json.dumps(SLICES["dare_ties_slices"]))
    recipe["slices"][0]["sources"][1]["layer_range"] = [2, 4]
    recipe["slices"][1]["sources"][2]["layer_range"] = [0, 2]
    file = tmp_path / "r.yml"
    file.write_text(yaml.safe_dump({**_resolved(recipe, root), "align": {"method": "none"}}))
    res = run_cli("merge", "--config", file, "--out", tmp_path / "out", ok=False)
    assert res.exit_code != 0 and "draws random numbers in the order mergekit schedules" in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_gradients_compose_with_alignment(models, tmp_path):
    """`align: weight` then the hub's SLERP gradients: B = A with permuted units is aligned back onto A first, so the
    merge is A (up to rounding); merged as stored it is not."""
    import shutil

    from modeconn.stream import hf_checkpoint_spec, stream_apply

    a = models["llama", torch.float32] / "a"
    spec = hf_checkpoint_spec(a)
    b = stream_apply(spec, a, spec.random_element(seed=2), tmp_path / "b")
    shutil.copy(a / "config.json", b / "config.json")
    recipe = {"merge_method": "slerp", "base_model": str(a), "models": [{"model": str(a)}, {"model": str(b)}],
              "parameters": {"t": HUB_SLERP_T}}
    for method in ("weight", "none"):
        file = tmp_path / f"{method}.yml"
        file.write_text(yaml.safe_dump({**recipe, "align": {"method": method, **(
            {"restarts": 1} if method == "weight" else {})}}))
        run_cli("merge", "--config", file, "--out", tmp_path / method)
    ta, aligned, naive = tensors(a), tensors(tmp_path / "weight"), tensors(tmp_path / "none")
    assert all(torch.allclose(aligned[k], ta[k], atol=1e-5) for k in ta)
    assert not all(torch.allclose(naive[k], ta[k], atol=1e-3) for k in ta)
