"""Adding a checkpoint kind is one module: a toy kind registered here (detect + its operations, no command edited)
reaches every command that reads checkpoints — align, merge, check, barrier, path — through the CLI's recipes, and a
kind without an operation is refused by name."""

from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

from modeconn.checkpoints import CHECKPOINT_KINDS, CheckpointKind, kinds_supporting, open_checkpoint, register_kind
from modeconn.errors import ConfigError


def _reached(operation: str):
    def op(*args, **kwargs):
        raise ConfigError(f"toy kind: {operation} reached")
    return op


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """Two toy checkpoint directories and the toy kind, registered for this test only."""
    import modeconn.recipes.align, modeconn.recipes.check, modeconn.recipes.merge, modeconn.recipes.pair  # noqa: E401, F401  (the built-in kinds' operations attached before the registry is copied)

    monkeypatch.setattr("modeconn.checkpoints.base.CHECKPOINT_KINDS", dict(CHECKPOINT_KINDS))
    import modeconn.checkpoints.base as base

    monkeypatch.setattr("modeconn.checkpoints.base._SUPPORT_ORDER", {k: list(v) for k, v in base._SUPPORT_ORDER.items()})
    kind = register_kind(CheckpointKind("toy", "toy", lambda c: c.get("toy") is True, _reached("load")))
    for operation in ("align", "merge", "check", "pair"):
        kind.supports(operation, _reached(operation))
    dirs = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"toy": True}))
        dirs.append(d)
    return kind, dirs


COMMANDS = {
    "align": (["align"], "align"),
    "merge": (["merge"], "merge"),
    "check": (["check"], "check"),
    "barrier": (["barrier"], "pair"),
    "path": (["path", "--method", "linear"], "pair"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_registered_kind_reaches_every_command(toy, tmp_path, command):
    _, (a, b) = toy
    args, operation = COMMANDS[command]
    res = run_cli(args[0], a, b, *args[1:], "--out", tmp_path / "out", ok=False)
    assert res.exit_code == 2 and f"toy kind: {operation} reached" in res.output, res.output


def test_a_kind_without_an_operation_is_refused_by_name(toy, tmp_path):
    kind, (a, b) = toy
    del kind.operations["merge"]
    assert open_checkpoint(a).kind is kind and "toy" not in kinds_supporting("merge")
    res = run_cli("merge", a, b, "--out", tmp_path / "out", ok=False)
    assert res.exit_code == 2 and "merge reads modeconn, huggingface checkpoints" in res.output and "(toy)" in res.output
