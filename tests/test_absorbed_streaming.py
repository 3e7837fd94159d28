"""Streaming weight matching of normalization-absorbed views (:class:`~modeconn.symmetry.absorb_stream.AbsorbedView`):
``modeconn align --groups full`` and the full-group alignment of every model to the first read the absorbed tensors
one at a time (and row blocks), never a whole model, with the in-memory result."""

from __future__ import annotations

import weakref

import pytest
import torch
from hf_tiny import make

import modeconn as mc
from modeconn.io.lazy import is_lazy
from modeconn.match.weight import WeightMatchingConfig
from modeconn.match.weight import align_to_first
from modeconn.recipes.hf_stream import align_hf_full_group
from modeconn.symmetry.absorb_stream import AbsorbedView
from modeconn.symmetry.hf import FULL_GROUPS, hf_symmetry_spec

pytestmark = pytest.mark.usefixtures("one_thread")

HELD = 4
"""The most whole absorbed tensors alive at once while streaming: the matcher's one or two, plus what the writer reads
ahead (:data:`modeconn.io.lazy.WRITE_BEHIND`) — far below the models' 16 to 20 tensors."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """``pair(name)`` → (dir A, dir B) of a tiny Hugging Face pair, saved in shards once per module."""
    root, cache = tmp_path_factory.mktemp("absorbed"), {}

    def get(name: str):
        if name not in cache:
            cache[name] = [root / f"{name}-{d}" for d in "ab"]
            for seed, d in enumerate(cache[name]):
                make(name, seed).save_pretrained(d, max_shard_size="20KB")
        return cache[name]

    return get


@pytest.fixture
def whole_reads(monkeypatch):
    """The most whole tensors read from any :class:`AbsorbedView` alive at the same time (a one-item list): their
    storages, which views of them (``detach``, ``reshape``) keep alive too."""
    alive: list[weakref.ref] = []
    peak = [0]
    getitem = AbsorbedView.__getitem__

    def spy(self, key):
        t = getitem(self, key)
        alive[:] = [r for r in alive if r() is not None] + [weakref.ref(t.untyped_storage())]
        peak[0] = max(peak[0], len(alive))
        return t

    monkeypatch.setattr(AbsorbedView, "__getitem__", spy)
    return peak


@pytest.mark.parametrize("name", ["llama", "gpt2", "gpt_neox", "mixtral"])
def test_absorbed_rows_equal_rows_of_the_whole_tensor(pair, name):
    """Row blocks and row sets of every absorbed tensor, bit for bit those of the whole tensor: row-local keys from
    the sources' rows, the others (LayerNorm writers centered along their first axis, folded biases) from the whole;
    MoE banks through the stacked parts."""
    view = AbsorbedView(pair(name)[0])
    assert is_lazy(view) and view.meta().keys() == view.keys()
    gen = torch.Generator().manual_seed(0)
    for key in view:
        shape = view.shape_of(key)
        assert view.meta()[key].shape == shape == view[key].shape
        if len(shape) == 0 or shape[0] < 3:
            continue
        whole, rows = view[key], torch.randperm(shape[0], generator=gen)[: shape[0] // 2]
        assert torch.equal(view.read_rows(key, 1, shape[0] - 2), whole[1:-1]), key
        assert torch.equal(view.read_rows_at(key, rows), whole[rows]), key
    with pytest.raises(ValueError, match=key):
        view.read_rows(key, shape[0] - 1, 2)


def test_layer_norm_views_have_keys_of_both_kinds(pair):
    """The control of the test above: GPT-2's view has keys read from their sources' rows and keys computed whole."""
    view = AbsorbedView(pair("gpt2")[0])
    local = {view._row_local(k) for k in view}
    assert local == {True, False}


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_full_group_matching_streams_absorbed_views_with_the_in_memory_result(pair, name, whole_reads):
    """Weight matching with the full group on two absorbed views streams (stats, few whole tensors alive; many
    chunks per tensor with chunk 61) and gives the element and objective of the same views read into memory."""
    va, vb = (AbsorbedView(d) for d in pair(name))
    spec = hf_symmetry_spec(va.model, FULL_GROUPS)
    ref = mc.weight_matching(spec, {k: va[k] for k in va}, {k: vb[k] for k in vb}, restarts=1, max_iter=5)
    for chunk in (1 << 22, 61):
        whole_reads[0] = 0
        res = mc.weight_matching(spec, va, vb, restarts=1, max_iter=5, chunk=chunk)
        assert res.stats.get("streaming") is True
        assert 0 < whole_reads[0] <= HELD < len(va)
        assert set(res.element) == set(ref.element)
        for s, el in ref.element.items():
            torch.testing.assert_close(res.element[s], el, rtol=0, atol=1e-6, msg=s)
        assert res.objective == pytest.approx(ref.objective, rel=1e-6)


def test_align_full_group_holds_a_few_absorbed_tensors_at_a_time(pair, whole_reads, tmp_path):
    """``align --groups full`` (matching and writing): never more than :data:`HELD` whole absorbed tensors alive."""
    res = align_hf_full_group(*pair("llama"), tmp_path / "out", restarts=1, max_iter=3, chunk=61)
    assert res.stats.get("streaming") is True
    assert 0 < whole_reads[0] <= HELD


def test_align_to_first_streams_absorbed_views(pair, whole_reads):
    """Every model aligned to the first with the full group (what the full-group ``moe`` alignment runs on absorbed
    views): streamed, a few whole tensors alive."""
    views = [AbsorbedView(d) for d in pair("llama")]
    spec = hf_symmetry_spec(views[0].model, FULL_GROUPS)
    elements, records = align_to_first(spec, views, ["a", "b"], WeightMatchingConfig(max_iter=3), None)
    assert elements[0] is None and set(elements[1]) == set(spec.spaces)
    assert records[0]["stats"].get("streaming") is True
    assert 0 < whole_reads[0] <= HELD
