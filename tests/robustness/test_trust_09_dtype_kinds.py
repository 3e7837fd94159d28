"""Trust class 9 — dtype reinterpretation.

A safetensors header that declares int32 over float32 bytes (same size, so safetensors cannot tell) used to load
silently: the weights became integers around 1e9 and a streamed merge averaged them in. Dtype *kinds* (floating /
integer / bool / complex, :func:`modeconn.io.dtype_kind`) are now compared wherever keys and shapes are: loading a
checkpoint into its model (:func:`~modeconn.io.load_checkpoint`, :func:`~modeconn.io.check_state_dict_compatible`),
lazy checkpoints against the model their config describes and against the first checkpoint (streaming weight
matching, the align recipe before :func:`~modeconn.stream.stream_apply`, :func:`~modeconn.stream.stream_merge`, the
``modeconn merge`` CLI),
and in-memory merges and interpolation. Floating precisions (fp16 / bf16 vs fp32) stay allowed.
"""

from __future__ import annotations

import importlib
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from hf_tiny import make
from safetensors.torch import load_file

import modeconn as mc
from modeconn.errors import StateDictMismatchError
from modeconn.io import check_dtype_kinds, check_state_dict_compatible, dtype_kind, load_checkpoint, save_checkpoint
from modeconn.models import build_model
from modeconn.path.interpolate import interpolate, weighted_average
from modeconn.recipes.hf_stream import align_hf_checkpoints
from modeconn.stream import hf_checkpoint_spec, stream_merge, stream_weight_matching

io_mod = importlib.import_module("modeconn.io")
checks_mod = importlib.import_module("modeconn.checks")

KEY = "gpt_neox.layers.0.mlp.dense_h_to_4h.weight"


def relabel(file: Path, key: str, dtype: str = "I32") -> None:
    """Rewrite ``file``'s safetensors header so that tensor ``key`` is declared ``dtype`` over its unchanged bytes."""
    data = file.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header[key]["dtype"] = dtype
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    file.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])


def assert_kind_refused(fn, key: str, *where: str) -> str:
    """The check of this class: ``fn`` raises StateDictMismatchError naming the tensor, both dtypes and ``where``."""
    with pytest.raises(StateDictMismatchError) as err:
        fn()
    msg = str(err.value)
    assert key in msg and "float32" in msg and "int32" in msg, msg
    assert all(w in msg for w in where), msg
    return msg


def test_dtype_kinds():
    assert [dtype_kind(d) for d in (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)] == ["floating"] * 4
    assert [dtype_kind(d) for d in (torch.int8, torch.uint8, torch.int32, torch.int64)] == ["integer"] * 4
    assert dtype_kind(torch.bool) == "bool" and dtype_kind(torch.complex64) == "complex"


# -------------------------------------------------------------------------------------- modeconn checkpoints
def _mlp():
    return build_model("mlp", in_shape=(1, 2, 2), num_classes=2, depth=1, width=3, seed=0)


@pytest.fixture
def relabelled(tmp_path) -> Path:
    ckpt = save_checkpoint(tmp_path / "c", _mlp())
    relabel(ckpt / "model.safetensors", "head.weight")
    return ckpt


def test_load_checkpoint_refuses_an_integer_header_over_float_weights(relabelled):
    assert_kind_refused(lambda: load_checkpoint(relabelled), "head.weight", str(relabelled / "model.safetensors"))


def test_pickled_integer_weights_are_refused_too(tmp_path):
    ckpt = save_checkpoint(tmp_path / "c", _mlp())
    sd = load_file(ckpt / "model.safetensors")
    (ckpt / "model.safetensors").unlink()
    torch.save({**sd, "head.weight": sd["head.weight"].view(torch.int32)}, ckpt / "model.pt")
    assert_kind_refused(lambda: load_checkpoint(ckpt, allow_pickle=True), "head.weight", "model.pt")


def test_check_state_dict_compatible_compares_kinds_and_allows_precisions():
    shapes = {"w": (2, 2), "n": ()}
    ok = ({"w": torch.float32, "n": torch.int64}, {"w": torch.float16, "n": torch.int32})
    check_state_dict_compatible(shapes, shapes, "f", dtypes=ok)
    bad = ({"w": torch.float32, "n": torch.int64}, {"w": torch.int32, "n": torch.int64})
    assert_kind_refused(lambda: check_state_dict_compatible(shapes, shapes, "file.safetensors", dtypes=bad), "w",
                        "file.safetensors")


def test_half_precision_checkpoints_still_load(tmp_path):
    model = _mlp()
    ckpt = save_checkpoint(tmp_path / "c", model.half())
    loaded, _ = load_checkpoint(ckpt)
    assert all(torch.equal(v.half(), model.state_dict()[k]) for k, v in loaded.state_dict().items())


