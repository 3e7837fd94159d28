"""Recipes with tokenizer keys (`tokenizer_source: union | base | <model>`, the `tokenizer:` section, `chat_template`)
equal mergekit 0.1.5's `run_merge` bit for bit: tensors, names, dtypes, config.json's vocab_size and the tokenizer
files; the recipe written beside the output re-runs to the same bytes; alignment composes with the vocabulary.

Tiny sharded Llama / Mistral / Qwen2 checkpoints with real tokenizers (`tokenizers` WordLevel models saved as
PreTrainedTokenizerFast) whose vocabularies differ: B numbers the shared tokens in another order and has a token
and two added tokens A lacks; C another order, the token B adds, and a config vocab_size larger than its tokenizer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import transformers as T
import yaml

from cli_runner import run_cli
from mergekit_parity import run_mergekit
from hf_tiny import randomize
from modeconn.io.lazy import LazyCheckpoint

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

WORDS = ["<unk>", "<s>", "</s>", "<|endoftext|>"] + [f"w{i}" for i in range(30)]
CONFIGS = {"llama": (T.LlamaForCausalLM, T.LlamaConfig), "mistral": (T.MistralForCausalLM, T.MistralConfig),
           "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config)}
SETS = [("llama", torch.float32), ("llama", torch.bfloat16), ("mistral", torch.float32), ("qwen2", torch.float32),
        ("qwen2", torch.bfloat16)]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
SEED = 7
JINJA = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"


def _tokenizer(words: list[str], added: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = T.PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    if added:
        tok.add_tokens(added)
    return tok


def _save(d: Path, family: str, words: list[str], added: list[str], seed: int, dtype, extra_rows: int = 0,
          weights: dict | None = None, tie: bool = False, template: str | None = None) -> Path:
    tok = _tokenizer(words, added)
    model_cls, config_cls = CONFIGS[family]
    cfg = config_cls(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                     num_hidden_layers=2, vocab_size=len(tok) + extra_rows, max_position_embeddings=32,
                     bos_token_id=1, eos_token_id=2, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    model = randomize(model_cls(cfg), seed)
    if weights is not None:
        model.load_state_dict(weights)
    model.to(dtype).save_pretrained(d, max_shard_size="20KB")
    tok.chat_template = template
    tok.save_pretrained(d)
    return d


def _orders(seed: int) -> list[str]:
    rng = random.Random(seed)
    return WORDS[:4] + rng.sample(WORDS[4:], len(WORDS) - 4)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Per (family, dtype): A, B and C (module docstring)."""
    root = tmp_path_factory.mktemp("vocab")
    out = {}
    for family, dtype in SETS:
        d = root / f"{family}-{str(dtype).removeprefix('torch.')}"
        _save(d / "a", family, WORDS, [], 0, dtype)
        _save(d / "b", family, _orders(1) + ["zz"], ["<tool>", "<think>"], 1, dtype)
        _save(d / "c", family, _orders(2)[:20] + ["zz"] + _orders(2)[20:], [], 2, dtype, extra_rows=3)
        _save(d / "d", family, WORDS, [], 3, dtype)
        out[family, dtype] = d
    return out


def _recipe(root: Path, rule: str, names: str, extra: dict) -> dict:
    recipe = {"merge_method": rule, "base_model": str(root / "a"),
              "models": [{"model": str(root / n)} for n in names], **json.loads(json.dumps(extra))}
    if rule == "slerp":
        recipe["parameters"] = {"t": 0.3}
    elif rule == "ties":
        recipe["parameters"] = {"density": 0.5}
        for m, w in zip(recipe["models"], [1.0, 0.7, 0.5], strict=False):
            m["parameters"] = {"weight": w}
    return recipe


def _ours(recipe: dict, out: Path, align: dict | None = None) -> None:
    file = out.parent / f"{out.name}.yml"
    file.write_text(yaml.safe_dump({**recipe, "align": align or {"method": "none"}}, sort_keys=False))
    run_cli("merge", "--config", file, "--seed", SEED, "--out", out)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    ckpt = LazyCheckpoint(path)
    return {k: ckpt[k].clone() for k in ckpt}


def _same_tensors(ours: Path, ref: Path) -> None:
    a, b = _tensors(ours), _tensors(ref)
    assert set(a) == set(b)
    for k in b:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), f"{k}: max |Δ| {float((a[k].float() - b[k].float()).abs().max())}"


def _same_tokenizer(ours: Path, ref: Path) -> None:
    for name in TOKENIZER_FILES:
        assert (ours / name).is_file() == (ref / name).is_file(), name
        if (ref / name).is_file():
            assert (ours / name).read_bytes() == (ref / name).read_bytes(), name
    vocab = [json.loads((d / "config.json").read_text())["vocab_size"] for d in (ours, ref)]
    assert vocab[0] == vocab[1]


