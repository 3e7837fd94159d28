"""Streaming alignment of checkpoints larger than memory (issue #8): lazy sharded checkpoints, streaming weight
matching, apply and merge written shard by shard, Hugging Face directories on the command line.

Every checkpoint here is a tiny Hugging Face model saved with ``save_pretrained(max_shard_size="20KB")``, so it
really is sharded (5–7 shards and an index). Memory is measured in benchmarks/bench_stream_wm.py, never here."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runner import run_cli
from hf_tiny import make
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from scipy.optimize import linear_sum_assignment

import modeconn as mc
from modeconn._util.outdir import MARKER
from modeconn.errors import CheckpointError, ConfigError, NonFiniteError, SpecError, StateDictMismatchError
from modeconn.io.lazy import INDEX_NAME, LazyCheckpoint, ShardLayout, write_like
from modeconn.match.lap import solve_lap
from modeconn.match.weight import _Problem, _Stream
from modeconn.path.interpolate import weighted_average
from modeconn.io.hf import is_hf_checkpoint, side_files
from modeconn.stream import hf_checkpoint_spec, stream_apply, stream_merge, stream_weight_matching
from modeconn.symmetry.hf.directory import check_same_hf_configs
from modeconn.symmetry.hf import hf_symmetry_spec

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ["gpt_neox", "gpt2", "llama", "llama_tied_mqa"]
SHARD = "20KB"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """``pair(name, dtype)`` → (dir A, dir B, model A, model B), saved once per module (models in ``dtype``)."""
    root = tmp_path_factory.mktemp("hf")
    cache: dict = {}

    def get(name: str, dtype: torch.dtype = torch.float32):
        if (name, dtype) not in cache:
            models = [make(name, seed).to(dtype) for seed in (0, 1)]
            dirs = [root / f"{name}-{str(dtype)[6:]}-{s}" for s in "ab"]
            for m, d in zip(models, dirs, strict=False):
                m.save_pretrained(d, max_shard_size=SHARD)
            cache[name, dtype] = (*dirs, *models)
        return cache[name, dtype]

    return get


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != MARKER}  # the ownership marker differs by design (command, time)


def renamed(sd: dict, spec_ckpt, spec_model) -> dict:
    """A model state dict under the checkpoint's tensor names (GPT-NeoX: lm_head.weight ↔ embed_out.weight)."""
    names = stored_names(spec_model, spec_ckpt)
    return {names[k]: v for k, v in sd.items()}


def stored_names(spec_model, spec_ckpt) -> dict[str, str]:
    """Model key → checkpoint key: the same name but for transformers' save-time renamings (one tensor per space
    binding pattern: ``embed_out.weight`` is the only GPT-NeoX key the model calls otherwise)."""
    lone = [k for k in spec_model.tensors if k not in spec_ckpt.tensors]
    stored = [k for k in spec_ckpt.tensors if k not in spec_model.tensors]
    assert len(lone) == len(stored) <= 1, (lone, stored)
    return {**{k: k for k in spec_model.tensors}, **dict(zip(lone, stored, strict=True))}


def loaded_like(model, out: Path):
    return type(model).from_pretrained(out).eval()


def logits(model, seed: int = 0) -> torch.Tensor:
    x = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.float().eval()(input_ids=x).logits


# ------------------------------------------------------------------------------------- lazy checkpoints
@pytest.mark.parametrize("name", FAMILIES)
def test_lazy_checkpoint_reads_every_shard(pair, name):
    da, _, ma, _ = pair(name)
    index = json.loads((da / INDEX_NAME).read_text())
    ckpt = LazyCheckpoint(da)
    assert ckpt.sharded and len(ckpt.shards) > 2, "the fixture must really be sharded"
    assert list(ckpt) == list(index["weight_map"]) and len(ckpt) == len(index["weight_map"])
    for shard in ckpt.shards:
        for k, t in load_file(da / shard).items():
            assert ckpt.infos[k].shard == shard and torch.equal(ckpt[k], t)
            assert ckpt.meta()[k].shape == t.shape and ckpt.meta()[k].dtype == t.dtype and ckpt.meta()[k].is_meta
    assert ckpt.nbytes == index["metadata"]["total_size"]
    assert "LazyCheckpoint" in repr(ckpt) and "shard" in repr(ckpt)
    with pytest.raises(TypeError):
        ckpt["x"] = torch.zeros(1)  # read-only
    with pytest.raises(KeyError):
        ckpt["no.such.tensor"]
    single = da.parent / f"{da.name}-single"
    ma.save_pretrained(single)  # default shard size: one model.safetensors
    one = LazyCheckpoint(single)
    assert not one.sharded and list(one.shards) == ["model.safetensors"] and set(one) == set(ckpt)


