"""Trust class 10 (issue #14) — resume integrity.

A resumed LLPF search continues from files it wrote earlier; it must not trust them blindly. On resume every
digest recorded in the state is verified — the sha256 of every shard written so far and of the state file's own
tensors — and a modified or corrupt file is named (CheckpointError). The run's fingerprint covers the settings,
both endpoints' contents and the training data (name, split, limit, the number of examples and the sha256 of
all of them); a resume with anything different is refused with a ConfigError naming what differs.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from trust_helpers import FAST_LLPF, has_nan, mlp, quick_run, with_train_limit

from modeconn.errors import CheckpointError, ConfigError
from modeconn.recipes.path import work_dir_for
from modeconn.path import Path, llpf_m2m
from modeconn.path import llpf as llpf_mod
from modeconn.path.llpf import STATE_FILE

KW = {"step": 0.2, "ticks": 7, "checkpoint_every": 2, "lr": 0.05, "threshold": 0.5, "min_steps": 1, "max_steps": 3,
      "batch_size": 16, "seed": 3}


class Killed(Exception):
    pass


def _kill_at(tick):
    def progress(i, total):
        if i == tick:
            raise Killed
    return progress


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def _interrupted(out, data=None, **kw):
    """An LLPF run in ``out`` killed at tick 5 (state and shards of points 0…4 on disk)."""
    model = mlp(0)
    sd_a, sd_b = model.state_dict(), mlp(1).state_dict()
    with pytest.raises(Killed):
        llpf_m2m(model, sd_a, sd_b, data if data is not None else _data(), out_dir=out, progress=_kill_at(5), **{**KW, **kw})
    return model, sd_a, sd_b


def _resume(out, data=None, **kw):
    model = mlp(0)
    return llpf_m2m(model, model.state_dict(), mlp(1).state_dict(), data if data is not None else _data(), out_dir=out,
                    resume=True, **{**KW, **kw})


def _state_meta(out):
    with safe_open(str(out / STATE_FILE), framework="pt") as fh:
        return json.loads(fh.metadata()["llpf_state"])


def _flip_nan_into(shard):
    tensors = load_file(str(shard))
    key = max(tensors)
    tensors[key] = tensors[key].clone().view(-1).index_fill(0, torch.tensor([0]), float("nan")).view_as(tensors[key])
    save_file(tensors, str(shard))  # a valid safetensors file, one NaN different


def test_a_nan_flipped_into_a_written_shard_is_found_on_resume(tmp_path):
    _interrupted(tmp_path / "run")
    shard = tmp_path / "run" / _state_meta(tmp_path / "run")["state"]["shards"][0]["file"]
    _flip_nan_into(shard)
    with pytest.raises(CheckpointError, match=rf"{shard.name}: sha256 differs from the one recorded in {STATE_FILE}"):
        _resume(tmp_path / "run")


def test_a_missing_shard_and_a_modified_state_file_are_found_on_resume(tmp_path):
    _interrupted(tmp_path / "a")
    shard = tmp_path / "a" / _state_meta(tmp_path / "a")["state"]["shards"][0]["file"]
    shard.unlink()
    with pytest.raises(CheckpointError, match=rf"{shard.name}: shard of points .* is missing"):
        _resume(tmp_path / "a")
    _interrupted(tmp_path / "b")
    state = tmp_path / "b" / STATE_FILE
    with safe_open(str(state), framework="pt") as fh:
        meta = fh.metadata()
    tensors = load_file(str(state))
    key = next(k for k in tensors if k.startswith("net/"))
    tensors[key] = tensors[key] + 1.0  # the current weights of the interrupted run, edited
    save_file(tensors, str(state), metadata=meta)
    with pytest.raises(CheckpointError, match="its tensors do not match the sha256 recorded in it"):
        _resume(tmp_path / "b")


def test_a_clean_resume_still_continues(tmp_path):
    _interrupted(tmp_path / "run")
    path = _resume(tmp_path / "run")
    assert len(path) == 9 and not has_nan(path[4]) and Path.load(tmp_path / "run").digest == path.digest


def test_resuming_with_other_training_data_is_refused_naming_the_difference(tmp_path):
    _interrupted(tmp_path / "run", data=_data(200))
    with pytest.raises(ConfigError, match=r"training data: examples 200 → 300, sha256 \w{12}… → \w{12}…"):
        _resume(tmp_path / "run", data=_data(300))
    relabelled = _data(200)
    relabelled.tensors[1][:] = (relabelled.tensors[1] + 1) % 10  # same size, other contents
    with pytest.raises(ConfigError, match=r"training data: sha256"):
        _resume(tmp_path / "run", data=relabelled)
    with pytest.raises(ConfigError, match=r"different settings.*settings: lr 0.05 → 0.02"):
        _resume(tmp_path / "run", data=_data(200), lr=0.02)


def test_through_the_recipe_the_limit_and_dataset_are_named(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        quick_run(out, "llpf", FAST_LLPF, bundle=with_train_limit(200), limit_train=200,
                  progress=_interrupt_at(3))
    with pytest.raises(ConfigError, match=r"training data: limit 200 → 300, examples 200 → 300"):
        quick_run(out, "llpf", FAST_LLPF, bundle=with_train_limit(300), limit_train=300, resume=True)
    res = quick_run(out, "llpf", FAST_LLPF, bundle=with_train_limit(200), limit_train=200, resume=True)
    assert res["dataset"]["limit_train"] == 200 and not work_dir_for(out).exists()


def _interrupt_at(tick):
    def progress(i, total):
        if i == tick:
            raise KeyboardInterrupt
    return progress


def test_negative_control_without_the_shard_check_the_resumed_path_carries_the_nan(tmp_path, monkeypatch):
    _interrupted(tmp_path / "run")
    recorded = {s["file"]: s["sha256"] for s in _state_meta(tmp_path / "run")["state"]["shards"]}
    _flip_nan_into(tmp_path / "run" / min(recorded))
    monkeypatch.setattr(llpf_mod, "sha256_file", lambda f: recorded.get(f.name))  # the old resume: no check
    path = _resume(tmp_path / "run")
    assert any(has_nan(p) for p in path)  # the corrupt point is now part of a "finished" path …
    with pytest.raises(CheckpointError, match="sha256 differs"):
        Path.load(tmp_path / "run")  # … which fails to load later


def test_negative_control_without_the_data_fingerprint_other_data_is_resumed(tmp_path, monkeypatch):
    monkeypatch.setattr(llpf_mod, "data_fingerprint", lambda ds, info=None: {})  # the old fingerprint: no data
    _interrupted(tmp_path / "run", data=_data(200))
    path = _resume(tmp_path / "run", data=_data(300))  # silently mixes two datasets in one path
    assert len(path) == 9