def _parity(recipe: dict, tmp_path: Path) -> Path:
    run_mergekit(recipe, tmp_path / "mergekit", SEED, copy_tokenizer=True)
    _ours(recipe, tmp_path / "ours")
    _same_tensors(tmp_path / "ours", tmp_path / "mergekit")
    _same_tokenizer(tmp_path / "ours", tmp_path / "mergekit")
    return tmp_path / "ours"


def _reruns(out: Path, tmp_path: Path) -> None:
    """The written recipe re-runs (models found relative to it) to the same tensors, tokenizer files and recipe."""
    again = tmp_path / "again"
    run_cli("merge", "--config", out / "merge_recipe.yml", "--seed", SEED, "--out", again)
    _same_tensors(again, out)
    _same_tokenizer(again, out)
    assert (again / "merge_recipe.yml").read_bytes() == (out / "merge_recipe.yml").read_bytes()


@pytest.mark.parametrize("family, dtype", SETS, ids=lambda v: str(v).removeprefix("torch."))
def test_union_equals_mergekit(models, tmp_path, family, dtype):
    root = models[family, dtype]
    recipe = _recipe(root, "slerp", "ab", {"tokenizer_source": "union", "chat_template": "chatml"})
    out = _parity(recipe, tmp_path)
    assert json.loads((out / "config.json").read_text())["vocab_size"] == len(WORDS) + 3
    assert _tensors(out)["lm_head.weight"].dtype == dtype
    _reruns(out, tmp_path)


@pytest.mark.parametrize("extra", [
    {"tokenizer_source": "union"},
    {"tokenizer_source": "base"},
    {"tokenizer_source": "B"},
    {"tokenizer": {"source": "union", "pad_to_multiple_of": 8, "tokens": {
        "<think>": {"source": {"kind": "zero"}},
        "w5": {"source": "B", "force": True},
        "<extra>": {"source": {"kind": "model_token", "model": "A", "token": "w1"}},
        "<tool>": {"source": {"kind": "model_token", "model": "B", "token_id": 3}}}}},
], ids=["union", "base", "model", "tokens-section"])
def test_each_tokenizer_key_equals_mergekit(models, tmp_path, extra):
    """Three models (ties, with the base): tokens only B has take B's rows, `zz` (B and C, not the base) the mean of
    theirs; C's padding rows are dropped; `base` truncates B and C to A's vocabulary; a model as the source numbers
    everything as B does; the tokens section adds, zeroes, forces and copies rows and pads to a multiple."""
    root = models["llama", torch.float32]
    text = json.dumps(extra).replace('"B"', json.dumps(str(root / "b"))).replace('"A"', json.dumps(str(root / "a")))
    recipe = _recipe(root, "ties", "abc", json.loads(text))
    out = _parity(recipe, tmp_path)
    _reruns(out, tmp_path)


@pytest.mark.parametrize("template", [JINJA, "mistral"])
def test_chat_template_alone_equals_mergekit(models, tmp_path, template):
    """Models of one vocabulary: the base's tokenizer written again with the template, the rows as they are."""
    out = _parity(_recipe(models["llama", torch.float32], "slerp", "ad", {"chat_template": template}), tmp_path)
    _reruns(out, tmp_path)


def test_tied_embeddings_and_auto_template(tmp_path):
    """Tied input and output embeddings (one stored tensor) in the union; `chat_template: auto` takes the template the
    models have."""
    root = tmp_path / "tied"
    _save(root / "a", "llama", WORDS, [], 0, torch.float32, tie=True)
    _save(root / "b", "llama", _orders(1) + ["zz"], ["<tool>"], 1, torch.float32, tie=True, template=JINJA)
    _save(root / "c", "llama", _orders(2), [], 2, torch.float32, extra_rows=2, tie=True)
    assert "lm_head.weight" not in LazyCheckpoint(root / "a")
    out = _parity(_recipe(root, "ties", "abc", {"tokenizer_source": "union", "chat_template": "auto"}), tmp_path)
    assert (out / "chat_template.jinja").read_text() == JINJA
    _reruns(out, tmp_path)


def test_tokens_section_in_bf16_and_two_models(models, tmp_path):
    root = models["qwen2", torch.bfloat16]
    tokens = {"<tool>": {"source": str(root / "b"), "force": True}, "<new>": {"source": {"kind": "zero"}}}
    recipe = _recipe(root, "slerp", "ab", {"tokenizer": {"tokens": tokens, "pad_to_multiple_of": 16},
                                           "chat_template": "llama3"})
    out = _parity(recipe, tmp_path)
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 48
    _reruns(out, tmp_path)


def test_rows_are_permuted_negative_control(models, tmp_path):
    """Merging B's rows as stored (as if both numbered tokens alike) gives another embedding than mergekit's union:
    the comparison above would see rows that were not permuted."""
    root = models["llama", torch.float32]
    run_mergekit(_recipe(root, "slerp", "ab", {"tokenizer_source": "union"}), tmp_path / "mergekit", SEED, copy_tokenizer=True)
    ref = _tensors(tmp_path / "mergekit")["model.embed_tokens.weight"]
    a, b = (LazyCheckpoint(root / n)["model.embed_tokens.weight"] for n in "ab")
    naive = 0.7 * a + 0.3 * b[: len(a)]
    assert not torch.allclose(ref[: len(a)], naive, atol=1e-3)


