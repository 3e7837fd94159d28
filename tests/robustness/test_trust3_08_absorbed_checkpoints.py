"""Trust round 3, class 8 — absorbed checkpoints masquerade as stock; malformed absorbed configs.

A full-group (normalization-absorbed) output was loaded by stock ``from_pretrained`` as a stock model of its family
computing other logits (the affine norms rebuilt, the added biases dropped: only a load report). Absorbed checkpoints
are now marked so that every stock loader refuses them — ``config.json`` ``model_type`` is ``modeconn-absorbed``
(``AutoConfig`` / ``AutoModel*`` / ``pipeline`` raise) and the weights are ``modeconn-absorbed*.safetensors`` (a
family class's own ``from_pretrained`` finds no weights) — and outputs made from absorbed inputs stay marked.
:func:`~modeconn.symmetry.absorb.read_absorbed_config` is the one reader (``load_absorbed``, ``hf_checkpoint_spec``,
``open_checkpoint``): every field it reads is checked, a malformed one is a ConfigError naming the file and the field,
and the absorption record must be the one absorption writes for the model the config describes. The config records
a name, never a machine path, as ``_name_or_path``.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers as T
from hf_tiny import make

import modeconn as mc
from modeconn.checkpoints import open_checkpoint
from modeconn.errors import CheckpointError, ConfigError
from modeconn.io.lazy import ABSORBED_STEM, LazyCheckpoint
from modeconn.recipes.hf_stream import align_hf_full_group, merge_hf_checkpoints
from modeconn.stream import hf_checkpoint_spec
from modeconn.symmetry.hf import FULL_GROUPS
from modeconn.symmetry.absorb import ABSORBED_FORMAT, ABSORBED_KEY, ABSORBED_MODEL_TYPE, load_absorbed, save_absorbed
from modeconn.symmetry.absorb_stream import stream_absorb

io_stream_mod = importlib.import_module("modeconn.io.lazy")
absorb_stream_mod = importlib.import_module("modeconn.symmetry.absorb_stream")

X = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
FAMILY = {"llama": T.LlamaForCausalLM, "gpt_neox": T.GPTNeoXForCausalLM}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Absorbed checkpoints of every writer: save_absorbed (RMSNorm family, one file), stream_absorb (LayerNorm family,
    sharded), ``align --groups full`` (a/, b/) and streaming merges of absorbed inputs (as they are; sharded, cast
    to bf16). Returns ``{name: (directory, family, reference model or None)}``."""
    root = tmp_path_factory.mktemp("absorbed")
    llama = mc.absorb_normalization(make("llama", 0))
    save_absorbed(llama, root / "saved")
    for seed in (0, 1):
        make("gpt_neox", seed).save_pretrained(root / f"neox{seed}")
    stream_absorb(root / "neox0", root / "streamed", max_shard_bytes=20_000)
    stream_absorb(root / "neox1", root / "streamed1", max_shard_bytes=20_000)
    align_hf_full_group(root / "neox0", root / "neox1", root / "full", restarts=1, max_iter=2)
    merge_hf_checkpoints([root / "full" / "a", root / "full" / "b"], root / "merged", align="none")
    merge_hf_checkpoints([root / "streamed", root / "streamed1"], root / "merged-bf16", align="none",
                         out_dtype=torch.bfloat16)  # sharded inputs, another dtype: the layout rewritten
    neox = mc.absorb_normalization(make("gpt_neox", 0))
    return {"saved": (root / "saved", "llama", llama), "streamed": (root / "streamed", "gpt_neox", neox),
            "full-a": (root / "full" / "a", "gpt_neox", neox), "full-b": (root / "full" / "b", "gpt_neox", None),
            "merged": (root / "merged", "gpt_neox", None), "merged-bf16": (root / "merged-bf16", "gpt_neox", None)}


def stock_loads(d: Path, family: str) -> list[str]:
    """The stock transformers loaders that load ``d`` (instead of raising: unknown model type, no weights file)."""
    loaders = {
        "AutoConfig": T.AutoConfig.from_pretrained,
        "AutoModel": T.AutoModel.from_pretrained,
        "AutoModelForCausalLM": T.AutoModelForCausalLM.from_pretrained,
        FAMILY[family].__name__: FAMILY[family].from_pretrained,
        "pipeline": lambda d: T.pipeline("text-generation", model=d),
    }
    loaded = []
    for name, load in loaders.items():
        try:
            load(str(d))
        except (ValueError, OSError):
            continue
        loaded.append(name)
    return loaded


