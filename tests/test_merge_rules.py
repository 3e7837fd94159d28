"""Issue #22 (merge rules, recipes, practicalities) and #17's merge items: averaging needs no spec, streamed merges
from the Python API carry config.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers as T
import yaml

import modeconn as mc
from cli_runner import run_cli
from hf_tiny import make, randomize
from modeconn.errors import ConfigError, NonFiniteError
from modeconn.io.lazy import LazyCheckpoint
from modeconn.path.interpolate import weighted_average
from modeconn.path.merge_mergekit import MERGEKIT_RULES
from modeconn.path import merge_rules
from modeconn.path.merge_rules import MERGE_RULES, RuleSettings, check_rule_settings

pytestmark = pytest.mark.usefixtures("one_thread")


def _save(model, path: Path, **kw) -> Path:
    model.save_pretrained(path, **kw)
    return path


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    ckpt = LazyCheckpoint(path)
    return {k: ckpt[k].clone() for k in ckpt}


def _llamas(tmp_path: Path, n: int = 2, dtype=torch.float32) -> list[Path]:
    return [_save(make("llama", s).to(dtype), tmp_path / f"m{s}", max_shard_size="20KB") for s in range(n)]


# ------------------------------------------------------------------------------------------- the registry
def test_every_mergekit_rule_lists_mergekits_own_parameters_and_source():
    """The registry's table agrees with mergekit's spec of each method (names, base policy), and names its source."""
    from mergekit import merge_methods

    for name in MERGEKIT_RULES:
        rule, spec = MERGE_RULES.get(name), merge_methods.get(name).spec
        assert set(rule.params) == {p.name for p in spec.parameters} - {"weight"}, name
        assert rule.base == spec.contract.base.value.replace("ignored", "none"), name
        assert "mergekit" in rule.source and rule.requires == "mergekit"
        has_weight = any(p.name == "weight" for p in spec.parameters)
        assert (rule.weights != "none") == has_weight, name


def test_rule_settings_are_checked_before_any_work():
    with pytest.raises(ConfigError, match="densty"):
        check_rule_settings("ties", RuleSettings(base=0, params={"densty": 0.5}), 3)
    with pytest.raises(ConfigError, match="needs a base"):
        check_rule_settings("ties", RuleSettings(params={"density": 0.5}), 3)
    with pytest.raises(ConfigError, match="Missing required parameter t"):
        check_rule_settings("slerp", RuleSettings(base=0), 2)
    with pytest.raises(ConfigError, match="at most 2|exactly 2"):
        check_rule_settings("slerp", RuleSettings(base=0, params={"t": 0.5}), 3)
    with pytest.raises(ConfigError, match="takes no weights"):
        check_rule_settings("slerp", RuleSettings(base=0, params={"t": 0.5}), 2, weights_given=True)
    with pytest.raises(ConfigError, match="takes no base"):
        check_rule_settings("linear", RuleSettings(base=0), 2)
    with pytest.raises(ConfigError, match="out of range"):
        check_rule_settings("ties", RuleSettings(base=5), 2)


def test_in_memory_rules_equal_mergekits_state_dict_merge():
    """modeconn.merge / weighted_average with a mergekit rule equals mergekit's own merge_state_dicts (unaligned
    inputs), DARE with the generator mergekit-yaml would use (seeded, tensors in name order)."""
    from mergekit.merge_methods.api import merge_state_dicts

    sds = [make("llama", s).state_dict() for s in range(3)]
    for rule, params in (("ties", {"density": 0.5}), ("task_arithmetic", {}), ("dare_linear", {"density": 0.5})):
        ours = mc.merge(sds, [1.0, 0.5, 0.8], normalize=False, rule=rule,
                        settings=RuleSettings(base=0, params=params, seed=3))
        torch.manual_seed(3)
        ref = merge_state_dicts(sorted_sds(sds), rule, base=0, parameters={**params, "weight": {1: 0.5, 2: 0.8}})
        for k in ref:
            assert torch.equal(ours[k], ref[k]), (rule, k)


def sorted_sds(sds):
    """State dicts with keys in sorted order (mergekit-yaml executes tensors by name; so DARE draws in that order)."""
    return [{k: sd[k] for k in sorted(sd)} for sd in sds]


def test_randomised_rule_streamed_equals_in_memory_and_leaves_the_global_rng_alone(tmp_path):
    paths = _llamas(tmp_path, 3)
    settings = RuleSettings(base=0, params={"density": 0.3}, seed=11)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    mc.stream_merge(None, paths, tmp_path / "out", weights=[1, 1, 1], normalize=False, rule="dare_ties",
                    settings=settings)
    assert torch.equal(torch.get_rng_state(), before)
    sds = [_tensors(p) for p in paths]
    mem = weighted_average(sds, [1, 1, 1], normalize=False, rule="dare_ties", settings=settings)
    out = _tensors(tmp_path / "out")
    assert all(torch.equal(out[k], mem[k]) for k in out)
    other = weighted_average(sds, [1, 1, 1], normalize=False, rule="dare_ties",
                             settings=RuleSettings(base=0, params={"density": 0.3}, seed=12))
    assert any(not torch.equal(other[k], mem[k]) for k in mem)


def test_filtered_parameters_resolve_per_tensor_name():
    """mergekit's conditional form: `density` 0 on mlp tensors (TIES keeps only the base there), 1 elsewhere."""
    sds = [make("llama", s).state_dict() for s in range(2)]
    density = [{"filter": "mlp", "value": 0.0}, {"value": 1.0}]
    out = weighted_average(sds, [1.0, 1.0], normalize=False, rule="ties",
                           settings=RuleSettings(base=0, params={"density": density}))
    mlp = next(k for k in sds[0] if ".mlp." in k)
    attn = next(k for k in sds[0] if ".self_attn." in k)
    assert torch.equal(out[mlp], sds[0][mlp])
    assert torch.allclose(out[attn], sds[1][attn], atol=1e-6) and not torch.allclose(out[attn], sds[0][attn])


