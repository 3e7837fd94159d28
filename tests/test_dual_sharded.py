"""Sharded dual matching (``dual_matching(..., shard=True)``, :mod:`modeconn.match.sharded`).

Under ``torchrun`` with 2 and 4 gloo processes on the CPU, reading the endpoints per rank from safetensors, the learned
elements equal the single-process (in-memory, unsharded) ones within :data:`TOL` = 1e-4 max |Δ element| after 6 steps
(measured: 9e-7 on 2 and 1.4e-6 on 4 processes; fp32 reduction order), and each rank stores ⌈rows/N⌉-row blocks of
the endpoints. A variant that reads every shard one row off (rows rolled within each rank's block) must miss the
tolerance by far (measured: 0.45 and 0.42), and so must one that hands each rank's share of the per-head elements'
gradients to the wrong heads (the attention projections' head-aligned blocks; measured: 0.31 and 0.30).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_dual_distributed import _torchrun
from test_dual_distributed import lm_checkpoints  # noqa: F401 (the fixture, requested by name below)

from modeconn.errors import ConfigError, NonFiniteError

pytestmark = [pytest.mark.usefixtures("one_thread")]

TESTS = Path(__file__).resolve().parent
TOL = 1e-4
LOSS_TOL = 1e-5


@pytest.fixture(scope="module")
def problem() -> dict:
    import dual_dist_worker as worker

    return worker.problem()


@pytest.fixture(scope="module")
def single(problem):
    """The single-process, in-memory (unsharded) reference run."""
    import dual_dist_worker as worker
    import dual_shard_worker as shard_worker

    return worker.run(problem, shard_worker.STEPS)


def _max_delta(res, tensors: dict[str, torch.Tensor], prefix: str) -> float:
    diffs = []
    for side, el in res.export_transforms().items():
        for s, t in el.items():
            got = tensors[f"{prefix}.{side}.{s}"]
            if t.is_floating_point():
                diffs.append(float((t - got).abs().max()))
            else:  # the permutations come from the same weight matching
                assert torch.equal(t, got), (side, s)
    return max(diffs)


def _save(sd: dict[str, torch.Tensor], d: Path) -> Path:
    d.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))
    return d


# ------------------------------------------------------------------------------------------ one process
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_row_blocks_are_torch_chunk_blocks(world):
    from modeconn.match.sharded import row_block

    for rows in range(0, 12):
        t = torch.arange(rows)
        chunks = list(torch.chunk(t, world)) if rows else []
        blocks = [t[slice(*row_block(rows, r, world))] for r in range(world)]
        assert [b.tolist() for b in blocks] == [c.tolist() for c in chunks] + [[]] * (world - len(chunks))


def test_row_reader_reads_the_rows_of_a_safetensors_checkpoint(problem, tmp_path):
    from modeconn.match.sharded import RowReader

    d = _save(problem["a"], tmp_path / "a")
    reader, in_memory = RowReader(d), RowReader(problem["a"])
    for key, t in problem["a"].items():
        assert reader.meta[key].shape == t.shape and reader.meta[key].dtype == t.dtype
        for start, stop in ((0, 1), (1, 3), (2, 2)):
            assert torch.equal(reader.rows(key, start, stop), t[start:stop]), key
            assert torch.equal(in_memory.rows(key, start, stop), t[start:stop]), key


def test_row_reader_copies_the_rows_out_of_the_memory_map(problem, tmp_path):
    """A row block must own exactly its bytes: a view of the safetensors map keeps the map (and the kernel's resident
    neighbours of every touched page) alive — several times the rows' bytes of resident memory per rank."""
    from modeconn.match.sharded import RowReader

    reader = RowReader(_save(problem["a"], tmp_path / "a"))
    for key, t in problem["a"].items():
        got = reader.rows(key, 1, 3) if t.dim() else reader.rows(key, 0, 0)
        assert got.untyped_storage().nbytes() == got.numel() * got.element_size(), key


def _transforms(problem):
    from modeconn.match.parametrize import make_transform

    spec = problem["spec"]
    g = spec.random_element(generator=torch.Generator().manual_seed(0))
    return [(s, make_transform(spec.group_of(s), g[s].float())) for s in spec.spaces if not spec.group_of(s).exact]