# ------------------------------------------------------------------------------------------ marked for stock
ALL = ["saved", "streamed", "full-a", "full-b", "merged", "merged-bf16"]


@pytest.mark.parametrize("name", ALL)
def test_every_stock_loader_refuses_an_absorbed_checkpoint(written, name):
    d, family, _ = written[name]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == ABSORBED_MODEL_TYPE and cfg[ABSORBED_KEY]["original_model_type"] == family
    assert not (d / "model.safetensors").exists() and not (d / "model.safetensors.index.json").exists()
    assert LazyCheckpoint(d).stem == ABSORBED_STEM
    assert stock_loads(d, family) == []


def test_the_family_config_is_not_taken_from_the_record(written):
    """transformers ≥ 5 builds a family config from a nested object whose model_type matches: the record must not
    be one (it would build the family's default, billions of parameters, before failing)."""
    d, family, _ = written["saved"]
    assert T.LlamaConfig.from_pretrained(str(d)).hidden_size == 32


@pytest.mark.parametrize("name", ALL)
def test_modeconn_reads_every_absorbed_checkpoint(written, name):
    d, _, ref = written[name]
    model = load_absorbed(d)
    assert open_checkpoint(d).kind.name == "absorbed"
    assert set(hf_checkpoint_spec(d, FULL_GROUPS).spaces)
    if ref is not None:
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=X).logits, ref.eval()(input_ids=X).logits, atol=1e-5, rtol=1e-5)


def test_no_machine_path_is_recorded(written, tmp_path):
    for d, _, _ in written.values():
        name = json.loads((d / "config.json").read_text())["_name_or_path"]
        assert not Path(name).is_absolute() and str(d.parent.parent) not in name, name
    make("llama", 0).save_pretrained(tmp_path / "my-llama")
    loaded = T.LlamaForCausalLM.from_pretrained(str(tmp_path / "my-llama"))  # _name_or_path: the absolute path
    save_absorbed(mc.absorb_normalization(loaded), tmp_path / "abs")
    assert json.loads((tmp_path / "abs" / "config.json").read_text())["_name_or_path"] == "my-llama"


def test_weights_named_against_the_config_are_refused(written, tmp_path):
    d = shutil.copytree(written["saved"][0], tmp_path / "renamed")
    (d / f"{ABSORBED_STEM}.safetensors").rename(d / "model.safetensors")  # what stock transformers would load
    for read in (load_absorbed, hf_checkpoint_spec):
        with pytest.raises(CheckpointError, match="model.safetensors"):
            read(d)
    stock = tmp_path / "stock"
    make("llama", 0).save_pretrained(stock)
    (stock / "model.safetensors").rename(stock / f"{ABSORBED_STEM}.safetensors")
    with pytest.raises(CheckpointError, match=ABSORBED_STEM):
        hf_checkpoint_spec(stock)


# ------------------------------------------------------------------------------------------ malformed configs
def _record(cfg):
    return cfg[ABSORBED_KEY]


def _set(field, value):
    def edit(cfg):
        _record(cfg)[field] = value
    return edit


def _drop(field):
    return lambda cfg: _record(cfg).pop(field)


def _top(field, value):
    return lambda cfg: cfg.__setitem__(field, value)


def _norm(value):
    def edit(cfg):
        norms = _record(cfg)["norms"]
        norms[next(iter(norms))] = value
    return edit


def _norm_path(path):
    def edit(cfg):
        norms = _record(cfg)["norms"]
        norms[path] = norms.pop(next(iter(norms)))
    return edit


