"""Reach, round 2 (#34): the model types users hold beyond the first family tables.

The tested transformers range (the installed release — what a fresh install gets — lies inside what pyproject.toml
states); CLIP's vision tower on transformers 5's module tree; multimodal wrappers refused with a reason that names
the language model inside, in memory and from a checkpoint directory; streaming equal to in memory for the new
encoders and vision towers (the new decoders: test_hf_families.py's DECODERS). Spec validity, random elements,
planted recovery, negative controls and the richer groups run with every family of ``hf_tiny.TINY`` in
test_hf_adapters.py; absorption and the full group (or its refusal) in test_hf_families.py.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import torch
import transformers as T
from cli_runner import run_cli
from hf_tiny import make, max_diff, outputs

import modeconn as mc
from modeconn.errors import UnsupportedOperationError
from modeconn.io.hf import side_files
from modeconn.stream import hf_checkpoint_spec, stream_apply, stream_weight_matching
from modeconn.symmetry import hf

pytestmark = pytest.mark.usefixtures("one_thread")
T.logging.set_verbosity_error()

REPO = Path(__file__).resolve().parents[1]
_TEXT = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
         "num_hidden_layers": 2, "vocab_size": 50, "max_position_embeddings": 32, "pad_token_id": 0}
_VISION = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64, "num_hidden_layers": 2,
           "image_size": 8, "patch_size": 4}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def test_the_installed_transformers_is_inside_the_stated_range():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("transformers"))
    lower = re.search(r">=([\d.]+)", spec).group(1)
    upper = re.search(r"<([\d.]+)", spec).group(1)
    assert _version(lower) <= _version(T.__version__) < _version(upper), (spec, T.__version__)


@pytest.mark.parametrize("name", ["clip_vision", "clip_vision_proj"])
def test_clip_vision_tower_on_the_installed_module_tree(name):
    model = make(name)
    spec = hf.hf_symmetry_spec(model)
    assert spec.structure.family == "clip_vision_model"
    assert "residual" not in spec.spaces  # the stream is the model's output: frozen by default
    spec = hf.hf_symmetry_spec(model, permute_outputs=True)
    assert "residual" in spec.spaces


WRAPPERS = {
    "llava": lambda: T.LlavaForConditionalGeneration(T.LlavaConfig(
        vision_config=_VISION, text_config={"model_type": "llama", **_TEXT}, image_token_index=1)),
    "gemma3": lambda: T.Gemma3ForConditionalGeneration(T.Gemma3Config(
        text_config={"head_dim": 8, "sliding_window": 4, **_TEXT}, vision_config=_VISION, mm_tokens_per_image=4)),
    "mistral3": lambda: T.Mistral3ForConditionalGeneration(T.Mistral3Config(
        vision_config={"model_type": "pixtral", "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
                       "num_hidden_layers": 2, "image_size": 8, "patch_size": 4, "head_dim": 8},
        text_config={"model_type": "mistral", "head_dim": 8, **_TEXT}, image_token_index=1)),
}


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_multimodal_wrappers_are_refused_naming_the_language_model(name, tmp_path):
    torch.manual_seed(0)
    model = WRAPPERS[name]()
    why = r"composite model holding .*language model 'model.language_model'"
    with pytest.raises(UnsupportedOperationError, match=why):
        hf.hf_symmetry_spec(model)
    model.save_pretrained(tmp_path / "a")
    with pytest.raises(UnsupportedOperationError, match=why):
        hf_checkpoint_spec(tmp_path / "a")
    res = run_cli("align", tmp_path / "a", tmp_path / "a", "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "composite model" in res.output and "object has no attribute" not in res.output
    inner = model.model.language_model  # the language model alone is supported (registered or inferred)
    spec = hf.hf_symmetry_spec(inner, permute_outputs=True)
    assert "residual" in spec.spaces


# ------------------------------------------------------------------ streaming equals in memory (encoders, vision)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["xlm_roberta", "xlm_roberta_mlm", "clip_vision_proj"])
def test_streaming_equals_in_memory_and_outputs_load(name, tmp_path):
    ma, mb = make(name, 0), make(name, 1)
    da, db = tmp_path / "a", tmp_path / "b"
    for m, d in ((ma, da), (mb, db)):
        m.save_pretrained(d, max_shard_size="20KB")
    spec_m, spec_c = hf.hf_symmetry_spec(ma), hf_checkpoint_spec(da)
    ref = mc.weight_matching(spec_m, ma.state_dict(), mb.state_dict(), restarts=1, max_iter=5)
    res = stream_weight_matching(spec_c, da, db, restarts=1, max_iter=5)
    assert all(torch.equal(res.element[s], ref.element[s]) for s in ref.element)
    aligned = tmp_path / "aligned"
    stream_apply(spec_c, db, res.element, aligned, files=side_files(db))
    back = type(mb).from_pretrained(aligned).eval()
    x = hf.example_inputs(mb)
    assert max_diff(outputs(back, x), outputs(mb, x)) < 1e-4