def test_frozen_bases_keep_the_values_keys_and_elements(problem):
    """The bases a sharded run hands to FSDP as frozen parameters: the same state-dict keys and values, the same
    element, no floating buffer left, and not trainable."""
    from modeconn.match.sharded import freeze_buffers

    for s, m in _transforms(problem):
        before, element = {k: v.clone() for k, v in m.state_dict().items()}, m().detach()
        trainable = {n for n, q in m.named_parameters()}
        freeze_buffers(m)
        after = m.state_dict()
        assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before), s
        assert torch.equal(m().detach(), element), s
        assert not [n for n, b in m.named_buffers() if b.is_floating_point() and b.numel()], s
        assert {n for n, q in m.named_parameters() if q.requires_grad} == trainable, s


def test_detached_elements_then_transform_backward_is_the_chain_rule(problem):
    """The sharded step's two phases (the model's backward into detached elements, then each transform's backward
    from the element's gradient) give the parameters the gradients of one backward pass through everything; a variant
    that drops the second phase leaves them without gradients."""
    from modeconn.match.sharded import detached_element

    mods = _transforms(problem)
    weights = {s: torch.randn(m().shape, generator=torch.Generator().manual_seed(i)) for i, (s, m) in enumerate(mods)}

    def loss(els):
        return sum((torch.tanh(els[s]) * weights[s]).sum() for s, _ in mods)

    loss({s: m() for s, m in mods}).backward()
    direct = {(s, n): q.grad.clone() for s, m in mods for n, q in m.named_parameters()}
    for _, m in mods:
        m.zero_grad(set_to_none=True)
    leaves = {s: detached_element(m) for s, m in mods}
    loss(leaves).backward()
    assert all(q.grad is None for _, m in mods for q in m.parameters())  # the broken variant stops here
    for s, m in mods:
        torch.autograd.backward(m(), leaves[s].grad)
    for s, m in mods:
        for n, q in m.named_parameters():
            torch.testing.assert_close(q.grad, direct[s, n], rtol=1e-5, atol=1e-6, msg=f"{s}.{n}")
    assert max(float(g.abs().max()) for g in direct.values() if g.numel()) > 1e-3  # not a comparison of zeros


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_blocks_transformed_with_their_units_assemble_the_whole_action(problem, world):
    """``_ContinuousPlan``: every tensor split along its :meth:`block_axis` over ``world`` ranks, each rank's block
    transformed with its units of a random element (:meth:`held_units`, :meth:`act_block`), concatenates to the whole
    tensor transformed — the attention projections included (split at head boundaries on 2 and 4 ranks, between a
    head's q, k and v rows on 3; whole on 5, whose blocks would cut a head's rows). A variant that gives every rank
    the first units of the per-head elements is off."""
    from modeconn.match.dual import _ContinuousPlan
    from modeconn.match.sharded import row_block

    spec, sd = problem["spec"], {k: v.float() for k, v in problem["a"].items() if v.is_floating_point()}
    cont = [s for s in spec.spaces if not spec.group_of(s).exact]
    plan = _ContinuousPlan(spec, cont, sd)
    g = {s: t.float() for s, t in spec.random_element(generator=torch.Generator().manual_seed(0)).items() if s in cont}
    axes = {k: plan.block_axis(k, tuple(t.shape), world) for k, t in sd.items()}
    blocks = [{k: (a, *row_block(sd[k].shape[a], r, world)) for k, a in axes.items() if a is not None}
              for r in range(world)]
    held = [plan.held_units(b, sd) for b in blocks]
    qkv = [a for k, a in axes.items() if k.endswith("query_key_value.weight")]
    assert qkv == [None] * len(qkv) if world == 5 else all(a == 0 for a in qkv)  # 5: 20-row blocks cut 8-row heads
    if world in (2, 4):
        assert all(a == 1 for k, a in axes.items() if k.endswith("attention.dense.weight"))
        assert all(len({h[s] for h in held}) == world for s in held[0])  # each rank its own heads
    wrong = 0.0
    for key, axis in axes.items():
        if axis is None:
            continue
        for units in (held, [held[0]] * world):  # the right units, then every rank given rank 0's
            parts = [plan.act_block(key, sd[key].narrow(axis, b[key][1], b[key][2] - b[key][1]),
                                    {s: t[slice(*u.get(s, (None, None)))] for s, t in g.items()}, b[key], h)
                     for b, h, u in zip(blocks, held, units, strict=True)]
            diff = float((torch.cat(parts, axis) - plan.act_key(key, sd[key], g)).abs().max())
            if units is held:
                assert diff <= 1e-5, (key, diff)
            else:
                wrong = max(wrong, diff)
    assert wrong > 0.1 if world != 5 else all(h == held[0] for h in held)  # 5: whole per-head elements everywhere