def test_shard_layout_plan_writes_a_checkpoint_transformers_loads(pair, tmp_path):
    """New tensors laid out like save_pretrained (the benchmark writes 1B-parameter checkpoints this way)."""
    da, _, ma, _ = pair("llama")
    sd = LazyCheckpoint(da)
    layout = ShardLayout.plan({k: (sd.infos[k].dtype, sd.infos[k].shape) for k in sd}, max_shard_bytes=30_000)
    assert len(layout.shards) > 2 and layout.index["metadata"]["total_size"] == sd.nbytes
    out = write_like(tmp_path / "planned", layout, sd.__getitem__, files={"config.json": da / "config.json"})
    again = LazyCheckpoint(out)
    assert again.layout.shards == layout.shards and all(torch.equal(again[k], sd[k]) for k in sd)
    torch.testing.assert_close(logits(loaded_like(ma, out)), logits(ma))
    one = ShardLayout.plan({"x": (torch.float16, (3, 4))}, max_shard_bytes=1)
    assert list(one.shards) == ["model.safetensors"] and one.index is None
    with pytest.raises(ConfigError):
        ShardLayout.plan({}, max_shard_bytes=0)


def test_missing_shard_is_named(pair, tmp_path):
    da = pair("gpt_neox")[0]
    broken = tmp_path / "broken"
    shutil.copytree(da, broken)
    victim = sorted(broken.glob("model-*.safetensors"))[2]
    victim.unlink()
    with pytest.raises(CheckpointError, match=f"missing on disk: {victim.name}"):
        LazyCheckpoint(broken)
    with pytest.raises(CheckpointError, match=victim.name):
        hf_checkpoint_spec(broken)


def test_truncated_shard_is_named(pair, tmp_path):
    da = pair("llama")[0]
    broken = tmp_path / "broken"
    shutil.copytree(da, broken)
    opened = LazyCheckpoint(broken)
    victim = sorted(broken.glob("model-*.safetensors"))[1]
    with open(victim, "r+b") as fh:
        fh.truncate(victim.stat().st_size - 100)
    with pytest.raises(CheckpointError, match=f"{victim.name}: not a valid safetensors file \\(truncated"):
        LazyCheckpoint(broken)
    key = opened.shards[victim.name][0]  # truncated after opening: named on access, with the key
    with pytest.raises(CheckpointError, match=f"{victim.name}: reading tensor {key!r} failed"):
        opened[key]


def test_index_inconsistencies_are_named(pair, tmp_path):
    da = pair("gpt2")[0]
    index = json.loads((da / INDEX_NAME).read_text())
    key = next(iter(index["weight_map"]))
    shards = sorted(set(index["weight_map"].values()))
    cases = {
        "wrong_shard": ({**index, "weight_map": {**index["weight_map"], key: next(s for s in shards
                                                                                if s != index["weight_map"][key])}},
                        f"{key!r}"),
        "path_in_name": ({**index, "weight_map": {**index["weight_map"], key: "../x.safetensors"}}, "plain"),
        "unlisted": ({**index, "weight_map": {k: v for k, v in index["weight_map"].items() if k != key}},
                     "does not list"),
        "no_map": ({"metadata": {}}, "weight_map"),
    }
    for case, (idx, message) in cases.items():
        d = tmp_path / case
        shutil.copytree(da, d)
        (d / INDEX_NAME).write_text(json.dumps(idx))
        with pytest.raises(CheckpointError, match=message):
            LazyCheckpoint(d)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="pickle"):
        LazyCheckpoint(tmp_path / "empty")


# ------------------------------------------------------------------------------------- spec on meta
@pytest.mark.parametrize("name", FAMILIES)
def test_spec_from_config_on_meta_equals_the_model_spec(pair, name):
    da, _, ma, _ = pair(name)
    spec = hf_checkpoint_spec(da)
    ref = hf_symmetry_spec(ma)
    assert spec.spaces == ref.spaces
    names = stored_names(ref, spec)
    assert {names[k]: v for k, v in ref.tensors.items()} == dict(spec.tensors)
    assert {names[a]: names[p] for a, p in ref.aliases.items()} == dict(spec.aliases)
    if name == "gpt_neox":  # transformers 5 loads embed_out.weight as lm_head.weight; the spec uses the file's name
        assert "embed_out.weight" in spec.tensors and "lm_head.weight" not in spec.tensors
    if name in ("gpt2", "llama_tied_mqa"):
        assert len(spec.aliases) == 1  # found on the meta device (storage identity; every data pointer is 0)
        assert next(iter(spec.aliases)) not in LazyCheckpoint(da)  # save_pretrained stores a tied tensor once


