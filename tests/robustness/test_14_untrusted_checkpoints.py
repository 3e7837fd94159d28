"""Class 14 — untrusted checkpoint files.

Unpickling runs arbitrary code. modeconn never unpickles a weights file with code execution: checkpoints are
safetensors; pickle suffixes are refused by name, and ``allow_pickle=True`` only ever uses
``torch.load(weights_only=True)``; dataset pickles (CIFAR) go through a restricted unpickler. A truncated or
corrupt safetensors file — cut anywhere, or with a lying header — gives a CheckpointError naming the file.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from modeconn.data import safe_unpickle
from modeconn.errors import CheckpointError, DataError
from modeconn.io.models import load_same_architecture
from modeconn.io import load_checkpoint, load_state_dict, save_checkpoint
from modeconn.models import build_model

io_mod = importlib.import_module("modeconn.io.safe")


class _Payload:
    """Unpickling this object creates the file named by $MODECONN_TEST_PWNED (a stand-in for arbitrary code)."""

    def __reduce__(self):
        return (Path.touch, (Path(os.environ["MODECONN_TEST_PWNED"]),))


def _model():
    return build_model("mlp", in_shape=(1, 2, 2), num_classes=2, depth=1, width=3, seed=0)


@pytest.fixture
def marker(tmp_path, monkeypatch):
    path = tmp_path / "PWNED"
    monkeypatch.setenv("MODECONN_TEST_PWNED", str(path))
    return path


def _malicious_checkpoint(root: Path, fmt: str, name: str) -> Path:
    ckpt = save_checkpoint(root / f"ckpt-{fmt}-{name}", _model())
    (ckpt / "model.safetensors").unlink()
    payload = {"blocks.0.linear.weight": _Payload()}
    if fmt == "raw-pickle":
        (ckpt / name).write_bytes(pickle.dumps(payload))
    else:  # torch.save's zip container
        torch.save(payload, ckpt / name)
    return ckpt


def assert_refused_without_execution(fn, marker: Path, error=CheckpointError) -> str:
    """The check of this class: ``fn`` raises ``error`` and the payload never ran."""
    with pytest.raises(error) as err:
        fn()
    assert not marker.exists(), "the pickle payload was executed"
    return str(err.value)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("fmt", ["raw-pickle", "torch-zip"])
@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "model.pth", "weights.ckpt", "state.pkl"])
def test_malicious_pickles_are_never_executed(tmp_path, marker, fmt, name):
    ckpt = _malicious_checkpoint(tmp_path, fmt, name)
    msg = assert_refused_without_execution(lambda: load_checkpoint(ckpt), marker)
    assert "pickle" in msg and name in msg
    assert_refused_without_execution(lambda: load_state_dict(ckpt / name), marker)
    msg = assert_refused_without_execution(lambda: load_checkpoint(ckpt, allow_pickle=True), marker)
    assert "weights_only" in msg


def test_pickle_disguised_as_safetensors_or_config_is_inert(tmp_path, marker):
    ckpt = save_checkpoint(tmp_path / "c", _model())
    payload = pickle.dumps({"x": _Payload()})
    (ckpt / "model.safetensors").write_bytes(payload)
    assert_refused_without_execution(lambda: load_checkpoint(ckpt), marker)
    assert_refused_without_execution(lambda: load_state_dict(ckpt / "model.safetensors"), marker)
    assert_refused_without_execution(lambda: load_same_architecture([ckpt, ckpt]), marker)
    (ckpt / "config.json").write_bytes(payload)
    assert_refused_without_execution(lambda: load_checkpoint(ckpt), marker)


def test_dataset_pickles_use_the_restricted_unpickler(tmp_path, marker):
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": _Payload()}))
    msg = assert_refused_without_execution(lambda: safe_unpickle(path), marker, DataError)
    assert "refused" in msg


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_negative_control_the_payload_is_live_and_a_weights_only_false_loader_is_caught(tmp_path, marker, monkeypatch):
    ckpt = _malicious_checkpoint(tmp_path, "torch-zip", "model.pt")
    real_load = torch.load
    with monkeypatch.context() as mp:  # broken variant: the allow_pickle path with weights_only=False
        mp.setattr(io_mod.torch, "load", lambda *a, **k: real_load(*a, **{**k, "weights_only": False}))
        with pytest.raises(AssertionError, match="payload was executed"):
            assert_refused_without_execution(lambda: load_checkpoint(ckpt, allow_pickle=True), marker)
    marker.unlink()
    pickle.loads(pickle.dumps(_Payload()))  # a plain unpickle runs it: the tests above check something real
    assert marker.exists()


# ------------------------------------------------------------------------------------------------ truncation
@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("trunc") / "ckpt", _model())


def _cut_points(size: int, header_end: int) -> list[int]:
    inside_header = list(range(0, header_end, max(1, header_end // 24)))
    return sorted(set(inside_header + [header_end, header_end + 1, (header_end + size) // 2, size - 4, size - 1]))


def test_truncated_safetensors_anywhere_is_a_clear_error(good_checkpoint, tmp_path):
    data = (good_checkpoint / "model.safetensors").read_bytes()
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    cuts = _cut_points(len(data), header_end)
    assert len(cuts) > 20
    for cut in cuts:
        ckpt = tmp_path / f"cut-{cut}"
        ckpt.mkdir()
        (ckpt / "config.json").write_bytes((good_checkpoint / "config.json").read_bytes())
        (ckpt / "model.safetensors").write_bytes(data[:cut])
        for fn, arg in ((load_checkpoint, ckpt), (load_state_dict, ckpt / "model.safetensors")):
            with pytest.raises(CheckpointError, match="model.safetensors") as err:
                fn(arg)
            assert str(ckpt) in str(err.value), (cut, err.value)


def _rewrite_header(data: bytes, edit) -> bytes:
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + n:]


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: struct.pack("<Q", 2**62) + d[8:],  # header length far beyond the file (must not allocate it)
        lambda d: _rewrite_header(d, lambda h: h["head.weight"].__setitem__("data_offsets", [0, 10**9])),
        lambda d: _rewrite_header(d, lambda h: h["head.weight"].__setitem__("shape", [1000, 1000])),
        lambda d: _rewrite_header(d, lambda h: h["head.weight"].__setitem__("dtype", "F99")),
        lambda d: b"",
    ],
    ids=["huge-header-length", "offsets-past-eof", "shape-vs-offsets", "bad-dtype", "empty"],
)
def test_lying_headers_are_a_clear_error(good_checkpoint, tmp_path, corrupt):
    data = (good_checkpoint / "model.safetensors").read_bytes()
    ckpt = tmp_path / "bad"
    ckpt.mkdir()
    (ckpt / "config.json").write_bytes((good_checkpoint / "config.json").read_bytes())
    (ckpt / "model.safetensors").write_bytes(corrupt(data))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_state_dict(ckpt / "model.safetensors")


def test_negative_control_the_raw_library_error_is_not_clear(good_checkpoint, tmp_path):
    """Without modeconn's wrapping the same truncated file surfaces as a library error that names no file."""
    data = (good_checkpoint / "model.safetensors").read_bytes()
    path = tmp_path / "model.safetensors"
    path.write_bytes(data[:40])
    with pytest.raises(Exception) as err:
        load_file(str(path))
    assert not isinstance(err.value, CheckpointError) and str(path) not in str(err.value)
