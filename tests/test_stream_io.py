"""Read-ahead and write-behind of streamed apply/merge (issue #20 item 3): results equal the sequential ones byte for
byte, memory stays within the documented depths, errors on the background threads reach the caller, outputs stay
atomic. Throughput against the disk is measured in benchmarks/bench_stream_io.py, never here."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from hf_tiny import make
from safetensors.torch import load_file, save_file

from modeconn.errors import CheckpointError, ConfigError, NonFiniteError
from modeconn.io.lazy import READ_AHEAD, WRITE_BEHIND, LazyCheckpoint, ReadAhead, ShardLayout, write_like, write_order
from modeconn.io.hf import side_files
from modeconn.stream import hf_checkpoint_spec, stream_merge

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------- ReadAhead
def test_read_ahead_loads_in_order_on_one_background_thread_within_its_depth():
    keys = [f"k{i}" for i in range(12)]
    started: list[str] = []
    threads: set[int] = set()
    consumed = 0
    lead = []

    def load(key: str) -> str:
        started.append(key)
        threads.add(threading.get_ident())
        lead.append(len(started) - consumed)  # loads begun and not yet handed out, this one included
        return key.upper()

    with ReadAhead(keys, load, depth=3) as ahead:
        for k in keys:
            assert ahead.get(k) == k.upper()
            consumed += 1
    assert started == keys  # each key loaded once, in order
    assert threads and threading.get_ident() not in threads
    assert max(lead) <= 3 + 1


def test_read_ahead_reraises_a_load_error_at_its_key_and_loads_other_keys_in_the_caller():
    def load(key: str) -> int:
        if key == "bad":
            raise CheckpointError("bad tensor")
        return len(key)

    with ReadAhead(["a", "bb", "bad", "dddd"], load, depth=2) as ahead:
        assert ahead.get("a") == 1
        assert ahead.get("zzz") == 3  # not the next key of the order: loaded now, the order stays
        assert ahead.get("bb") == 2
        with pytest.raises(CheckpointError, match="bad tensor"):
            ahead.get("bad")
    with ReadAhead(["a"], load, depth=0) as inline:  # depth 0: everything in the caller
        assert inline.get("a") == 1
    with pytest.raises(ConfigError, match="depth"):
        ReadAhead(["a"], load, depth=-1)


def test_read_ahead_close_cancels_what_has_not_started():
    gate, ran = threading.Event(), []

    def load(key: str) -> str:
        gate.wait(5)
        ran.append(key)
        return key

    ahead = ReadAhead([str(i) for i in range(10)], load, depth=4)
    gate.set()
    ahead.close()
    assert len(ran) <= 4


# ------------------------------------------------------------------------------------------ LazyCheckpoint.read
def test_read_equals_the_memory_mapped_tensor_for_every_dtype(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"h": torch.randn(5, 7, generator=g).half(), "b": torch.randn(3, 4, generator=g).bfloat16(),
               "f": torch.randn(6, generator=g), "d": torch.randn(2, 2, generator=g).double(),
               "i": torch.arange(9).reshape(3, 3), "u": torch.tensor([True, False, True]), "e": torch.empty(0, 3)}
    save_file(tensors, tmp_path / "model.safetensors")
    ckpt = LazyCheckpoint(tmp_path)
    for k in tensors:
        got = ckpt.read(k)
        assert got.dtype == tensors[k].dtype and got.shape == tensors[k].shape and torch.equal(got, ckpt[k]), k


def test_read_rows_equals_the_rows_of_the_tensor_for_every_dtype(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"h": torch.randn(5, 7, 3, generator=g).half(), "b": torch.randn(6, 4, generator=g).bfloat16(),
               "f": torch.randn(6, generator=g), "i": torch.arange(12).reshape(4, 3), "e": torch.empty(0, 3)}
    save_file(tensors, tmp_path / "model.safetensors")
    ckpt = LazyCheckpoint(tmp_path)
    for k, t in tensors.items():
        for start, count in ((0, len(t)), (1, len(t) - 2), (len(t) - 1, 1), (0, 0)):
            if count < 0 or start < 0:
                continue
            got = ckpt.read_rows(k, start, count)
            assert got.dtype == t.dtype and torch.equal(got, t[start:start + count]), (k, start, count)
    for bad in ((4, 3), (-1, 1), (0, 7)):
        with pytest.raises(ValueError, match="rows"):
            ckpt.read_rows("b", *bad)


def test_read_rows_at_equals_the_gathered_rows_in_any_order(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"h": torch.randn(9, 7, 3, generator=g).half(), "f": torch.randn(8, generator=g)}
    save_file(tensors, tmp_path / "model.safetensors")
    ckpt = LazyCheckpoint(tmp_path)
    for k, t in tensors.items():
        for rows in (torch.randperm(len(t), generator=g), torch.tensor([2, 3, 4, 0]), torch.tensor([5]),
                     torch.tensor([], dtype=torch.long)):
            got = ckpt.read_rows_at(k, rows)
            assert got.dtype == t.dtype and torch.equal(got, t[rows]), (k, rows)
    with pytest.raises(ValueError, match="rows"):
        ckpt.read_rows_at("f", torch.tensor([0, 8]))


def test_read_of_a_changed_file_names_file_and_key(tmp_path):
    save_file({"w": torch.ones(64, 64), "v": torch.ones(3)}, tmp_path / "model.safetensors")
    ckpt = LazyCheckpoint(tmp_path)
    save_file({"w": torch.ones(8, 8), "v": torch.ones(3)}, tmp_path / "model.safetensors")  # rewritten since
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*'w'"):
        ckpt.read("w")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="'v'"):
        ckpt.read("v")


# --------------------------------------------------------------------------------------------------- write_like
def _layout(n: int = 9) -> ShardLayout:
    shapes = {f"t{i}": (torch.float16 if i % 3 else torch.float32, (i + 1, 5)) for i in range(n)}
    return ShardLayout.plan(shapes, 200)


def test_write_like_produces_ahead_on_a_background_thread_bounded_by_write_behind(tmp_path):
    layout = _layout()
    produced, written, lead, threads = [], [0], [], set()

    def produce(key: str) -> torch.Tensor:
        produced.append(key)
        threads.add(threading.get_ident())
        lead.append(len(produced) - written[0])  # produced (this one included) and not yet written
        info = layout.infos[key]
        return torch.full(info.shape, float(len(produced)), dtype=info.dtype)

    def progress(done: int, total: int) -> None:
        written[0] = done

    write_like(tmp_path / "out", layout, produce, progress=progress)
    assert produced == write_order(layout) and len(produced) == len(layout.infos)
    assert threading.get_ident() not in threads
    assert max(lead) <= WRITE_BEHIND + 1
    got = LazyCheckpoint(tmp_path / "out")
    for i, k in enumerate(produced):  # every tensor landed in its shard with its own values
        assert torch.equal(got[k], torch.full(layout.infos[k].shape, float(i + 1), dtype=layout.infos[k].dtype))


def test_an_error_while_producing_ahead_leaves_no_output_and_is_raised_here(tmp_path):
    layout = _layout()
    (tmp_path / "keep.txt").write_text("not ours")
    bad = write_order(layout)[-2]

    def produce(key: str) -> torch.Tensor:
        if key == bad:
            raise NonFiniteError(f"{key}: NaN")
        info = layout.infos[key]
        return torch.zeros(info.shape, dtype=info.dtype)

    with pytest.raises(NonFiniteError, match=bad):
        write_like(tmp_path / "out", layout, produce)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]  # no temporary left, nothing else touched


@pytest.mark.parametrize("failing", ["fsync", "fdatasync"])
def test_flushes_run_behind_the_writes_and_their_errors_stop_the_rename(tmp_path, monkeypatch, failing):
    import modeconn.io.lazy as io_stream

    layout = _layout()
    calls, threads = [], []
    real = {n: getattr(io_stream.os, n) for n in ("fsync", "fdatasync")}

    def flush(name):
        def run(fd):
            calls.append(name)
            threads.append((name, threading.get_ident()))
            return real[name](fd)
        return run

    monkeypatch.setattr(io_stream, "SYNC_BYTES", 1)  # a flush after every tensor (when none is in flight)
    for n in real:
        monkeypatch.setattr(io_stream.os, n, flush(n))

    def produce(key: str) -> torch.Tensor:
        return torch.ones(layout.infos[key].shape, dtype=layout.infos[key].dtype)

    write_like(tmp_path / "ok", layout, produce)
    main = threading.get_ident()
    assert "fdatasync" in calls and all(t != main for n, t in threads if n == "fdatasync")  # on the syncer thread
    assert sum(t != main for n, t in threads if n == "fsync") == len(layout.shards)  # each shard's, off the main thread

    def broken(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(io_stream.os, failing, broken)
    with pytest.raises((OSError, CheckpointError), match="No space left"):
        write_like(tmp_path / "full", layout, produce)
    assert not (tmp_path / "full").exists()


# ------------------------------------------------------------------------------------------------ stream_merge
@pytest.fixture(scope="module")
def fp16_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("io")
    dirs = [root / s for s in "ab"]
    for seed, d in enumerate(dirs):
        make("llama", seed).half().save_pretrained(d, max_shard_size="20KB")
    return dirs


def test_streamed_merge_is_byte_identical_to_the_sequential_computation(fp16_pair, tmp_path):
    da, db = fp16_pair
    out = tmp_path / "m"
    stream_merge(hf_checkpoint_spec(da), [da, db], out, weights=[0.3, 0.7], files=side_files(da))
    a, b = LazyCheckpoint(da), LazyCheckpoint(db)
    for shard in LazyCheckpoint(out).shards:
        got = load_file(out / shard)
        for k, t in got.items():
            ref = torch.zeros(t.shape, dtype=torch.float32)
            ref.add_(a[k].float(), alpha=0.3).add_(b[k].float(), alpha=0.7)
            assert torch.equal(t, ref.half()), k


def test_nan_in_any_model_is_named_though_linear_checks_inputs_after_merging(fp16_pair, tmp_path):
    da, db = fp16_pair
    bad = tmp_path / "b_nan"
    bad.mkdir()
    for f in Path(db).iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    ckpt = LazyCheckpoint(bad)
    key = next(k for k in ckpt if "mlp" in k)
    shard = ckpt.infos[key].shard
    tensors = load_file(bad / shard)
    tensors[key][0, 0] = float("nan")
    save_file(tensors, bad / shard, metadata={"format": "pt"})
    for weights in ([0.5, 0.5], [1.0, 0.0]):  # a zero weight still propagates NaN (0·NaN = NaN): still named
        with pytest.raises(NonFiniteError, match=rf"b_nan.*{key}"):
            stream_merge(hf_checkpoint_spec(da), [da, bad], tmp_path / "m", weights=weights)
        assert not (tmp_path / "m").exists()


def test_documented_depths_are_small():
    assert 1 <= READ_AHEAD <= 4 and 1 <= WRITE_BEHIND <= 4  # the memory bound the docstrings state
