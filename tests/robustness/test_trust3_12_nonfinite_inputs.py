"""Issue #29, class 12 — broken inputs blamed on modeconn.

With NaN in a BatchNorm ``running_var`` of an input checkpoint, ``align`` said "internal error: alignment changed the
function (max |Δlogit| = nan)", ``path`` said "the search stopped before reaching B" (exit 3, outputs written) and
``check`` blamed its own evaluation. A non-finite floating tensor (parameter or buffer, any dtype) in an input
checkpoint is the input's problem: every command refuses it with a NonFiniteError naming the file and the tensor,
before any work, and writes nothing. The one seam is the checkpoint readers (:func:`modeconn.io.load_state_dict`
for modeconn and absorbed checkpoints, every tensor read of :class:`~modeconn.io.lazy.LazyCheckpoint` for streamed
ones, :meth:`~modeconn.io.lazy.LazyCheckpoint.check_finite` before transformers loads a Hugging Face directory).
The negative control removes the check from the readers and shows the old symptoms fail this class's check.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from hf_tiny import make
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import modeconn.io.safe as io_mod
import modeconn.io.lazy as io_stream_mod
from modeconn.checkpoints import open_checkpoint
from modeconn.errors import NonFiniteError
from modeconn.io import load_checkpoint, load_state_dict, save_checkpoint
from modeconn.io.lazy import LazyCheckpoint
from modeconn.models import build_model

# name → (tensor to break, value, dtype to store it in: None keeps the file's)
MODECONN_CASES = {
    "nan in a BatchNorm running_var": ("blocks.0.norm.running_var", float("nan"), None),
    "+inf in a weight": ("blocks.1.linear.weight", float("inf"), None),
    "-inf in a bf16 bias": ("head.bias", float("-inf"), torch.bfloat16),
}
HF_CASES = {
    "nan in a norm weight": ("model.norm.weight", float("nan"), None),
    "+inf in the embedding": ("model.embed_tokens.weight", float("inf"), None),
    "nan in a bf16 projection": ("model.layers.1.mlp.down_proj.weight", float("nan"), torch.bfloat16),
}
COMMANDS = {
    "align": ["align"],
    "align activation": ["align", "--method", "activation"],
    "merge": ["merge"],
    "barrier": ["barrier"],
    "path": ["path", "--method", "linear"],
    "check": ["check"],
}
HF_COMMANDS = {  # (a, b) → argv
    "align (streaming)": lambda a, b: ["align", a, b],
    "align --groups full (streaming)": lambda a, b: ["align", a, b, "--groups", "full"],
    "merge (streaming)": lambda a, b: ["merge", a, b],
    "merge --rule ties (streaming)": lambda a, b: ["merge", a, b, "--rule", "ties", "--base", a, "--align", "none",
                                                   "--param", "density=0.5"],
}


def corrupt(directory: Path, key: str, value: float, dtype: torch.dtype | None) -> Path:
    """Entry ``[0, …, 0]`` of tensor ``key`` set to ``value`` in the weights file holding it (stored in ``dtype``
    when given); returns that file."""
    file = directory / LazyCheckpoint(directory).infos[key].shard
    with safe_open(str(file), "pt") as f:
        meta = f.metadata()
    tensors = load_file(file)
    t = tensors[key].clone() if dtype is None else tensors[key].to(dtype)
    t.view(-1)[0] = value
    tensors[key] = t
    save_file(tensors, file, metadata=meta)
    return file


def _modeconn_pair(root: Path) -> list[Path]:
    dirs = []
    for seed in (0, 1):
        m = build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=2, width=8, norm="batchnorm", seed=seed)
        dirs.append(save_checkpoint(root / f"m{seed}", m, config={"dataset": "digits"}))
    return dirs


def _hf_pair(root: Path) -> list[Path]:
    dirs = [root / "hf_a", root / "hf_b"]
    for seed, d in enumerate(dirs):
        make("llama", seed).save_pretrained(d)
    return dirs


def refused(argv: list, out: Path, file: Path, key: str) -> str:
    """The check of this class: the command exits with status 2 and an error naming the file and the tensor (and
    no "internal error"), and neither ``out`` nor a temporary sibling of it exists. Returns the output."""
    res = run_cli(*argv, "--out", out, ok=False)
    text = res.output
    assert res.exit_code == 2, f"exit {res.exit_code}: a broken input was not refused:\n{text}"
    assert "error:" in text and str(file) in text and repr(key) in text, f"file / tensor not named:\n{text}"
    assert "non-finite" in text and "internal error" not in text, text
    assert not out.exists(), f"{out} was written although an input is broken"
    leftovers = [q.name for q in out.parent.iterdir() if out.name in q.name]
    assert not leftovers, f"temporary outputs left behind: {leftovers}"
    return text


# ----------------------------------------------------------------------------------------------- commands
@pytest.mark.parametrize("case", list(MODECONN_CASES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_a_non_finite_modeconn_input(tmp_path, command, case):
    key, value, dtype = MODECONN_CASES[case]
    a, b = _modeconn_pair(tmp_path)
    file = corrupt(b, key, value, dtype)
    refused([*COMMANDS[command][:1], a, b, *COMMANDS[command][1:]], tmp_path / "out", file, key)


@pytest.mark.parametrize("case", list(HF_CASES))
@pytest.mark.parametrize("command", list(HF_COMMANDS))
def test_streaming_align_and_merge_refuse_a_non_finite_hugging_face_input(tmp_path, command, case):
    key, value, dtype = HF_CASES[case]
    a, b = _hf_pair(tmp_path)
    file = corrupt(b, key, value, dtype)
    refused(HF_COMMANDS[command](a, b), tmp_path / "out", file, key)


def test_the_first_model_is_checked_too(tmp_path):
    a, b = _modeconn_pair(tmp_path)
    file = corrupt(a, "blocks.0.linear.bias", float("nan"), None)
    refused(["merge", a, b], tmp_path / "out", file, "blocks.0.linear.bias")
    ha, hb = _hf_pair(tmp_path)
    file = corrupt(ha, "lm_head.weight", float("-inf"), None)
    refused(["merge", ha, hb], tmp_path / "hf_out", file, "lm_head.weight")


# ----------------------------------------------------------------------------------------------- readers
def test_every_reader_names_the_file_and_tensor(tmp_path):
    a, _ = _modeconn_pair(tmp_path)
    key = "blocks.1.linear.weight"
    file = corrupt(a, key, float("inf"), None)
    lazy = LazyCheckpoint(a)
    for read in (lambda: load_checkpoint(a), lambda: load_state_dict(file), lambda: lazy[key], lambda: lazy.read(key),
                 lambda: lazy.read_rows(key, 0, 1), lazy.check_finite, lambda: open_checkpoint(a).load()):
        with pytest.raises(NonFiniteError, match=rf"{file}: tensor {key!r} .*1 non-finite"):
            read()
    assert lazy.read_rows(key, 1, 2).isfinite().all(), "rows without the bad entry read as ever"
    hf, _ = _hf_pair(tmp_path)
    file = corrupt(hf, "model.norm.weight", float("nan"), None)
    with pytest.raises(NonFiniteError, match=rf"{file}: tensor 'model.norm.weight'"):
        open_checkpoint(hf).load()  # before transformers reads the weights


def test_integer_buffers_and_finite_checkpoints_load_as_ever(tmp_path):
    a, _ = _modeconn_pair(tmp_path)
    model, _ = load_checkpoint(a)
    assert model.blocks[0].norm.num_batches_tracked.dtype == torch.int64
    shutil.copytree(a, tmp_path / "copy")
    assert set(LazyCheckpoint(tmp_path / "copy")) == set(model.state_dict())


def test_check_api_refuses_a_model_with_non_finite_weights(monkeypatch):
    """``modeconn.check`` on models in memory: the tensor is named before any forward pass (it used to give a
    verdict with +inf, or blame its own evaluation)."""
    import modeconn.path as path_mod
    from modeconn.data import load_dataset
    from modeconn.diagnostics import check

    def forward_pass(*args, **kwargs):
        raise AssertionError("a forward pass ran before the NaN/Inf weights were refused")

    monkeypatch.setattr(path_mod, "evaluate_model", forward_pass)
    a, b = (build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=2, width=8, norm="batchnorm", seed=s).eval()
            for s in (0, 1))
    with torch.no_grad():
        b.blocks[0].norm.running_var[0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"model B\['blocks.0.norm.running_var'\] has 1 NaN/Inf"):
        check(a, b, data=load_dataset("digits"), max_batches=1)


# ------------------------------------------------------------------------------------------ negative control
def test_negative_control_unchecked_readers_blame_modeconn(tmp_path, monkeypatch):
    """Without the readers' check (as before the fix) align reports an internal error and path writes an
    "incomplete" path: the check of this class fails on both."""
    for mod in (io_mod, io_stream_mod):
        monkeypatch.setattr(mod, "check_finite_stored", lambda t, *args: t)
    a, b = _modeconn_pair(tmp_path)
    key, value, dtype = MODECONN_CASES["nan in a BatchNorm running_var"]
    file = corrupt(b, key, value, dtype)
    with pytest.raises(AssertionError, match="not named"):
        refused(["align", a, b], tmp_path / "aligned", file, key)
    with pytest.raises(AssertionError, match="not refused"):
        refused(["path", a, b, "--method", "linear"], tmp_path / "path", file, key)