def test_checkpoint_only_buffers_are_carried_unchanged(pair, tmp_path):
    """Older conversions (Pythia on the Hub) also store buffers the model no longer has: they are unbound
    passengers — copied by apply, kept by merge — while a model tensor missing from the checkpoint is an error."""
    _, db, _, mb = pair("gpt_neox")
    extra = tmp_path / "extra"
    shutil.copytree(db, extra)
    index = json.loads((extra / INDEX_NAME).read_text())
    shard = index["weight_map"]["embed_out.weight"]
    tensors = load_file(extra / shard)
    tensors["gpt_neox.layers.0.attention.masked_bias"] = torch.tensor(-1e9)
    save_file(tensors, extra / shard, metadata={"format": "pt"})
    index["weight_map"]["gpt_neox.layers.0.attention.masked_bias"] = shard
    (extra / INDEX_NAME).write_text(json.dumps(index))
    spec = hf_checkpoint_spec(extra)
    assert spec.tensors["gpt_neox.layers.0.attention.masked_bias"] == ()
    g = spec.random_element(seed=0)
    stream_apply(spec, extra, g, tmp_path / "out", files=side_files(extra))
    assert torch.equal(LazyCheckpoint(tmp_path / "out")["gpt_neox.layers.0.attention.masked_bias"], torch.tensor(-1e9))
    torch.testing.assert_close(logits(loaded_like(mb, tmp_path / "out")), logits(mb), rtol=1e-4, atol=1e-4)
    del tensors["embed_out.weight"]
    save_file(tensors, extra / shard, metadata={"format": "pt"})
    del index["weight_map"]["embed_out.weight"]
    (extra / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(StateDictMismatchError, match="embed_out.weight"):
        hf_checkpoint_spec(extra)


def test_config_mismatch_is_named_field_by_field(pair, tmp_path):
    da, db = pair("gpt_neox")[:2]
    other = tmp_path / "other"
    shutil.copytree(db, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["hidden_act"], cfg["use_parallel_residual"] = "relu", False
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="config.hidden_act: 'gelu' vs 'relu'") as err:
        check_same_hf_configs([da, other])
    assert "config.use_parallel_residual: True vs False" in str(err.value)
    check_same_hf_configs([da, db])  # same architecture, different weights: fine


def test_permutation_gathers_equal_apply_tensor(pair):
    """The fused per-axis gather (streaming reads chunks of it) equals apply_tensor, with and without skips."""
    _, _, ma, _ = pair("gpt_neox")
    spec = hf_symmetry_spec(ma)
    g = spec.random_element(seed=5)
    for key, t in ma.state_dict().items():
        binds = spec.tensors[key]
        for skip in (None, *binds):
            plan = spec.permutation_gathers(key, t.shape, g, skip=skip)
            out = t
            for axis in sorted(plan):
                out = out.index_select(axis, plan[axis])
            assert torch.equal(out, spec.apply_tensor(key, t, g, skip=skip)), (key, skip)
    full = hf_symmetry_spec(ma, groups={"heads": "permutation", "qk": "head_orthogonal", "vo": "head_orthogonal"})
    qkv = next(k for k in full.tensors if "query_key_value.weight" in k)
    assert full.permutation_gathers(qkv, ma.state_dict()[qkv].shape, full.random_element(seed=0)) is None


# ------------------------------------------------------------------------------------- weight matching
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.slow
def test_streaming_wm_equals_in_memory(pair, name):
    da, db, ma, mb = pair(name)
    spec = hf_checkpoint_spec(da)
    ref = mc.weight_matching(hf_symmetry_spec(ma), ma.state_dict(), mb.state_dict(), restarts=3, max_iter=30)
    for chunk in (1 << 22, 61):  # one chunk per tensor, and many chunks (ragged last chunk) per tensor
        res = stream_weight_matching(spec, da, db, restarts=3, max_iter=30, chunk=chunk)
        assert set(res.element) == set(ref.element)
        for s in ref.element:
            assert torch.equal(res.element[s], ref.element[s]), s
        assert res.objective == pytest.approx(ref.objective, rel=1e-5)
        assert [len(h) for h in res.history] == [len(h) for h in ref.history]
        assert res.stats["upper_bound"] == pytest.approx(ref.stats["upper_bound"], rel=1e-5)
        assert res.stats["streaming"] and res.stats["chunk"] == chunk


def test_streaming_wm_with_fp32_scores_for_the_sparse_solver_equals_in_memory(pair, monkeypatch):
    """Every space solved by the sparse certified LAP (threshold lowered to 8 units): the streamed fp32 scores give
    the in-memory element."""
    monkeypatch.setattr("modeconn.match.lap.SPARSE_MIN_N", 8)
    da, db, ma, mb = pair("llama")
    ref = mc.weight_matching(hf_symmetry_spec(ma), ma.state_dict(), mb.state_dict(), restarts=2, max_iter=10)
    res = stream_weight_matching(hf_checkpoint_spec(da), da, db, restarts=2, max_iter=10, chunk=61)
    assert res.stats["lap_sparse_calls"] > 0
    assert all(torch.equal(res.element[s], ref.element[s]) for s in ref.element)
    assert res.objective == pytest.approx(ref.objective, rel=1e-5)


@pytest.mark.parametrize("name", ["gpt_neox", "llama"])
def test_streaming_wm_on_fp16_checkpoints_equals_in_memory(pair, name):
    da, db, ma, mb = pair(name, torch.float16)
    assert LazyCheckpoint(da)[next(iter(LazyCheckpoint(da)))].dtype == torch.float16
    ref = mc.weight_matching(hf_symmetry_spec(ma), ma.state_dict(), mb.state_dict(), restarts=2, max_iter=30)
    res = stream_weight_matching(hf_checkpoint_spec(da), LazyCheckpoint(da), LazyCheckpoint(db), restarts=2,
                                 max_iter=30, chunk=100)
    assert all(torch.equal(res.element[s], ref.element[s]) for s in ref.element)
    assert res.objective == pytest.approx(ref.objective, rel=1e-5)


def test_streaming_wm_recovers_a_planted_element(pair, tmp_path):
    da, _, ma, _ = pair("gpt2")
    spec_m = hf_symmetry_spec(ma)
    g = spec_m.random_element(seed=11)
    planted = tmp_path / "planted"
    stream_apply(hf_checkpoint_spec(da), da, g, planted, files=side_files(da))
    res = stream_weight_matching(hf_checkpoint_spec(da), da, planted, restarts=1, max_iter=10, chunk=97)
    assert spec_m.equal(res.element, spec_m.inverse(g))
    assert res.objective == pytest.approx(res.stats["upper_bound"], rel=1e-6)


@pytest.mark.parametrize("sparse_from", [None, 1])
def test_streaming_scores_equal_in_memory_scores_for_every_space(pair, monkeypatch, sparse_from):
    """Every space's LAP score, at a random element, from chunked products (chunk 7: many ragged chunks): fp64 for
    the dense LAP solver, fp32 (never widened: half the bytes) where the sparse certified solver takes the space."""
    if sparse_from is not None:
        monkeypatch.setattr("modeconn.match.lap.SPARSE_MIN_N", sparse_from)
    da, db, ma, mb = pair("llama_tied_mqa")
    spec_m, spec_c = hf_symmetry_spec(ma), hf_checkpoint_spec(da)
    keys = [k for k, b in spec_m.tensors.items() if b]
    a = {k: ma.state_dict()[k].float() for k in keys}
    b = {k: mb.state_dict()[k].float() for k in keys}
    mem = _Problem(spec_m, a, b)
    names = stored_names(spec_m, spec_c)
    ck = [names[k] for k in keys]
    stream = _Stream(spec_c, LazyCheckpoint(da), LazyCheckpoint(db), ck, chunk=7)
    g = spec_m.random_element(seed=2)
    for s in spec_m.spaces:
        s_mem = mem.score(s, g)
        terms = [(names[k], bd, None) for k, bd, _ in mem.terms[s]]
        s_str = stream.score(terms, g, spec_m.spaces[s].size)
        assert s_str.dtype == (torch.float32 if sparse_from else torch.float64)
        torch.testing.assert_close(s_str.double(), s_mem.double(), rtol=1e-5, atol=1e-4)
    assert stream.objective(g, True, 0.0) == pytest.approx(mem.objective(g), rel=1e-6)


@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_streaming_ffn_score_reads_row_blocks_never_a_whole_tensor(pair, monkeypatch, chunk):
    """The FFN space's score at a random element, from tensors larger than a chunk: the up-projection (units are its
    rows) and the down-projection (units are its columns, its rows permuted by the residual space) enter as row
    blocks, never read whole (whole reads would keep two such tensors resident beside the n×n score). Control: tensors
    within one chunk are read whole."""
    da, db, ma, _ = pair("llama_tied_mqa")
    spec = hf_checkpoint_spec(da)
    up, down = "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"
    space = next(b.space for b in spec.tensors[up] if b.axis == 0)
    terms = [(k, b, None) for k in (up, down) for b in spec.tensors[k] if b.space == space]
    whole: list[str] = []
    getitem = LazyCheckpoint.__getitem__
    monkeypatch.setattr(LazyCheckpoint, "__getitem__", lambda self, k: whole.append(k) or getitem(self, k))
    stream = _Stream(spec, LazyCheckpoint(da), LazyCheckpoint(db), [up, down], chunk=chunk)
    stream.score(terms, spec.random_element(seed=3), spec.spaces[space].size)
    assert sorted(whole) == ([] if chunk == 7 else [down, down, up, up])


def test_solve_lap_negates_in_place_and_restores_the_callers_matrix():
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        score = torch.randn(64, 64, generator=gen, dtype=dtype)
        before = score.clone()
        perm = solve_lap(score, "s")
        rows, cols = linear_sum_assignment(before.double().numpy(), maximize=True)
        assert np.array_equal(perm.numpy()[rows], cols)
        assert torch.equal(score, before), "the caller's matrix is unchanged (bit for bit)"
    bad = torch.randn(8, 8, dtype=torch.float64)
    bad[1, 2] = float("nan")
    with pytest.raises(NonFiniteError, match="space 'x'.*1 NaN"):
        solve_lap(bad, "x")


def test_non_finite_tensor_is_named_before_matching(pair, tmp_path):
    da, db = pair("gpt_neox")[:2]
    bad = tmp_path / "bad"
    shutil.copytree(db, bad)
    ckpt = LazyCheckpoint(bad)
    key = next(k for k in ckpt if "dense_h_to_4h.weight" in k)
    shard = bad / ckpt.infos[key].shard
    tensors = load_file(shard)
    tensors[key] = tensors[key].clone()
    tensors[key][0, 0] = float("inf")
    with safe_open(str(shard), "pt") as f:
        meta = f.metadata()
    save_file(tensors, shard, metadata=meta)
    with pytest.raises(NonFiniteError, match=rf"{shard.name}: tensor {key!r} .* 1 non-finite"):  # file and tensor
        stream_weight_matching(hf_checkpoint_spec(da), da, bad, restarts=1, max_iter=1)


# ------------------------------------------------------------------------------------- apply and merge
@pytest.mark.parametrize("name", FAMILIES)
def test_stream_apply_is_bitwise_and_computes_the_same_function(pair, tmp_path, name):
    da, db, ma, mb = pair(name)
    spec_m, spec_c = hf_symmetry_spec(ma), hf_checkpoint_spec(da)
    g = spec_m.random_element(seed=3)
    out = tmp_path / "out"
    assert stream_apply(spec_c, db, g, out, files=side_files(db)) == out
    # layout: same files, same index, same keys per shard, shard metadata kept
    assert sorted(set(os.listdir(out)) - {MARKER}) == sorted(os.listdir(db))
    assert json.loads((out / INDEX_NAME).read_text()) == json.loads((db / INDEX_NAME).read_text())
    for shard in LazyCheckpoint(db).shards:
        with safe_open(str(db / shard), "pt") as f, safe_open(str(out / shard), "pt") as h:
            assert set(f.keys()) == set(h.keys()) and f.metadata() == h.metadata()
    assert (out / "config.json").read_bytes() == (db / "config.json").read_bytes()
    # values: bit for bit the in-memory apply
    expected = renamed(spec_m.apply(mb.state_dict(), g), spec_c, spec_m)
    got = LazyCheckpoint(out)
    for k in got:
        assert torch.equal(got[k], expected[k]), k
    # function: the aligned checkpoint loads with transformers and computes B's logits
    mb_g = loaded_like(mb, out)
    torch.testing.assert_close(logits(mb_g), logits(mb), rtol=1e-4, atol=1e-4)
    if name in ("gpt2", "llama_tied_mqa"):
        assert mb_g.get_output_embeddings().weight.data_ptr() == mb_g.get_input_embeddings().weight.data_ptr()


def test_tied_tensor_stored_twice_stays_tied_and_is_checked(pair, tmp_path):
    """A checkpoint that stores both tied keys: the alias gets the transformed primary; unequal copies are refused."""
    da, _, ma, _ = pair("gpt2")
    spec_c = hf_checkpoint_spec(da)
    alias, primary = next(iter(spec_c.aliases.items()))
    both = tmp_path / "both"
    both.mkdir()
    sd = {k: v.clone() for k, v in ma.state_dict().items()}
    save_file(sd, both / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(da / "config.json", both / "config.json")
    g = spec_c.random_element(seed=1)
    out = tmp_path / "out"
    stream_apply(spec_c, both, g, out)
    got = LazyCheckpoint(out)
    assert torch.equal(got[alias], got[primary])
    assert torch.equal(got[primary], spec_c.apply_tensor(primary, sd[primary], g))
    sd[alias] = sd[alias] + 1
    save_file(sd, both / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SpecError, match="tied"):
        stream_apply(spec_c, both, g, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("name", ["gpt_neox", "gpt2"])
def test_stream_merge_equals_in_memory_average(pair, tmp_path, name):
    da, db, ma, mb = pair(name)
    spec_m, spec_c = hf_symmetry_spec(ma), hf_checkpoint_spec(da)
    g = spec_m.random_element(seed=4)
    out = tmp_path / "merged"
    stream_merge(spec_c, [da, db], out, weights=[0.3, 0.7], elements=[None, g], files=side_files(da))
    expected = renamed(weighted_average([ma.state_dict(), spec_m.apply(mb.state_dict(), g)], [0.3, 0.7]), spec_c,
                       spec_m)
    got = LazyCheckpoint(out)
    assert set(got) == set(LazyCheckpoint(da)) and got.shards.keys() == LazyCheckpoint(da).shards.keys()
    for k in got:
        assert torch.equal(got[k], expected[k]), k
    # three models, uniform weights, no alignment
    out3 = tmp_path / "merged3"
    stream_merge(spec_c, [da, db, da], out3)
    expected3 = renamed(weighted_average([ma.state_dict(), mb.state_dict(), ma.state_dict()]), spec_c, spec_m)
    got3 = LazyCheckpoint(out3)
    assert all(torch.equal(got3[k], expected3[k]) for k in got3)


def test_bad_merge_options_fail_before_writing(pair, tmp_path):
    da, db = pair("gpt_neox")[:2]
    spec = hf_checkpoint_spec(da)
    with pytest.raises(ConfigError, match="at least two"):
        stream_merge(spec, [da], tmp_path / "o")
    with pytest.raises(ConfigError, match="finite"):
        stream_merge(spec, [da, db], tmp_path / "o", weights=[0.5, float("nan")])
    with pytest.raises(ConfigError, match="one entry"):
        stream_merge(spec, [da, db], tmp_path / "o", elements=[None])
    other = pair("llama")[0]
    with pytest.raises(StateDictMismatchError):
        stream_merge(spec, [da, other], tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_inputs_are_never_modified(pair, tmp_path):
    da, db = pair("gpt_neox")[:2]
    before = {d: tree_digest(d) for d in (da, db)}
    spec = hf_checkpoint_spec(da)
    res = stream_weight_matching(spec, da, db, restarts=2, max_iter=5, chunk=50)
    stream_apply(spec, db, res.element, tmp_path / "aligned", files=side_files(db))
    stream_merge(spec, [da, db], tmp_path / "merged", elements=[None, res.element])
    assert {d: tree_digest(d) for d in (da, db)} == before


def test_output_is_atomic(pair, tmp_path):
    da, db = pair("llama")[:2]
    spec = hf_checkpoint_spec(da)
    g = spec.random_element(seed=0)
    # a failure in the last shard (NaN in B, found while merging): nothing appears, no temporary left behind
    bad = tmp_path / "bad"
    shutil.copytree(db, bad)
    ckpt = LazyCheckpoint(bad)
    last = list(ckpt.shards)[-1]
    key = ckpt.shards[last][0]
    tensors = load_file(bad / last)
    tensors[key] = torch.full_like(tensors[key], float("nan"))
    save_file(tensors, bad / last, metadata={"format": "pt"})
    out = tmp_path / "out" / "merged"
    with pytest.raises(NonFiniteError, match=key):
        stream_merge(spec, [da, bad], out, elements=[None, g])
    assert not out.exists() and os.listdir(out.parent) == []
    # an existing non-empty --out is refused, and replaced only with overwrite
    stream_apply(spec, db, g, out)
    first = tree_digest(out)
    with pytest.raises(CheckpointError, match="not empty"):
        stream_apply(spec, db, spec.identity(), out)
    assert tree_digest(out) == first
    stream_apply(spec, db, spec.identity(), out, overwrite=True)
    assert tree_digest(out) == {k: v for k, v in tree_digest(db).items()  # weights, and config.json since #17 item 5
                                if k.endswith(("safetensors", "index.json")) or k == "config.json"}
    # a producer returning the wrong shape is named
    with pytest.raises(StateDictMismatchError, match="expected"):
        write_like(tmp_path / "w", LazyCheckpoint(db), lambda k: torch.zeros(1))
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------------------------- command line
def test_cli_align_hf_directories(pair, tmp_path):
    da, db, _, mb = pair("gpt_neox")
    out = tmp_path / "aligned"
    res = run_cli("align", da, db, "--out", out, "--restarts", "2", "--max-iter", "20")
    assert str(out.resolve()) in res.output and "streaming weight matching objective" in res.output
    assert sorted(set(os.listdir(out)) - {MARKER}) == sorted([*os.listdir(db), "alignment.json"])
    record = json.loads((out / "alignment.json").read_text())
    ref = stream_weight_matching(hf_checkpoint_spec(da), da, db, restarts=2, max_iter=20)
    assert record["element"] == {s: p.tolist() for s, p in ref.element.items()}
    assert record["aligned_to"] == da.name and record["source"] == db.name  # names, never machine paths
    assert record["settings"] == {"restarts": 2, "max_iter": 20, "seed": 0}
    torch.testing.assert_close(logits(loaded_like(mb, out)), logits(mb), rtol=1e-4, atol=1e-4)
    again = run_cli("align", da, db, "--out", out, ok=False)
    assert again.exit_code == 2 and "not empty" in again.output


def test_cli_merge_hf_directories(pair, tmp_path):
    da, db, ma, mb = pair("gpt2")
    out = tmp_path / "merged"
    res = run_cli("merge", da, db, "--out", out, "--align", "weight", "--restarts", "1", "--max-iter", "10",
                  "--weights", "0.4,0.6")
    assert str(out.resolve()) in res.output
    spec_m, spec_c = hf_symmetry_spec(ma), hf_checkpoint_spec(da)
    g = stream_weight_matching(spec_c, da, db, restarts=1, max_iter=10).element
    expected = renamed(weighted_average([ma.state_dict(), spec_m.apply(mb.state_dict(), g)], [0.4, 0.6]), spec_c,
                       spec_m)
    got = LazyCheckpoint(out)
    assert all(torch.equal(got[k], expected[k]) for k in got)
    record = json.loads((out / "merge.json").read_text())
    assert record["weights"] == [0.4, 0.6] and record["align"] == "weight" and len(record["alignments"]) == 1
    merged = loaded_like(ma, out)  # a loadable checkpoint
    assert torch.isfinite(logits(merged)).all()


def test_cli_hf_errors_are_clear(pair, tmp_path):
    da, db = pair("gpt_neox")[:2]
    res = run_cli("align", da, db, "--out", tmp_path / "o", "--method", "activation", ok=False)
    assert res.exit_code == 2 and "--method weight" in res.output
    modeconn_ckpt = tmp_path / "mc"
    mc.save_checkpoint(modeconn_ckpt, mc.build_model("mlp", in_shape=(1, 8, 8), num_classes=10, width=8, depth=1))
    assert is_hf_checkpoint(da) and not is_hf_checkpoint(modeconn_ckpt)
    res = run_cli("align", da, modeconn_ckpt, "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "mixed checkpoint kinds" in res.output
    res = run_cli("merge", da, db, "--out", tmp_path / "o", "--bn", "repair", ok=False)
    assert res.exit_code == 2 and "without data" in res.output
    res = run_cli("merge", da, db, "--out", tmp_path / "o", "--align", "activation", ok=False)
    assert res.exit_code == 2 and "'weight' or 'none'" in res.output
    broken = tmp_path / "broken"
    shutil.copytree(db, broken)
    victim = min(broken.glob("model-*.safetensors"))
    victim.unlink()
    res = run_cli("align", da, broken, "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and victim.name in res.output
    res = run_cli("align", da, pair("llama")[1], "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "config.model_type" in res.output
    res = run_cli("align", modeconn_ckpt, modeconn_ckpt, "--out", tmp_path / "o", "--groups", "full", ok=False)
    assert res.exit_code == 2 and "--groups" in res.output and "Hugging Face checkpoint directories" in res.output
    assert not (tmp_path / "o").exists()


def test_cli_hf_refuses_unsafe_targets_and_names_missing_inputs(pair, tmp_path, monkeypatch):
    da, db = pair("gpt_neox")[:2]
    before = {p: p.read_bytes() for d in (da, db) for p in sorted(Path(d).iterdir())}
    res = run_cli("align", da, db, "--out", db, "--overwrite", ok=False)  # --out would replace input B
    assert res.exit_code == 2 and "inputs are never written to" in res.output
    res = run_cli("merge", da, db, "--out", Path(da) / "sub", ok=False)  # --out inside input A
    assert res.exit_code == 2 and "inputs are never written to" in res.output
    assert {p: p.read_bytes() for d in (da, db) for p in sorted(Path(d).iterdir())} == before
    res = run_cli("align", da, tmp_path / "nonexistent", "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "nonexistent" in res.output and "mixed checkpoint kinds" not in res.output
    bad = tmp_path / "badcfg"
    shutil.copytree(db, bad)
    (bad / "config.json").write_text("{")
    res = run_cli("align", da, bad, "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "config.json" in res.output and "mixed checkpoint kinds" not in res.output
    res = run_cli("merge", da, db, "--out", tmp_path / "o", "--weights", "0.5,abc", ok=False)
    assert res.exit_code == 2 and "--weights" in res.output
    monkeypatch.setenv("WORLD_SIZE", "2")  # as under torchrun: streaming is single-process, refused up front
    res = run_cli("align", da, db, "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "without torchrun" in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("name", "groups"), [
    ("gpt_neox", {"heads": "permutation", "qk": "head_orthogonal", "vo": "head_orthogonal"}),
    ("llama", {"ffn_scale": "scaling"}),  # not isometric: the streamed objective is J̃ (norms of g·B change)
])
def test_streaming_wm_with_continuous_groups_equals_in_memory(pair, name, groups):
    da, db, ma, mb = pair(name)
    spec_m = hf_symmetry_spec(ma, groups)
    ref = mc.weight_matching(spec_m, ma.state_dict(), mb.state_dict(), restarts=2, max_iter=10)
    res = stream_weight_matching(hf_checkpoint_spec(da, groups), da, db, restarts=2, max_iter=10, chunk=64)
    assert res.stats["isometric"] == ref.stats["isometric"] == ("ffn_scale" not in groups)
    assert spec_m.equal(res.element, ref.element)
    assert res.objective == pytest.approx(ref.objective, rel=1e-5)


def test_streamed_align_and_merge_outputs_carry_no_code_of_their_inputs(pair, tmp_path):
    """Streamed ``align`` / ``merge`` write transformers' own architecture: an input's ``auto_map`` (config.json and
    tokenizer_config.json) and ``.py`` files stay behind, the other side files travel, and loading the output with
    ``trust_remote_code=True`` gives the stock class without importing the planted module."""
    a, b, *_ = pair("llama")
    marker = tmp_path / "imported"
    for src, name in ((a, "a"), (b, "b")):
        d = tmp_path / name
        shutil.copytree(src, d)
        (d / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModelForCausalLM": "evil.EvilModel"}}))
        (d / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["evil.T", None]},
                                                             "model_max_length": 64}))
        (d / "generation_config.json").write_text(json.dumps({"max_new_tokens": 3}))
    for command, out in (("align", tmp_path / "aligned"), ("merge", tmp_path / "merged")):
        run_cli(command, tmp_path / "a", tmp_path / "b", "--out", out)
        assert not (out / "evil.py").exists(), command
        for name in ("config.json", "tokenizer_config.json"):
            assert "auto_map" not in json.loads((out / name).read_text()), (command, name)
        assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 64
        assert json.loads((out / "generation_config.json").read_text()) == {"max_new_tokens": 3}
        import transformers

        loaded = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
        assert type(loaded).__name__ == "LlamaForCausalLM" and not marker.exists(), command
