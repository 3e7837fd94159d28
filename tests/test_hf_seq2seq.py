"""Encoder–decoders (T5, mT5, UMT5, BART, mBART, Whisper): two residual streams joined by cross-attention.

Spec validity, random elements (every parameter perturbed), planted recovery, the richer groups and the dropped-FFN
control run over hf_tiny.TINY in test_hf_adapters.py. Here: streaming equal to in memory with ``from_pretrained`` of
the aligned and merged outputs, the CLI, and negative controls for what the adapter states — cross-attention's K/V
read the encoder stream, a tied token table joins the two streams, T5's relative position bias freezes
self-attention's heads (cross-attention's stay free), post-norm refuses the orthogonal stream.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers as T
from cli_runner import run_cli
from hf_tiny import BART, loaded, make, max_diff, outputs

import modeconn as mc
from modeconn.errors import SpecError, UnsupportedOperationError
from modeconn.io.hf import side_files
from modeconn.stream import hf_checkpoint_spec, stream_apply, stream_merge, stream_weight_matching
from modeconn.symmetry import hf

pytestmark = pytest.mark.usefixtures("one_thread")
T.logging.set_verbosity_error()


def _changes(model, spec, g=None) -> float:
    x = hf.example_inputs(model)
    g = spec.random_element(seed=0) if g is None else g
    return max_diff(outputs(model, x), outputs(loaded(model, spec.apply(model.state_dict(), g)), x))


@pytest.mark.parametrize("name", ["t5", "bart_untied", "mbart", "whisper", "pegasus"])
def test_streaming_equals_in_memory_and_aligned_and_merged_outputs_load(name, tmp_path):
    """B is a planted element of A: streamed matching finds what in-memory matching finds; the aligned B and the
    merge of A with it load with ``from_pretrained`` and compute A's logits."""
    ma = make(name, 0)
    spec_m = hf.hf_symmetry_spec(ma)
    mb = loaded(ma, spec_m.apply(ma.state_dict(), spec_m.random_element(seed=5)))
    da, db = tmp_path / "a", tmp_path / "b"
    for m, d in ((ma, da), (mb, db)):
        m.save_pretrained(d, max_shard_size="20KB")
    spec_c = hf_checkpoint_spec(da)
    assert set(spec_c.spaces) == set(spec_m.spaces)
    ref = mc.weight_matching(spec_m, ma.state_dict(), mb.state_dict(), restarts=1)
    res = stream_weight_matching(spec_c, da, db, restarts=1)
    assert all(torch.equal(res.element[s], ref.element[s]) for s in ref.element)
    x = hf.example_inputs(ma)
    aligned, merged = tmp_path / "aligned", tmp_path / "merged"
    stream_apply(spec_c, db, res.element, aligned, files=side_files(db))
    assert max_diff(outputs(type(ma).from_pretrained(aligned), x), outputs(ma, x)) < 1e-4
    stream_merge(spec_c, [da, db], merged, elements=[None, res.element], files=side_files(da))
    assert max_diff(outputs(type(ma).from_pretrained(merged), x), outputs(ma, x)) < 1e-4


def test_cli_align_and_merge_of_an_encoder_decoder(tmp_path):
    ma = make("bart", 0)
    spec = hf.hf_symmetry_spec(ma)
    mb = loaded(ma, spec.apply(ma.state_dict(), spec.random_element(seed=2)))
    for m, d in ((ma, tmp_path / "a"), (mb, tmp_path / "b")):
        m.save_pretrained(d)
    run_cli("merge", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "m")
    x = hf.example_inputs(ma)
    assert max_diff(outputs(T.BartForConditionalGeneration.from_pretrained(tmp_path / "m"), x), outputs(ma, x)) < 1e-4


def _kv_read_by_the_decoder(st):
    """The structure with cross-attention's K/V columns moved from the encoder stream to the decoder's."""
    cross = {s for a in st.attentions if "encoder_attn" in a.path for kv in a.kv_heads for s in (*kv.k, *kv.v)}
    keys = {s.key for s in cross}
    enc = st.encoder_stream
    moved = tuple(s for s in enc.readers if s.key in keys)
    assert moved
    return dataclasses.replace(
        st, encoder_stream=dataclasses.replace(enc, readers=tuple(s for s in enc.readers if s.key not in keys)),
        stream=dataclasses.replace(st.stream, readers=(*st.stream.readers, *moved)))


