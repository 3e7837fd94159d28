"""Checkpoint directories: round trips, safety (no pickles), corruption, mismatches, atomic writes."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

import modeconn.io.checkpoint as mio
from modeconn._util.outdir import MARKER
from modeconn.errors import CheckpointError, ConfigError, StateDictMismatchError
from modeconn.io import load_checkpoint, load_state_dict, read_config, save_checkpoint, save_state_dict
from modeconn.models import build_model, model_config
from modeconn.models.resnet import ResNet


def _model(seed=0, **kw):
    opts = {"in_shape": (1, 8, 8), "num_classes": 3, "width": 0.25, **kw}
    return build_model("resnet20", seed=seed, **opts)


def _assert_same_state(a: nn.Module, b: nn.Module):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(sa[k], sb[k]), k


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def test_round_trip(tmp_path):
    model = _model()
    model.train()(torch.randn(8, 1, 8, 8))  # move BN running stats away from their init
    out = save_checkpoint(
        tmp_path / "ckpt", model, config={"training": {"lr": 0.1}, "dataset": "digits"}, metrics={"acc": 0.5}
    )
    assert out == tmp_path / "ckpt"
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "config.json", "metrics.json", "model.safetensors"]
    assert _siblings(out) == ["ckpt"]  # no temp leftovers

    loaded, cfg = load_checkpoint(out)
    assert type(loaded) is ResNet and not loaded.training
    _assert_same_state(model, loaded)
    assert cfg["architecture"] == "resnet20" and cfg["dataset"] == "digits" and cfg["training"] == {"lr": 0.1}
    assert cfg["kwargs"] == model_config(model)["kwargs"]
    assert "modeconn_version" in cfg
    assert model_config(loaded) == model_config(model)
    assert read_config(out) == cfg == read_config(out / "config.json")
    assert json.loads((out / "metrics.json").read_text()) == {"acc": 0.5}
    x = torch.randn(4, 1, 8, 8)
    torch.testing.assert_close(loaded(x), model.eval()(x), rtol=0, atol=0)


def test_loading_does_not_touch_global_rng(tmp_path):
    save_checkpoint(tmp_path / "c", _model())
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    load_checkpoint(tmp_path / "c")
    assert torch.equal(torch.rand(2), expected)


def test_existing_directory_not_overwritten(tmp_path):
    target = tmp_path / "ckpt"
    save_checkpoint(target, _model(seed=0))
    before = (target / "model.safetensors").read_bytes()
    with pytest.raises(CheckpointError, match="overwrite"):
        save_checkpoint(target, _model(seed=1))
    assert (target / "model.safetensors").read_bytes() == before
    # a foreign non-empty directory is protected as well
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(CheckpointError):
        save_checkpoint(other, _model())
    assert (other / "todo.txt").read_text() == "keep me"
    # overwrite=True swaps in the new checkpoint, leaving no backup behind
    save_checkpoint(target, _model(seed=1), overwrite=True)
    loaded, _ = load_checkpoint(target)
    _assert_same_state(loaded, _model(seed=1))
    assert sorted(_siblings(target)) == ["ckpt", "notes"]
    # an existing empty directory is fine
    (tmp_path / "empty").mkdir()
    save_checkpoint(tmp_path / "empty", _model())
    # a file at the target is never replaced
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        save_checkpoint(tmp_path / "file", _model(), overwrite=True)


def test_atomic_write_leaves_nothing_on_failure(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(mio, "save_file", boom)  # fails after config.json was written to the temp dir
    with pytest.raises(CheckpointError, match="disk full"):
        save_checkpoint(tmp_path / "ckpt", _model())
    assert list(tmp_path.iterdir()) == []

    # failure while overwriting keeps the old checkpoint intact
    monkeypatch.undo()
    save_checkpoint(tmp_path / "ckpt", _model(seed=0))
    before = (tmp_path / "ckpt" / "model.safetensors").read_bytes()
    monkeypatch.setattr(mio, "save_file", boom)
    with pytest.raises(CheckpointError):
        save_checkpoint(tmp_path / "ckpt", _model(seed=1), overwrite=True)
    assert (tmp_path / "ckpt" / "model.safetensors").read_bytes() == before
    assert _siblings(tmp_path / "ckpt") == ["ckpt"]


def test_atomic_write_of_state_dict_file(tmp_path, monkeypatch):
    target = tmp_path / "w.safetensors"
    save_state_dict(target, {"a": torch.ones(3)})

    def boom(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise KeyboardInterrupt  # even a non-Exception interruption cleans up

    monkeypatch.setattr(mio, "save_file", boom)
    with pytest.raises(KeyboardInterrupt):
        save_state_dict(target, {"a": torch.zeros(3)})
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]
    assert torch.equal(load_state_dict(target)["a"], torch.ones(3))


def test_invalid_json_metadata_rejected_before_writing(tmp_path):
    with pytest.raises(ConfigError, match="JSON"):
        save_checkpoint(tmp_path / "c", _model(), config={"x": object()})
    with pytest.raises(ConfigError, match="reserved"):
        save_checkpoint(tmp_path / "c", _model(), config={"architecture": "mlp"})
    with pytest.raises(ConfigError, match="build_model"):
        save_checkpoint(tmp_path / "c", nn.Linear(2, 2))
    assert list(tmp_path.iterdir()) == []


def test_state_dict_file_round_trip_shared_and_noncontiguous(tmp_path):
    w = torch.randn(4, 6)
    sd = {"w": w, "tied": w, "view": w[:2], "t": w.t(), "empty": torch.zeros(0), "i": torch.tensor([3], dtype=torch.int64)}
    save_state_dict(tmp_path / "sd.safetensors", sd, metadata={"note": "hi"})
    back = load_state_dict(tmp_path / "sd.safetensors")
    assert set(back) == set(sd)
    for k in sd:
        assert torch.equal(back[k], sd[k]) and back[k].dtype == sd[k].dtype
    with pytest.raises(CheckpointError, match="safetensors"):
        save_state_dict(tmp_path / "sd.pt", sd)
    with pytest.raises(CheckpointError, match="'bad'"):
        save_state_dict(tmp_path / "x.safetensors", {"bad": 3})
    with pytest.raises(ConfigError, match="metadata"):
        save_state_dict(tmp_path / "x.safetensors", sd, metadata={"n": 1})


def test_model_with_tied_weights_saves(tmp_path):
    model = build_model("mlp", in_shape=(1, 2, 2), num_classes=4, depth=1, width=4, seed=0)
    model.head.weight = model.blocks[0].linear.weight  # both (4, 4): tie them
    save_checkpoint(tmp_path / "tied", model)
    sd = load_state_dict(tmp_path / "tied" / "model.safetensors")
    assert torch.equal(sd["head.weight"], sd["blocks.0.linear.weight"])


@pytest.mark.parametrize("keep", [4, 40, -16])
def test_truncated_safetensors(tmp_path, keep):
    ckpt = save_checkpoint(tmp_path / "ckpt", _model())
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:keep])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_state_dict(weights)


def test_garbage_safetensors(tmp_path):
    ckpt = save_checkpoint(tmp_path / "ckpt", _model())
    (ckpt / "model.safetensors").write_bytes(os.urandom(256))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(ckpt)


class _Evil:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["MODECONN_TEST_PWNED"]),))


def _write_malicious_pickles(directory: Path) -> bytes:
    payload = pickle.dumps({"stem.conv.weight": _Evil()})
    for name in ["pytorch_model.bin", "model.pt"]:
        (directory / name).write_bytes(payload)
    return payload


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickle_refused_and_never_executed(tmp_path, monkeypatch):
    ckpt = save_checkpoint(tmp_path / "ckpt", _model())
    (ckpt / "model.safetensors").unlink()
    marker = tmp_path / "PWNED"
    monkeypatch.setenv("MODECONN_TEST_PWNED", str(marker))
    payload = _write_malicious_pickles(ckpt)

    with pytest.raises(CheckpointError, match="pickle") as err:
        load_checkpoint(ckpt)
    assert "pytorch_model.bin" in str(err.value)
    with pytest.raises(CheckpointError, match="pickle"):
        load_state_dict(ckpt / "pytorch_model.bin")
    # allow_pickle only ever uses torch.load(weights_only=True), which refuses the payload
    with pytest.raises(CheckpointError, match="weights_only"):
        load_checkpoint(ckpt, allow_pickle=True)
    assert not marker.exists()
    # the payload is live: a plain unpickle would have run it (proves the test checks something)
    pickle.loads(payload)
    assert marker.exists()


def test_allow_pickle_loads_plain_tensor_state_dict(tmp_path):
    model = _model(seed=4)
    ckpt = save_checkpoint(tmp_path / "ckpt", _model(seed=0))
    (ckpt / "model.safetensors").unlink()
    torch.save(model.state_dict(), ckpt / "pytorch_model.bin")
    with pytest.raises(CheckpointError):
        load_checkpoint(ckpt)
    loaded, _ = load_checkpoint(ckpt, allow_pickle=True)
    _assert_same_state(loaded, model)


def test_missing_pieces(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(CheckpointError, match="directory"):
        load_checkpoint(tmp_path / "afile")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        load_checkpoint(empty)
    ckpt = save_checkpoint(tmp_path / "ckpt", _model())
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    "text, exc, needle",
    [
        ("{not json", CheckpointError, "invalid JSON"),
        ("[1, 2]", CheckpointError, "JSON object"),
        ('{"kwargs": {}}', CheckpointError, "architecture"),
        ('{"architecture": "resnet20"}', CheckpointError, "kwargs"),
        ('{"architecture": "resnet99", "kwargs": {}}', ConfigError, "resnet20"),
        ('{"architecture": "resnet20", "kwargs": {"in_shape": [1, 8, 8], "num_classes": 3, "widht": 1}}', ConfigError, "widht"),
    ],
)
def test_invalid_config(tmp_path, text, exc, needle):
    ckpt = save_checkpoint(tmp_path / "ckpt", _model())
    (ckpt / "config.json").write_text(text)
    with pytest.raises(exc, match=needle) as err:
        load_checkpoint(ckpt)
    assert "config.json" in str(err.value)


def test_mismatched_weights(tmp_path):
    ckpt = save_checkpoint(tmp_path / "ckpt", _model())
    sd = load_state_dict(ckpt / "model.safetensors")
    sd["extra.weight"] = torch.zeros(2)
    del sd["head.bias"]
    sd["head.weight"] = torch.zeros(5, 16)
    save_state_dict(ckpt / "model.safetensors", sd)
    with pytest.raises(StateDictMismatchError) as err:
        load_checkpoint(ckpt)
    msg = str(err.value)
    assert "missing keys: head.bias" in msg
    assert "unexpected keys: extra.weight" in msg
    assert "head.weight" in msg and "(3, 16)" in msg and "(5, 16)" in msg
    assert "model.safetensors" in msg


def test_config_for_other_width_is_a_mismatch(tmp_path):
    ckpt = save_checkpoint(tmp_path / "ckpt", _model())
    cfg = read_config(ckpt)
    cfg["kwargs"]["width"] = 0.5
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(StateDictMismatchError, match="stem.conv.weight"):
        load_checkpoint(ckpt)


def test_load_to_device_string(tmp_path):
    ckpt = save_checkpoint(tmp_path / "ckpt", _model())
    model, _ = load_checkpoint(ckpt, device=torch.device("cpu"))
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_asymmetric_checkpoint_digest_also_checked_for_pickle_weights(tmp_path):
    model = _model(asymmetric={"sigma_f": 1.0, "mask_seed": 2})
    ckpt = save_checkpoint(tmp_path / "ckpt", model)
    sd = load_state_dict(ckpt / "model.safetensors")
    (ckpt / "model.safetensors").unlink()
    torch.save(sd, ckpt / "model.pt")
    loaded, cfg = load_checkpoint(ckpt, allow_pickle=True)
    _assert_same_state(model, loaded)
    sd["head.fixed_mask"][0, 0] = 1 - sd["head.fixed_mask"][0, 0]  # flip one mask entry
    torch.save(sd, ckpt / "model.pt")
    with pytest.raises(CheckpointError, match="fixed_structure_digest mismatch") as err:
        load_checkpoint(ckpt, allow_pickle=True)
    assert "model.pt" in str(err.value) and cfg["fixed_structure_digest"] in str(err.value)