# ------------------------------------------------------------------------- aligned merges with a rule
def test_aligned_merge_with_ties_on_a_planted_permutation(tmp_path):
    """--align weight then TIES: B is A with permuted units, so after alignment B's task vector is zero and TIES
    returns A; without alignment it does not."""
    from modeconn.stream import hf_checkpoint_spec, stream_apply

    a = _llamas(tmp_path, 1)[0]
    spec = hf_checkpoint_spec(a)
    b = stream_apply(spec, a, spec.random_element(seed=1), tmp_path / "b")
    shutil.copy(a / "config.json", b / "config.json")
    run_cli("merge", a, b, "--align", "weight", "--rule", "ties", "--base", a, "--param", "density=0.5",
            "--restarts", 1, "--out", tmp_path / "aligned")
    run_cli("merge", a, b, "--align", "none", "--rule", "ties", "--base", a, "--param", "density=0.5",
            "--out", tmp_path / "naive")
    ta, aligned, naive = _tensors(a), _tensors(tmp_path / "aligned"), _tensors(tmp_path / "naive")
    assert all(torch.allclose(aligned[k], ta[k], atol=1e-6) for k in ta)
    assert not all(torch.allclose(naive[k], ta[k], atol=1e-3) for k in ta)


def test_modeconn_checkpoints_merge_with_a_mergekit_rule(tmp_path):
    from modeconn.io import load_checkpoint

    for seed in (0, 1, 2):
        run_cli("train", "--out", tmp_path / f"c{seed}", "--model", "mlp", "--dataset", "digits", "-m", "width=16",
                "-m", "depth=1", "--epochs", 1, "--seed", seed)
    run_cli("merge", *(tmp_path / f"c{s}" for s in range(3)), "--align", "none", "--rule", "task_arithmetic",
            "--base", tmp_path / "c0", "--weights", "1,0.5,0.5", "--bn", "keep", "--out", tmp_path / "m")
    merged = load_checkpoint(tmp_path / "m")[0].state_dict()
    sds = [load_checkpoint(tmp_path / f"c{s}")[0].state_dict() for s in range(3)]
    k = next(k for k, v in sds[0].items() if v.is_floating_point())
    assert torch.allclose(merged[k], sds[0][k] + 0.5 * (sds[1][k] - sds[0][k]) + 0.5 * (sds[2][k] - sds[0][k]),
                          atol=1e-6)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["rule"] == "task_arithmetic" and cfg["base"] == 0