@pytest.mark.parametrize("name", ["bart_untied", "whisper"])
def test_cross_attention_keys_and_values_read_the_encoder_stream(name):
    model = make(name)
    spec = hf.hf_symmetry_spec(model)
    assert {"residual", "encoder.residual"} <= set(spec.spaces)
    assert _changes(model, spec) < 1e-4
    wrong = hf.build_spec(_kv_read_by_the_decoder(hf.describe(model)), model.state_dict())
    assert _changes(model, wrong) > 1e-3
    # the two streams are independent spaces: moving only the decoder's keeps the logits
    g = spec.identity() | {"residual": spec.random_element(seed=1)["residual"]}
    assert _changes(model, spec, g) < 1e-4


@pytest.mark.parametrize("name", ["t5", "bart", "mbart"])
def test_a_tied_token_table_joins_the_two_streams(name):
    """Tied encoder/decoder embeddings: one space for both streams. Described as two, the builder refuses the tie;
    without the tie check the split changes the logits."""
    model = make(name)
    spec = hf.hf_symmetry_spec(model)
    assert "encoder.residual" not in spec.spaces
    st = hf.describe(model)
    enc_keys = {k for k in model.state_dict() if ".encoder." in f".{k}" or k.startswith(("shared", "model.shared"))}
    split = dataclasses.replace(
        st, stream=dataclasses.replace(st.stream, writers=tuple(s for s in st.stream.writers if s.key not in enc_keys),
                                       readers=tuple(s for s in st.stream.readers if s.key not in enc_keys),
                                       norms=tuple(n for n in st.stream.norms if n.weight not in enc_keys)),
        encoder_stream=dataclasses.replace(st.stream, writers=tuple(s for s in st.stream.writers if s.key in enc_keys),
                                           readers=tuple(s for s in st.stream.readers if s.key in enc_keys),
                                           norms=tuple(n for n in st.stream.norms if n.weight in enc_keys)))
    with pytest.raises(SpecError, match="tied"):
        hf.build_spec(split, model.state_dict())
    wrong = hf.build_spec(dataclasses.replace(split, aliases={}), model.state_dict())
    assert _changes(model, wrong) > 1e-3


@pytest.mark.parametrize("name", ["t5", "umt5"])
def test_t5_relative_position_bias_freezes_self_attention_heads_only(name):
    groups = {"heads": "permutation", "qk": "head_orthogonal", "vo": "head_orthogonal"}
    model = make(name)
    spec = hf.hf_symmetry_spec(model, groups)
    heads = [s for s in spec.spaces if s.endswith(".heads")]
    assert heads and all("EncDecAttention" in s for s in heads)  # cross-attention has no position bias
    assert _changes(model, spec) < 1e-4
    st = hf.describe(model)
    free = dataclasses.replace(st, attentions=tuple(dataclasses.replace(a, frozen_roles=()) for a in st.attentions))
    assert _changes(model, hf.build_spec(free, model.state_dict(), groups)) > 1e-3


def test_post_norm_bart_has_no_orthogonal_stream():
    model = make("bart")
    with pytest.raises(SpecError, match="post-norm"):
        hf.hf_symmetry_spec(model, {"residual": "orthogonal"})
    with pytest.raises(UnsupportedOperationError, match="encoder–decoder"):
        mc.absorb_normalization(model)


def test_sinusoidal_positions_outside_the_checkpoint_are_refused():
    """Marian's sinusoidal tables are not saved (rebuilt on load), M2M-100's are a buffer: a permuted stream would meet
    them in the original channel order after loading."""
    for model in (T.MarianMTModel(T.MarianConfig(max_position_embeddings=32, **BART)),
                  T.M2M100ForConditionalGeneration(T.M2M100Config(max_position_embeddings=32, **BART))):
        with pytest.raises(UnsupportedOperationError, match="sinusoidal position embeddings .* recomputed"):
            hf.hf_symmetry_spec(model)