def test_one_sharded_process_reading_checkpoints_equals_the_in_memory_run(problem, single, tmp_path):
    import dual_dist_worker as worker
    import dual_shard_worker as shard_worker

    a, b = _save(problem["a"], tmp_path / "a"), _save(problem["b"], tmp_path / "b")
    res = worker.run({**problem, "a": str(a), "b": str(b)}, shard_worker.STEPS, shard=True)
    assert res.stats["sharded"] and res.stats["world_size"] == 1
    total = sum(t.numel() * t.element_size() for sd in (problem["a"], problem["b"]) for t in sd.values())
    assert res.stats["stored_bytes"]["endpoints"] == total  # one process holds everything
    assert max(abs(x - y) for x, y in zip(res.history[0], single.history[0], strict=True)) <= LOSS_TOL
    flat = {f"r.{side}.{s}": t for side, el in res.export_transforms().items() for s, t in el.items()}
    assert _max_delta(single, flat, "r") <= TOL
    assert res.stats["max_output_change_a"] < 1e-4 and res.stats["max_output_change_b"] < 1e-4


def test_sharded_hugging_face_pipeline_from_streamed_absorption(tmp_path):
    """HF checkpoints → stream_absorb → sharded dual matching with the meta-device absorbed model (no weights in the
    model) and weight matching on the lazy checkpoints = in-memory absorption and dual matching."""
    from hf_tiny import make

    import modeconn as mc
    from modeconn.match import dual_matching
    from modeconn.symmetry import hf
    from modeconn.symmetry.absorb_stream import AbsorbedView, stream_absorb

    models = [make("llama", seed) for seed in (0, 1)]
    dirs = []
    for i, m in enumerate(models):
        m.save_pretrained(tmp_path / f"hf{i}")
        dirs.append(stream_absorb(tmp_path / f"hf{i}", tmp_path / f"abs{i}"))
    meta_model = AbsorbedView(tmp_path / "hf0").model
    groups = {"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible", "vo": "head_invertible",
              "ffn": "permutation"}
    spec = hf.hf_symmetry_spec(meta_model, groups=groups)
    absorbed = [mc.absorb_normalization(m) for m in models]
    x = torch.randint(0, 50, (6, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        loader = [(x[:3], absorbed[0](x[:3]).logits.argmax(-1)), (x[3:], absorbed[0](x[3:]).logits.argmax(-1))]
    opts = {"steps": 3, "lr": 0.02, "seed": 1}
    got = dual_matching(spec, meta_model, str(dirs[0]), str(dirs[1]), loader, shard=True, **opts)
    ref = dual_matching(hf.hf_symmetry_spec(absorbed[0], groups=groups), absorbed[0], absorbed[0].state_dict(),
                        absorbed[1].state_dict(), loader, **opts)
    assert max(abs(p - q) for p, q in zip(got.history[0], ref.history[0], strict=True)) <= LOSS_TOL
    flat = {f"r.{side}.{s}": t for side, el in got.export_transforms().items() for s, t in el.items()}
    assert _max_delta(ref, flat, "r") <= TOL


def test_sharded_misuse_is_refused(problem, tmp_path):
    import dual_dist_worker as worker

    with pytest.raises(ConfigError, match="shard=True does not take checkpoint_dir"):
        worker.run(problem, 1, shard=True, checkpoint_dir=tmp_path)
    bad = {k: v.clone() for k, v in problem["b"].items()}
    key = next(k for k, v in bad.items() if v.dim() == 2)
    bad[key][1, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=f"B: {key!r}"):
        worker.run({**problem, "b": bad}, 1, shard=True)


# ------------------------------------------------------------------------------------------ torchrun
@pytest.fixture(scope="module", params=[2, 4])
def launched(request, tmp_path_factory) -> tuple[int, Path]:
    """``tests/dual_shard_worker.py`` run on 2 / 4 processes: (process count, output directory)."""
    out = tmp_path_factory.mktemp(f"shard{request.param}")
    _torchrun(TESTS / "dual_shard_worker.py", out, cwd=TESTS, outputs=out, nproc=request.param)
    return request.param, out


@pytest.mark.slow
def test_sharded_processes_learn_the_single_process_elements(launched, problem, single):
    from safetensors.torch import load_file

    world, out = launched
    recs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    els = [load_file(str(out / f"rank{r}.safetensors")) for r in range(world)]
    assert all(r["world_size"] == r["stats_world_size"] == world and r["sharded"] for r in recs)
    assert all(e.keys() == els[0].keys() and all(torch.equal(e[k], els[0][k]) for k in e) for e in els)
    assert all(r["losses"] == recs[0]["losses"] and r["lambdas"] == single.stats["lambdas"] for r in recs)
    assert max(abs(x - y) for x, y in zip(single.history[0], recs[0]["losses"], strict=True)) <= LOSS_TOL
    assert _max_delta(single, els[0], "ok") <= TOL
    # each rank stores its ⌈rows/N⌉-row blocks: together exactly the two endpoints, each rank at most ~1/N of them
    total = sum(t.numel() * t.element_size() for sd in (problem["a"], problem["b"]) for t in sd.values())
    stored = [r["stored_bytes"]["endpoints"] for r in recs]
    assert sum(stored) == total and max(stored) <= 1.1 * total / world
    # the broken variants (every shard read one row off; the head elements' gradients at the wrong heads) are far off
    assert _max_delta(single, els[0], "broken") > 100 * TOL
    assert _max_delta(single, els[0], "misplaced") > 100 * TOL


@pytest.mark.slow
def test_cli_align_dual_shard_under_torchrun(request, tmp_path):
    from modeconn.io import load_checkpoint
    from modeconn.symmetry import load_absorbed

    a, b, data = request.getfixturevalue("lm_checkpoints")
    out = tmp_path / "aligned"
    res = _torchrun("-m", "modeconn", "align", a, b, "--method", "dual", "--shard", "--steps", "2", "--batch-size", "4",
                    "--limit-train", "64", "--data", data, "--out", out, cwd=tmp_path, outputs=out)
    assert res.stdout.count("aligned endpoints written to") == 1 and "over 2 steps on 2 processes" in res.stdout
    rec = json.loads((out / "alignment.json").read_text())
    assert rec["world_size"] == 2 and rec["options"]["shard"] is True
    x = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    for side, ckpt in (("a", a), ("b", b)):  # each written endpoint computes its checkpoint's function
        model, _ = load_checkpoint(ckpt)
        with torch.no_grad():
            torch.testing.assert_close(load_absorbed(out / side)(input_ids=x).logits, model.eval()(x), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_gather_blocks_gradient_is_the_single_process_gradient(world, tmp_path):
    """:func:`~modeconn.match.sharded.gather_blocks` (the block-local leaves' all-gather of θ): the gathered tensor is
    the whole one and each rank's block gets its block of the single-process gradient of the global loss (the sum of
    the ranks' losses), along rows and columns, with uneven and (4 processes, columns) empty blocks. The broken variant,
    ``DTensor.full_tensor``, gathers the same values but its backward keeps the rank's own share: far off."""
    _torchrun(TESTS / "gather_blocks_worker.py", tmp_path, cwd=TESTS, outputs=tmp_path, nproc=world)
    recs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert all(r["world"] == world for r in recs)
    assert sum(r["ok.dim0.rows"] for r in recs) == 7 and sum(r["ok.dim1.rows"] for r in recs) == 5
    for dim in (0, 1):
        assert max(r[f"ok.dim{dim}.value"] for r in recs) == 0.0
        assert max(r[f"full_tensor.dim{dim}.value"] for r in recs) == 0.0
        assert max(r[f"ok.dim{dim}.grad"] for r in recs) <= 1e-12
        assert max(r[f"full_tensor.dim{dim}.grad"] for r in recs) > 0.1
