"""Adding a checkpoint kind that loads in memory is one module (issue #30 item 2, #31 item 1): the toy kind below —
detect, load, save, example input, nothing else, no command edited — runs through every command (align, merge,
barrier, check, path) from the CLI, on the built-in ``digits`` dataset, and its outputs are written by its own
``save`` and reload as the same kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from torch import nn

from modeconn.checkpoints import CHECKPOINT_KINDS, Checkpoint, CheckpointKind, open_checkpoint, register_kind
from modeconn.io import atomic_directory, load_state_dict, save_state_dict

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------ the toy kind: one module's worth
WEIGHTS = "toy.safetensors"


def _build(config: dict) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, config["toy"]["hidden"]), nn.ReLU(),
                         nn.Linear(config["toy"]["hidden"], 10))


def _load(path: Path) -> nn.Module:
    model = _build(json.loads((path / "config.json").read_text()))
    model.load_state_dict(load_state_dict(path / WEIGHTS))
    return model.eval()


def _save(out: Path, model: nn.Module, source: Checkpoint, *, config: dict, keep_source: bool = False, metrics=None,
          extra_json=None, overwrite: bool = False, inputs=(), command: str = "save") -> Path:
    with atomic_directory(out, overwrite, inputs=inputs, command=command) as tmp:
        (tmp / "config.json").write_text(json.dumps({"toy": source.config["toy"], "record": config}))
        save_state_dict(tmp / WEIGHTS, model.state_dict())
        for name, payload in (extra_json or {}).items():
            (tmp / name).write_text(json.dumps(payload))
    return Path(out)


TOY = CheckpointKind("toy", "toy", lambda c: isinstance(c.get("toy"), dict), _load, save=_save,
                     example_input=lambda c: torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)))
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """Two toy checkpoints, the toy kind registered for this test only."""
    import modeconn.checkpoints.base as base
    import modeconn.recipes.align, modeconn.recipes.check, modeconn.recipes.merge, modeconn.recipes.pair  # noqa: E401, F401  (the generic operations registered)

    monkeypatch.setattr(base, "CHECKPOINT_KINDS", dict(CHECKPOINT_KINDS))
    register_kind(TOY)
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = _build({"toy": {"hidden": 16}})
        d = tmp_path / f"m{seed}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"toy": {"hidden": 16}}))
        save_state_dict(d / WEIGHTS, model.state_dict())
        dirs.append(d)
    return dirs


DATA = ("--dataset", "digits")


def _logits(model, x=torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))):
    with torch.no_grad():
        return model(x)


def test_the_toy_kind_is_in_memory_and_reaches_align(toy, tmp_path):
    a, b = toy
    assert open_checkpoint(a).kind is TOY and TOY.in_memory and "align" not in TOY.operations
    for method, extra in (("weight", ()), ("activation", DATA)):
        out = tmp_path / f"aligned-{method}"
        run_cli("align", a, b, "--method", method, *extra, "--out", out)
        aligned = open_checkpoint(out)
        assert aligned.kind is TOY and aligned.config["record"]["alignment"] == method
        assert torch.allclose(_logits(aligned.load()), _logits(_load(b)), atol=1e-5)
        assert not torch.equal(aligned.load()[1].weight, _load(b)[1].weight)  # permuted: the check is not vacuous


def test_the_toy_kind_reaches_merge(toy, tmp_path):
    run_cli("merge", *toy, *DATA, "--out", tmp_path / "merged")
    merged = open_checkpoint(tmp_path / "merged")
    assert merged.kind is TOY and merged.config["record"]["merged_from"]
    run_cli("merge", *toy, "--align", "none", "--weights", "1,0", "--out", tmp_path / "first")
    assert torch.allclose(_logits(open_checkpoint(tmp_path / "first").load()), _logits(_load(toy[0])), atol=1e-6)


@pytest.mark.parametrize("command", [["barrier", "--lambdas", "3", "--method", "naive", "--method", "weight"],
                                     ["check", "--max-batches", "1"], ["path", "--method", "linear"]])
def test_the_toy_kind_reaches_the_data_commands(toy, tmp_path, command):
    run_cli(command[0], *toy, *command[1:], *DATA, "--out", tmp_path / "out")
    assert (tmp_path / "out" / "results.json").is_file()


def test_the_toy_kind_is_fed_only_a_dataset_its_model_takes(toy, tmp_path):
    res = run_cli("barrier", *toy, "--dataset", "fashion-mnist", "--out", tmp_path / "out", ok=False)
    assert res.exit_code == 2 and "(1, 28, 28)" in res.output and "(1, 8, 8)" in res.output, res.output
    res = run_cli("barrier", *toy, "--out", tmp_path / "out", ok=False)
    assert res.exit_code == 2 and "records no dataset; pass --dataset" in res.output, res.output


def test_negative_control_a_kind_without_in_memory_hooks_is_refused(toy, tmp_path, monkeypatch):
    import modeconn.checkpoints.base as base

    monkeypatch.setitem(base.CHECKPOINT_KINDS, "toy", CheckpointKind("toy", "toy", TOY.detect, _load))
    res = run_cli("align", *toy, "--out", tmp_path / "out", ok=False)
    assert res.exit_code == 2 and "(toy) is not one" in res.output and "timm, torchvision" in res.output, res.output