# ------------------------------------------------------------------------------------------------ recipes
def test_recipe_with_align_section_and_written_recipe_reruns_to_the_same_bytes(tmp_path):
    paths = _llamas(tmp_path / "models", 3)
    recipe = {"merge_method": "dare_ties", "base_model": "m0",
              "models": [{"model": "m1", "parameters": {"weight": 0.7, "density": 0.4}},
                         {"model": "m2", "parameters": {"weight": 0.3, "density": 0.6}}],
              "parameters": {"normalize": True}, "out_dtype": "bfloat16", "align": {"method": "none"}}
    file = paths[0].parent / "recipe.yml"
    file.write_text(yaml.safe_dump(recipe))
    run_cli("merge", "--config", file, "--seed", 5, "--out", tmp_path / "out")
    out = tmp_path / "out"
    ran = yaml.safe_load((out / "merge_recipe.yml").read_text())
    assert ran["merge_method"] == "dare_ties" and Path(ran["base_model"]).name == "m0" and ran["out_dtype"] == "bfloat16"
    assert [Path(m["model"]).name for m in ran["models"]] == ["m1", "m2", "m0"]  # relative to the recipe's folder
    assert ran["seed"] == 5
    for f in ("merge_recipe.yml", "README.md", "merge.json", "config.json"):
        assert str(tmp_path) not in (out / f).read_text(), f
    assert "m1" in (out / "README.md").read_text()
    assert all(t.dtype == torch.bfloat16 for t in _tensors(out).values())
    assert json.loads((out / "config.json").read_text()).get("dtype") == "bfloat16"
    # the recipe written beside the output runs again (models found by name next to it) to the same bytes
    again = paths[0].parent / "again.yml"
    again.write_text((out / "merge_recipe.yml").read_text())
    run_cli("merge", "--config", again, "--seed", ran.get("seed", 5), "--out", tmp_path / "again")
    a, b = _tensors(out), _tensors(tmp_path / "again")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("edit, match", [
    ({"modules": {}}, "'modules'"),
    ({"parameters": {"t": [[0.0, 0.5, 1.0]]}}, "parameters.t"),
    ({"merge_method": "tiess"}, "ties"),
    ({"tokenizer_source": "union"}, "need each model's tokenizer"),
    ({"align": {"method": "activation"}}, "align.method"),
    ({"align": {"refrence": "m0"}}, "align.refrence"),
    ({"models": [{"model": "nowhere"}, {"model": "m1"}]}, "'nowhere' not found"),
    ({"out_dtype": "float8"}, "out_dtype"),
])
def test_bad_recipes_are_refused_naming_the_key(tmp_path, edit, match):
    _llamas(tmp_path, 2)
    recipe = {"merge_method": "slerp", "base_model": "m0", "models": [{"model": "m0"}, {"model": "m1"}],
              "parameters": {"t": 0.5}, **edit}
    file = tmp_path / "r.yml"
    file.write_text(yaml.safe_dump(recipe))
    res = run_cli("merge", "--config", file, "--out", tmp_path / "out", ok=False)
    assert res.exit_code != 0 and match in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_config_and_command_line_rule_options_do_not_mix(tmp_path):
    paths = _llamas(tmp_path, 2)
    file = tmp_path / "r.yml"
    file.write_text(yaml.safe_dump({"merge_method": "linear", "models": [{"model": "m0"}, {"model": "m1"}]}))
    res = run_cli("merge", "--config", file, "--rule", "ties", "--out", tmp_path / "o", ok=False)
    assert res.exit_code != 0 and "--rule comes from the recipe" in res.output
    res = run_cli("merge", *paths, "--config", file, "--out", tmp_path / "o", ok=False)
    assert res.exit_code != 0 and "give no model directories" in res.output


# ------------------------------------------------------------------------------------------ practicalities
def test_dtype_of_the_output(tmp_path):
    a = _save(make("llama", 0).to(torch.float16), tmp_path / "a")
    b = _save(make("llama", 1).to(torch.bfloat16), tmp_path / "b")
    run_cli("merge", a, b, "--align", "none", "--dtype", "float32", "--out", tmp_path / "f32")
    out = _tensors(tmp_path / "f32")
    ta, tb = _tensors(a), _tensors(b)
    k = next(iter(out))
    assert out[k].dtype == torch.float32
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["dtype"] == "float32"
    assert torch.equal(out[k], 0.5 * ta[k].float() + 0.5 * tb[k].float())  # fp16 + bf16 combined in fp32, cast once
    run_cli("merge", a, b, "--align", "none", "--out", tmp_path / "first")  # default: the first model's dtype
    assert torch.equal(_tensors(tmp_path / "first")[k], (0.5 * ta[k].float() + 0.5 * tb[k].float()).half())
    model = T.AutoModelForCausalLM.from_pretrained(tmp_path / "f32")
    assert model.dtype == torch.float32
    res = run_cli("merge", a, b, "--align", "none", "--dtype", "float8", "--out", tmp_path / "bad", ok=False)
    assert res.exit_code != 0 and "--dtype 'float8'" in res.output