# ------------------------------------------------------------------------------------------ in-memory merges
def test_in_memory_merge_and_interpolation_refuse_another_kind():
    a = {"w": torch.randn(4), "steps": torch.tensor(3)}
    b = {"w": a["w"].view(torch.int32), "steps": torch.tensor(5)}
    for fn in (lambda: weighted_average([a, b]), lambda: mc.merge([a, b])):
        assert_kind_refused(fn, "w", "model 1")
    for lam in (0.5, 1.0):  # λ=1 used to cast B's int32 values to float: the same reinterpretation
        assert_kind_refused(lambda: interpolate(a, b, lam), "w", "B")
    half = {"w": a["w"].half(), "steps": torch.tensor(5, dtype=torch.int32)}  # precisions may differ
    assert weighted_average([a, half])["w"].dtype == torch.float32
    check_dtype_kinds([a, half])


# ----------------------------------------------------------------------------------- streaming checkpoints
@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    dirs = [root / "a", root / "b", root / "b-int", root / "b-half"]
    for seed, d in zip((0, 1), dirs[:2], strict=True):
        make("gpt_neox", seed).save_pretrained(d)
    shutil.copytree(dirs[1], dirs[2])
    relabel(dirs[2] / "model.safetensors", KEY)
    make("gpt_neox", 1).half().save_pretrained(dirs[3])
    return dirs


def test_streaming_refuses_an_integer_tensor_where_the_reference_is_floating(hf_pair, tmp_path):
    a, b, bad, _ = hf_pair
    spec = hf_checkpoint_spec(a)
    assert_kind_refused(lambda: hf_checkpoint_spec(bad), KEY, str(bad))  # against the model its config describes
    assert_kind_refused(lambda: stream_weight_matching(spec, a, bad, restarts=1, max_iter=1), KEY, str(bad))
    assert_kind_refused(lambda: stream_merge(spec, [a, bad], tmp_path / "m"), KEY, str(bad))
    assert_kind_refused(lambda: stream_merge(spec, [bad, a], tmp_path / "m"), KEY, str(bad))  # first = reference
    # the align recipe (streaming matching, then stream_apply of B) checks B against A before any work
    assert_kind_refused(lambda: align_hf_checkpoints(a, bad, tmp_path / "m", restarts=1, max_iter=1), KEY, str(bad))
    assert not (tmp_path / "m").exists()
    stream_merge(spec, [a, b], tmp_path / "m")  # the untampered pair merges


def test_cli_merge_refuses_with_the_tensor_and_both_dtypes(hf_pair, tmp_path):
    a, _, bad, _ = hf_pair
    res = run_cli("merge", a, bad, "--out", tmp_path / "o", "--align", "none", ok=False)
    assert res.exit_code == 2 and KEY in res.output and "int32" in res.output and "float32" in res.output, res.output
    assert not (tmp_path / "o").exists()


def test_streaming_still_merges_an_fp16_checkpoint_into_an_fp32_one(hf_pair, tmp_path):
    a, _, _, half = hf_pair
    spec = hf_checkpoint_spec(a)
    stream_merge(spec, [a, half], tmp_path / "m")
    out = load_file(tmp_path / "m" / "model.safetensors")
    ref = (load_file(a / "model.safetensors")[KEY] + load_file(half / "model.safetensors")[KEY].float()) / 2
    assert out[KEY].dtype == torch.float32 and torch.allclose(out[KEY], ref, atol=1e-3)


# --------------------------------------------------------------------------------------------- negative control
def test_negative_control_without_the_kind_check_the_reinterpreted_bytes_go_through(hf_pair, relabelled, tmp_path,
                                                                                     monkeypatch):
    """With the kind comparison disabled (every dtype "floating") the relabelled tensors load and merge silently as
    integers around 1e9: the refusals above are what stops them."""
    monkeypatch.setattr(checks_mod, "dtype_kind", lambda dtype: "floating")
    model, _ = load_checkpoint(relabelled)
    assert model.state_dict()["head.weight"].abs().max() > 1e6
    a, _, bad, _ = hf_pair
    stream_merge(hf_checkpoint_spec(a), [a, bad], tmp_path / "m")
    merged = load_file(tmp_path / "m" / "model.safetensors")[KEY]
    assert merged.abs().max() > 1e6  # the int32 reading of float32 bytes averaged into the weights
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):  # the check of this class now fails
        assert_kind_refused(lambda: weighted_average([{"w": torch.randn(3)}, {"w": torch.randn(3).view(torch.int32)}]),
                            "w")