MALFORMED = {  # id: (edit of config.json, the field the error must name)
    "record-not-object": (_top(ABSORBED_KEY, [1, 2]), ABSORBED_KEY),
    "record-null": (_top(ABSORBED_KEY, None), ABSORBED_KEY),
    "format-missing": (_drop("format"), "format"),
    "format-string": (_set("format", str(ABSORBED_FORMAT)), "format"),
    "format-bool": (_set("format", True), "format"),
    "format-unknown": (_set("format", 99), "format"),
    "format-1": (_set("format", 1), "format"),
    "original-missing": (_drop("original_model_type"), "original_model_type"),
    "original-int": (_set("original_model_type", 7), "original_model_type"),
    "original-unknown": (_set("original_model_type", "no-such-model"), "original_model_type"),
    "norms-missing": (_drop("norms"), "norms"),
    "norms-list": (_set("norms", ["model.norm"]), "norms"),
    "norms-empty": (_set("norms", {}), "norms"),
    "norms-entry-string": (_norm("32"), "norms"),
    "norms-size-zero": (_norm([0, 1e-6]), "norms"),
    "norms-eps-negative": (_norm([32, -1.0]), "norms"),
    "norms-eps-string": (_norm([32, "1e-6"]), "norms"),
    "norms-path-of-a-linear": (_norm_path("model.layers.0.self_attn.q_proj"), "norms"),
    "norms-path-of-nothing": (_norm_path("model.no.such.module"), "norms"),
    "biased-not-list": (_set("biased", "lm_head"), "biased"),
    "biased-entry-int": (_set("biased", [3]), "biased"),
    "biased-path-of-an-embedding": (_set("biased", ["model.embed_tokens"]), "biased"),
    "untied-not-list": (_set("untied", {"lm_head.weight": 1}), "untied"),
    "untied-missing": (_drop("untied"), "untied"),
    "atol-string": (_set("atol", "1e-5"), "atol"),
    "atol-negative": (_set("atol", -1.0), "atol"),
    "streamed-string": (_set("streamed", "yes"), "streamed"),
    "model-type-stock": (_top("model_type", "llama"), "model_type"),
    "model-type-missing": (lambda cfg: cfg.pop("model_type"), "model_type"),
    "architectures-string": (_top("architectures", "LlamaForCausalLM"), "architectures"),
    "architectures-int": (_top("architectures", [1]), "architectures"),
    "architectures-empty": (_top("architectures", []), "architectures"),
    "architectures-not-transformers": (_top("architectures", ["os"]), "architectures"),
    "architectures-other-family": (_top("architectures", ["BertModel"]), "architectures"),
    "tie-word-embeddings-true": (_top("tie_word_embeddings", True), "tie_word_embeddings"),
    "hidden-size-string": (_top("hidden_size", "32"), "hidden_size"),
    "layers-negative": (_top("num_hidden_layers", -2), "num_hidden_layers"),
}


def _readers(d: Path):
    return {"load_absorbed": lambda: load_absorbed(d), "hf_checkpoint_spec": lambda: hf_checkpoint_spec(d),
            "open_checkpoint().load": lambda: open_checkpoint(d).load()}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_absorbed_config_is_a_config_error_naming_the_field(written, tmp_path, case):
    edit, field = MALFORMED[case]
    d = shutil.copytree(written["saved"][0], tmp_path / case)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    for reader, read in _readers(d).items():
        with pytest.raises(ConfigError) as err:  # never KeyError / TypeError / AttributeError / RuntimeError
            read()
        assert str(d / "config.json") in str(err.value) and field in str(err.value), (reader, str(err.value))


def test_the_readers_agree_on_the_format_version(written, tmp_path):
    d = shutil.copytree(written["saved"][0], tmp_path / "next")
    cfg = json.loads((d / "config.json").read_text())
    assert _record(cfg)["format"] == ABSORBED_FORMAT
    _record(cfg)["format"] = ABSORBED_FORMAT + 1
    (d / "config.json").write_text(json.dumps(cfg))
    for read in _readers(d).values():
        with pytest.raises(ConfigError, match="unknown format version"):
            read()


# --------------------------------------------------------------------------------------------- negative control
def test_negative_control_without_the_mark_stock_transformers_loads_another_function(tmp_path, monkeypatch):
    """``align --groups full`` written with the stock model type and weights name (format 1, as before this class was
    closed): every stock loader takes b/, and GPT-NeoX's own class computes other logits than B (the affine
    LayerNorms rebuilt on a rotated stream, the added biases dropped) — the issue's masquerade."""
    def unmarked(config, note, architecture, name):  # the writer before this class was closed
        return {**config, ABSORBED_KEY: note, "tie_word_embeddings": False, "architectures": [architecture]}

    monkeypatch.setattr(absorb_stream_mod, "absorbed_config_json", unmarked)
    monkeypatch.setattr(io_stream_mod, "ABSORBED_STEM", "model")
    for seed in (0, 1):
        make("gpt_neox", seed).save_pretrained(tmp_path / f"neox{seed}")
    align_hf_full_group(tmp_path / "neox0", tmp_path / "neox1", tmp_path / "full", restarts=1, max_iter=2)
    b = tmp_path / "full" / "b"
    assert stock_loads(b, "gpt_neox") == ["AutoConfig", "AutoModel", "AutoModelForCausalLM", "GPTNeoXForCausalLM",
                                          "pipeline"]
    stock = T.GPTNeoXForCausalLM.from_pretrained(str(b)).eval()
    with torch.no_grad():
        assert (stock(input_ids=X).logits - make("gpt_neox", 1)(input_ids=X).logits).abs().max() > 1e-2