def _tokenizer(path: Path, vocab: int) -> None:
    data = {"version": "1.0", "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)},
                                        "unk_token": "t0"}, "added_tokens": []}
    (path / "tokenizer.json").write_text(json.dumps(data))


def test_tokenizer_files_come_from_the_base_and_vocabularies_must_agree(tmp_path):
    a, b = _llamas(tmp_path, 2)
    _tokenizer(a, 50)
    _tokenizer(b, 50)
    (a / "tokenizer.json").write_text((a / "tokenizer.json").read_text().replace('"t0"}', '"t1"}', 1))  # mark A's
    run_cli("merge", a, b, "--align", "none", "--rule", "task_arithmetic", "--base", b, "--out", tmp_path / "o")
    assert (tmp_path / "o" / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    _tokenizer(b, 60)
    res = run_cli("merge", a, b, "--align", "none", "--out", tmp_path / "o2", ok=False)
    assert res.exit_code != 0 and "50 tokens" in res.output and "60 tokens" in res.output
    c = _save(T.LlamaForCausalLM(T.LlamaConfig(**{**make("llama", 0).config.to_dict(), "vocab_size": 64})),
              tmp_path / "c")
    res = run_cli("merge", a, c, "--align", "none", "--out", tmp_path / "o3", ok=False)
    assert res.exit_code != 0 and "vocab_size" in res.output and "64 tokens" in res.output


def _hub_entry(src: Path, hub: Path, name: str, rev: str = "0123abcd") -> Path:
    """A Hugging Face hub cache entry for ``src``: blobs, a snapshot of symlinks, refs/main."""
    entry = hub / f"models--{name.replace('/', '--')}"
    (entry / "blobs").mkdir(parents=True)
    snap = entry / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in src.iterdir():
        blob = entry / "blobs" / f"blob-{f.name}"
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(rev)
    return entry


def test_hugging_face_cache_layouts_are_inputs_and_named_in_the_provenance(tmp_path, monkeypatch):
    a, b = _llamas(tmp_path / "src", 2)
    hub = tmp_path / "hub"
    ea, eb = _hub_entry(a, hub, "org/alpha"), _hub_entry(b, hub, "org/beta")
    run_cli("merge", ea, eb, "--align", "none", "--out", tmp_path / "o")
    rec = json.loads((tmp_path / "o" / "merge.json").read_text())
    assert rec["merged_from"] == ["org/alpha@0123abcd", "org/beta@0123abcd"]
    assert str(tmp_path) not in (tmp_path / "o" / "README.md").read_text()
    ta, tb, out = _tensors(a), _tensors(b), _tensors(tmp_path / "o")
    k = next(iter(out))
    assert torch.equal(out[k], (0.5 * ta[k] + 0.5 * tb[k]))
    # a recipe names hub ids, found in the local cache (HF_HUB_CACHE)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    file = tmp_path / "r.yml"
    file.write_text(yaml.safe_dump({"merge_method": "linear", "models": [{"model": "org/alpha"},
                                                                         {"model": "org/beta@0123abcd"}],
                                     "align": {"method": "none"}}))
    run_cli("merge", "--config", file, "--out", tmp_path / "o2")
    assert all(torch.equal(v, out[k2]) for k2, v in _tensors(tmp_path / "o2").items())
    # two snapshots and no refs/main: ambiguous, named
    (eb / "refs" / "main").unlink()
    shutil.copytree(eb / "snapshots" / "0123abcd", eb / "snapshots" / "fedcba98", symlinks=True)
    res = run_cli("merge", ea, eb, "--align", "none", "--out", tmp_path / "o3", ok=False)
    assert res.exit_code != 0 and "fedcba98" in res.output


# ----------------------------------------------------------------- #17: averaging needs no symmetry spec
def _mamba(seed: int):
    torch.manual_seed(seed)
    cfg = T.MambaConfig(hidden_size=32, num_hidden_layers=2, vocab_size=50, state_size=4, expand=2,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return randomize(T.MambaForCausalLM(cfg), seed)


def test_align_none_merges_a_family_without_a_symmetry_adapter(tmp_path, monkeypatch):
    import modeconn.stream as stream

    a, b = _save(_mamba(0), tmp_path / "a"), _save(_mamba(1), tmp_path / "b")

    def no_spec(*args, **kwargs):
        raise AssertionError("--align none must not build a symmetry spec")

    monkeypatch.setattr(stream, "hf_checkpoint_spec", no_spec)
    run_cli("merge", a, b, "--align", "none", "--weights", "0.25,0.75", "--out", tmp_path / "o")
    ta, tb, out = _tensors(a), _tensors(b), _tensors(tmp_path / "o")
    assert set(out) == set(ta)
    for k in out:
        ref = weighted_average([{k: ta[k]}, {k: tb[k]}], [0.25, 0.75])[k]
        assert torch.equal(out[k], ref), k
    merged = T.AutoModelForCausalLM.from_pretrained(tmp_path / "o")
    assert type(merged).__name__ == "MambaForCausalLM"
    # names and shapes are still checked: a mamba with another width is refused, naming a tensor
    c = _save(randomize(T.MambaForCausalLM(T.MambaConfig(hidden_size=32, num_hidden_layers=2, vocab_size=50,
                                                         state_size=8, expand=2)), 2), tmp_path / "c")
    res = run_cli("merge", a, c, "--align", "none", "--out", tmp_path / "o2", ok=False)
    assert res.exit_code != 0 and "state_size" in res.output


def test_stream_merge_from_the_python_api_writes_config_json(tmp_path):
    """#17 item 5: the API's output loads with from_pretrained as the real architecture, not transformers' default."""
    a, b = _llamas(tmp_path, 2)
    out = mc.stream_merge(None, [a, b], tmp_path / "o")
    assert json.loads((out / "config.json").read_text()) == json.loads((a / "config.json").read_text())
    model = T.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    ta, tb = _tensors(a), _tensors(b)
    k = "lm_head.weight"
    assert torch.equal(model.state_dict()[k], 0.5 * ta[k] + 0.5 * tb[k])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_in_blocks_equals_the_whole_tensor_sum_bit_for_bit(monkeypatch, dtype):
    """A large tensor is averaged block by block (bounded fp32 scratch): the result is the whole-tensor fp32 sum
    cast once, bit for bit, with parameter weights (normalised) as well."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(37, 53, generator=g).to(dtype) for _ in range(3)]
    settings = RuleSettings(model_params=({"weight": 2.0}, {"weight": 1.0}, {"weight": 1.0}), normalize=True)
    for s in (None, settings):
        whole = merge_rules.linear(xs, [0.2, 0.5, 0.3], "k", s)
        monkeypatch.setattr(merge_rules, "LINEAR_BLOCK", 100)  # 20 blocks, the last one partial
        blocks = merge_rules.linear(xs, [0.2, 0.5, 0.3], "k", s)
        monkeypatch.undo()
        assert blocks.dtype == dtype and torch.equal(blocks, whole)
        w = [0.2, 0.5, 0.3] if s is None else [0.5, 0.25, 0.25]
        reference = sum(wi * x.float() for wi, x in zip(w, xs, strict=True))
        torch.testing.assert_close(blocks.float(), reference, atol=0, rtol=torch.finfo(dtype).eps)


def test_linear_in_blocks_reports_an_overflow_only_from_finite_inputs(monkeypatch):
    monkeypatch.setattr(merge_rules, "LINEAR_BLOCK", 10)
    big = torch.full((50,), 60000.0, dtype=torch.float16)
    with pytest.raises(NonFiniteError, match="'k'.*overflows float16"):
        merge_rules.linear([big, big], [1.0, 1.0], "k")
    nan_in = big.clone()
    nan_in[3] = float("nan")  # a non-finite input is returned as made, for the caller to name the model
    out = merge_rules.linear([nan_in, big], [1.0, 1.0], "k")
    assert out.isnan()[3] and out.isinf().sum() == 49
