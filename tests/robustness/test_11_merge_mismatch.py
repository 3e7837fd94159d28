"""Class 11 — merging models with different key names, vocabulary sizes or layer counts.

A ``module.`` prefix (DDP), a resized vocabulary or an extra layer must not surface as a KeyError deep inside a
loop, a broadcasting error, or the first of many problems after minutes of loading. Every entry point compares
keys and shapes first (``modeconn.checks.check_compatible``, ``SymmetrySpec.check_state_dict``, the safetensors
header in ``load_checkpoint``) and raises *one* StateDictMismatchError listing every missing and extra key and
every shape difference with both shapes — before any arithmetic, forward pass or weight loading.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from rb_helpers import batches
from torch import nn

import modeconn as mc
from modeconn.errors import ConfigError, StateDictMismatchError
from modeconn.io import models as ckpt_mod
from modeconn.recipes.merge_modeconn import run_merge
from modeconn.io import load_checkpoint, save_checkpoint, save_state_dict
from modeconn.models import build_model
from modeconn.path import evaluate as evaluate_mod

io_mod = importlib.import_module("modeconn.io.checkpoint")
interp_mod = importlib.import_module("modeconn.path.interpolate")
weight_mod = importlib.import_module("modeconn.match.weight")
learned_mod = importlib.import_module("modeconn.match.learned")


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d: int = 6):
        super().__init__()
        self.embed, self.mix, self.head = nn.Embedding(vocab, d), nn.Linear(d, d), nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(torch.relu(self.mix(self.embed(tokens))))


def _mlp(depth, seed=0, width=8):
    return build_model("mlp", in_shape=(1, 4, 4), num_classes=3, depth=depth, width=width, seed=seed)


def _cases():
    a = _mlp(2)
    sd = a.state_dict()
    return {
        "renamed keys": (a, sd, {f"module.{k}": v for k, v in _mlp(2, 1).state_dict().items()},
                         [*sd], [f"module.{k}" for k in sd], []),
        "vocabulary size": (TinyLM(50), TinyLM(50).state_dict(), TinyLM(53).state_dict(), [], [],
                            [("embed.weight", (50, 6), (53, 6)), ("head.weight", (50, 6), (53, 6)), ("head.bias", (50,), (53,))]),
        "layer count": (a, sd, _mlp(3, 1, width=10).state_dict(), [], ["blocks.2.linear.weight", "blocks.2.linear.bias"],
                        [("blocks.0.linear.weight", (8, 16), (10, 16)), ("blocks.1.linear.bias", (8,), (10,)),
                         ("head.weight", (3, 8), (3, 10))]),
    }


def upfront_mismatch(fn) -> str:
    """Run ``fn``; it must raise StateDictMismatchError (nothing else); returns the message."""
    try:
        fn()
    except StateDictMismatchError as err:
        return str(err)
    except Exception as err:
        raise AssertionError(f"expected one StateDictMismatchError up front, got {type(err).__name__}: {err}") from err
    raise AssertionError("no error for incompatible state dicts")


def check_lists_everything(msg: str, missing, extra, shapes) -> None:
    for k in [*missing, *extra]:
        assert repr(k) in msg or k in msg, f"{k!r} not listed in: {msg}"
    for k, s1, s2 in shapes:
        assert k in msg and str(s1) in msg and str(s2) in msg, f"shape difference of {k} not listed in: {msg}"


def _boom(*args, **kwargs):
    raise AssertionError("heavy work started before the state dicts were compared")


@pytest.fixture
def no_heavy_work(monkeypatch):
    """Everything expensive after the up-front checks fails loudly if it is reached."""
    monkeypatch.setattr(evaluate_mod, "weighted_average", _boom)
    monkeypatch.setattr(evaluate_mod, "_Workbench", _boom)
    monkeypatch.setattr(interp_mod, "weighted_average", _boom)
    monkeypatch.setattr(weight_mod, "_Problem", _boom)
    monkeypatch.setattr(learned_mod, "weight_matching", _boom)


ENTRY_POINTS = {
    "merge": lambda m, a, b: mc.merge([a, b]),
    "merge with model": lambda m, a, b: mc.merge([a, b], model=m, bn="interpolate"),
    "weighted_average": lambda m, a, b: mc.path.weighted_average([a, b]),
    "interpolate": lambda m, a, b: mc.interpolate(a, b, 0.5),
    "evaluate_path": lambda m, a, b: mc.evaluate_path(m, a, b, [], lambdas=3, bn="interpolate"),
    "check_compatible": lambda m, a, b: mc.checks.check_compatible([a, b]),
}


@pytest.mark.parametrize("case", ["renamed keys", "vocabulary size", "layer count"])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_one_error_lists_every_difference_before_any_work(no_heavy_work, case, entry):
    model, sd_a, sd_b, missing, extra, shapes = _cases()[case]
    msg = upfront_mismatch(lambda: ENTRY_POINTS[entry](model, sd_a, sd_b))
    check_lists_everything(msg, missing, extra, shapes)


@pytest.mark.parametrize("case", ["renamed keys", "layer count"])
def test_alignment_entry_points(no_heavy_work, case):
    model, sd_a, sd_b, missing, extra, shapes = _cases()[case]
    spec = mc.symmetry_spec(model, torch.randn(2, 1, 4, 4))
    loader = batches((1, 4, 4), n=1)
    for fn in (lambda: mc.weight_matching(spec, sd_a, sd_b), lambda: mc.learned_matching(spec, model, sd_a, sd_b, loader)):
        check_lists_everything(upfront_mismatch(fn), missing, extra, shapes)


def test_negative_control_unchecked_merge_is_caught(monkeypatch):
    monkeypatch.setattr(evaluate_mod, "check_compatible", lambda *a, **k: None)  # broken: no up-front check
    _, sd_a, sd_b, *_ = _cases()["renamed keys"]
    with pytest.raises(AssertionError, match="KeyError"):
        upfront_mismatch(lambda: mc.merge([sd_a, sd_b]))


def test_negative_control_first_problem_only_is_caught(monkeypatch):
    def first_only(state_dicts, names=None):  # broken: stops at the first difference
        for k in state_dicts[0]:
            if k not in state_dicts[1]:
                raise StateDictMismatchError(f"key {k!r} missing")

    monkeypatch.setattr(interp_mod, "check_compatible", first_only)
    _, sd_a, sd_b, missing, extra, shapes = _cases()["renamed keys"]
    with pytest.raises(AssertionError, match="not listed"):
        check_lists_everything(upfront_mismatch(lambda: mc.interpolate(sd_a, sd_b, 0.5)), missing, extra, shapes)


def test_checkpoints_of_different_architectures_fail_before_weights_load(tmp_path, monkeypatch):
    save_checkpoint(tmp_path / "a", _mlp(2))
    save_checkpoint(tmp_path / "b", _mlp(3))
    monkeypatch.setattr(ckpt_mod, "load_checkpoint", _boom)
    with pytest.raises(ConfigError, match=r"depth.*3.*depth.*2|one architecture") as err:
        ckpt_mod.load_same_architecture([tmp_path / "a", tmp_path / "b"])
    assert str(tmp_path / "a") in str(err.value) and str(tmp_path / "b") in str(err.value)
    with pytest.raises(ConfigError, match="one architecture"):
        run_merge([tmp_path / "a", tmp_path / "b"], tmp_path / "out", align_method="none", bn="interpolate")
    assert not (tmp_path / "out").exists()


def test_weights_that_do_not_fit_their_config_fail_from_the_header(tmp_path, monkeypatch):
    ckpt = save_checkpoint(tmp_path / "c", _mlp(2))
    save_state_dict(ckpt / "model.safetensors", {f"module.{k}": v for k, v in _mlp(3).state_dict().items()})
    monkeypatch.setattr(io_mod, "load_state_dict", _boom)  # the tensors themselves must never be read
    with pytest.raises(StateDictMismatchError) as err:
        load_checkpoint(ckpt)
    msg = str(err.value)
    assert "missing keys: blocks.0.linear.bias" in msg and "module.blocks.2.linear.weight" in msg and "model.safetensors" in msg
