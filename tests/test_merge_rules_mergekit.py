"""Issue #22: `modeconn merge --align none` equals `mergekit-yaml` on the same recipe.

Tiny sharded Llama-style checkpoints (fp32 and bf16); mergekit 0.1.5's own entry point (`mergekit.merge.run_merge`,
what `mergekit-yaml` runs) on CPU against `modeconn merge --config` / the equivalent command-line flags.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from cli_runner import run_cli
from hf_tiny import make
from modeconn.io.lazy import LazyCheckpoint
from mergekit_parity import run_mergekit, tensors

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

CASES = {
    "linear": ({"merge_method": "linear"}, [0.6, 0.4, None], 2),
    "task_arithmetic": ({"merge_method": "task_arithmetic", "base_model": "a"}, [None, 0.5, 0.3], 3),
    "ties": ({"merge_method": "ties", "base_model": "a", "parameters": {"density": 0.5}}, [None, 1.0, 0.7], 3),
    "dare_ties": ({"merge_method": "dare_ties", "base_model": "a", "parameters": {"density": 0.5}},
                  [None, 1.0, 0.7], 3),
    "dare_linear": ({"merge_method": "dare_linear", "base_model": "a", "parameters": {"density": 0.4}},
                    [None, 0.6, 0.6], 3),
    "slerp": ({"merge_method": "slerp", "base_model": "a", "parameters": {"t": 0.3}}, [None, None, None], 2),
}
SEED = 7


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Three tiny Llama checkpoints per dtype, sharded (save_pretrained with a small max_shard_size)."""
    root = tmp_path_factory.mktemp("llama")
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        d = root / str(dtype).removeprefix("torch.")
        for seed, name in enumerate("abc"):
            make("llama", seed).to(dtype).save_pretrained(d / name, max_shard_size="20KB")
        out[dtype] = d
    return out


def _recipe(root: Path, case: str) -> dict:
    spec, weights, n = CASES[case]
    recipe = json.loads(json.dumps(spec))
    if "base_model" in recipe:
        recipe["base_model"] = str(root / recipe["base_model"])
    recipe["models"] = []
    for name, w in zip("abc"[:n], weights[:n], strict=True):
        entry = {"model": str(root / name)}
        if w is not None:
            entry["parameters"] = {"weight": w}
        recipe["models"].append(entry)
    return recipe


def _compare(ours: dict, ref: dict, *, bitwise: bool) -> float:
    assert set(ours) == set(ref)
    worst = 0.0
    for k, r in ref.items():
        o = ours[k]
        assert o.dtype == r.dtype and o.shape == r.shape, k
        if bitwise:
            assert torch.equal(o, r), f"{k}: max |Δ| {float((o.float() - r.float()).abs().max())}"
        scale = max(float(r.float().abs().max()), 1e-30)
        worst = max(worst, float((o.float() - r.float()).abs().max()) / scale)
    return worst


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_merge_align_none_equals_mergekit_yaml(models, tmp_path, case, dtype):
    root = models[dtype]
    recipe = _recipe(root, case)
    run_mergekit(recipe, tmp_path / "mergekit", SEED)
    file = tmp_path / "recipe.yml"
    file.write_text(yaml.safe_dump({**recipe, "align": {"method": "none"}}))
    run_cli("merge", "--config", file, "--seed", SEED, "--out", tmp_path / "ours")
    ours, ref = tensors(tmp_path / "ours"), tensors(tmp_path / "mergekit")
    # mergekit's kernels run on the same tensors, and modeconn's own linear rule matches mergekit's: bitwise
    assert _compare(ours, ref, bitwise=True) <= 1e-6
    assert next(iter(ours.values())).dtype == dtype
    # the sharded layout of the first model is kept, and the recipe it ran is written beside it (names, no paths)
    assert LazyCheckpoint(tmp_path / "ours").shards.keys() == LazyCheckpoint(root / "a").shards.keys()
    written = (tmp_path / "ours" / "merge_recipe.yml").read_text()
    assert str(root) not in written and str(root) not in (tmp_path / "ours" / "README.md").read_text()
    assert yaml.safe_load(written)["merge_method"] == case


@pytest.mark.parametrize("case", ["ties", "dare_ties", "slerp"])
def test_command_line_flags_equal_the_recipe(models, tmp_path, case):
    """`--rule/--base/--param/--weights` on the command line give the recipe's bytes."""
    root = models[torch.float32]
    recipe = _recipe(root, case)
    run_mergekit(recipe, tmp_path / "mergekit", SEED)
    spec, weights, n = CASES[case]
    args = ["merge", *(root / m for m in "abc"[:n]), "--align", "none", "--rule", case, "--base", root / "a",
            "--seed", SEED, "--out", tmp_path / "ours"]
    args += [x for k, v in spec.get("parameters", {}).items() for x in ("--param", f"{k}={v}")]
    if any(w is not None for w in weights[:n]):
        args += ["--weights", ",".join(str(1.0 if w is None else w) for w in weights[:n])]
    run_cli(*args)
    _compare(tensors(tmp_path / "ours"), tensors(tmp_path / "mergekit"), bitwise=True)


def test_dare_depends_on_the_seed(models, tmp_path):
    """A negative control for the seeded comparison: another seed draws other masks."""
    root = models[torch.float32]
    recipe = _recipe(root, "dare_ties")
    run_mergekit(recipe, tmp_path / "mergekit", SEED)
    args = ["merge", root / "a", root / "b", root / "c", "--align", "none", "--rule", "dare_ties", "--base",
            root / "a", "--param", "density=0.5", "--weights", "1,1,0.7"]
    run_cli(*args, "--seed", SEED + 1, "--out", tmp_path / "other")
    ours, ref = tensors(tmp_path / "other"), tensors(tmp_path / "mergekit")
    assert any(not torch.equal(ours[k], ref[k]) for k in ref)


def test_recipe_dtype_and_out_dtype_equal_mergekit(models, tmp_path):
    """`dtype:` (inputs cast before the rule) and `out_dtype:` (the written dtype) mean what they mean in mergekit."""
    root = models[torch.float32]
    recipe = {**_recipe(root, "ties"), "dtype": "bfloat16", "out_dtype": "float16"}
    run_mergekit(recipe, tmp_path / "mergekit", SEED)
    file = tmp_path / "recipe.yml"
    file.write_text(yaml.safe_dump({**recipe, "align": {"method": "none"}}))
    run_cli("merge", "--config", file, "--out", tmp_path / "ours")
    ours = tensors(tmp_path / "ours")
    assert all(t.dtype == torch.float16 for t in ours.values())
    _compare(ours, tensors(tmp_path / "mergekit"), bitwise=True)