def test_alignment_composes_with_the_union(models, tmp_path):
    """B' = B with its hidden units permuted: `align: weight` with the union tokenizer on (A, B') writes what
    `align: none` writes on (A, B) when B is a noisy copy of A (its best alignment is the identity): weight matching
    sees the rows of the output vocabulary, and the row remapping commutes with the hidden permutation."""
    from modeconn.stream import hf_checkpoint_spec, stream_apply

    root = models["llama", torch.float32]
    a = T.AutoModelForCausalLM.from_pretrained(root / "a")
    sd = {k: v + 0.01 * torch.randn(v.shape, generator=torch.Generator().manual_seed(3)) for k, v in a.state_dict().items()}
    words = _orders(1)
    new = {"model.embed_tokens.weight", "lm_head.weight"}
    tok_b = _tokenizer(words, [])
    rows = [WORDS.index(w) for w in words]
    weights = {k: (v[rows] if k in new else v) for k, v in sd.items()}
    b = _save(tmp_path / "b", "llama", words, [], 1, torch.float32, weights=weights)
    assert len(tok_b) == len(rows)
    spec = hf_checkpoint_spec(b)
    g = spec.random_element(generator=torch.Generator().manual_seed(0))
    stream_apply(spec, b, g, tmp_path / "b_perm")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "b_perm" / f).write_bytes((b / f).read_bytes())
    base = {"merge_method": "slerp", "parameters": {"t": 0.4}, "base_model": str(root / "a"),
            "tokenizer_source": "union"}
    _ours({**base, "models": [{"model": str(root / "a")}, {"model": str(b)}]}, tmp_path / "plain")
    _ours({**base, "models": [{"model": str(root / "a")}, {"model": str(tmp_path / "b_perm")}]}, tmp_path / "aligned",
          align={"method": "weight", "restarts": 2})
    _same_tensors(tmp_path / "aligned", tmp_path / "plain")
    # negative control: without the alignment, B' merges to something else
    _ours({**base, "models": [{"model": str(root / "a")}, {"model": str(tmp_path / "b_perm")}]}, tmp_path / "naive")
    assert not torch.equal(_tensors(tmp_path / "naive")["model.norm.weight"], _tensors(tmp_path / "plain")["model.norm.weight"])


@pytest.mark.parametrize("extra, match", [
    ({"tokenizer_source": "union", "tokenizer": {"source": "base"}}, "give one"),
    ({"tokenizer_source": "nowhere"}, "tokenizer_source 'nowhere' is not one of the recipe's models"),
    ({"tokenizer": {"sorce": "union"}}, "tokenizer.sorce"),
    ({"tokenizer": {"pad_to_multiple_of": 0}}, "pad_to_multiple_of"),
    ({"tokenizer": {"tokens": {"<x>": {"source": {"kind": "model_token", "model": "A"}}}}}, "one of token, token_id"),
    ({"tokenizer": {"tokens": {"<x>": {}}}}, "tokenizer.tokens['<x>'] has no source"),
    ({"tokenizer": {"tokens": {"<x>": {"source": "A"}}}}, "does not have the token"),
    ({"chat_template": "chatmlx"}, "chat_template 'chatmlx' is not a built-in template"),
    ({"chat_template": "{{ x }}"}, "neither a template name nor Jinja text"),
    ({"chat_template": ["chatml"]}, "chat_template must be a template name"),
])
def test_bad_tokenizer_keys_are_refused_naming_the_key(models, tmp_path, extra, match):
    root = models["llama", torch.float32]
    text = json.dumps(extra).replace('"A"', json.dumps(str(root / "a")))
    file = tmp_path / "r.yml"
    names = "ab" if "tokenizer_source" in extra or "tokenizer" in extra else "ad"
    file.write_text(yaml.safe_dump({**_recipe(root, "slerp", names, json.loads(text)), "align": {"method": "none"}}))
    res = run_cli("merge", "--config", file, "--out", tmp_path / "out", ok=False)
    assert res.exit_code != 0 and match in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_model_token_rows_with_alignment_are_refused(models, tmp_path):
    root = models["llama", torch.float32]
    tokens = {"<x>": {"source": {"kind": "model_token", "model": str(root / "a"), "token": "w1"}}}
    file = tmp_path / "r.yml"
    file.write_text(yaml.safe_dump({**_recipe(root, "slerp", "ab", {"tokenizer": {"tokens": tokens}}),
                                    "align": {"method": "weight"}}))
    res = run_cli("merge", "--config", file, "--out", tmp_path / "out", ok=False)
    assert res.exit_code != 0 and "tokenizer.tokens['<x>'].source" in res.output and "align" in res.output
