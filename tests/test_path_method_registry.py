"""Adding a path method is one runner plus one registration: a toy method registered here (no command edited)
runs through ``modeconn path --method``, its options are checked by its own check before anything is loaded, and the
results name it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from modeconn.errors import ConfigError
from modeconn.path.methods import PATH_METHODS, PathMethod
from modeconn.path.pathobj import linear_path

sys.path.insert(0, str(Path(__file__).parent / "robustness"))
from trust_helpers import save_pair  # noqa: E402

CALLS: list[dict] = []


def _check(options: dict) -> None:
    unknown = set(options) - {"n"}
    if unknown:
        raise ConfigError(f"path method 'toy-line': unknown option {sorted(unknown)}")


def _run_toy(model, a, b, train, options, ctx):
    CALLS.append(dict(options))
    return linear_path(a, b, **options)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(PATH_METHODS, "_items", dict(PATH_METHODS._items))
    PATH_METHODS.register("toy-line")(PathMethod("toy-line", "a toy straight line", _run_toy, _check))
    CALLS.clear()
    yield


def test_a_registered_path_method_runs_through_the_command_line(toy, tmp_path, shared_data):
    a, b = save_pair(tmp_path)
    out = tmp_path / "out"
    res = run_cli("path", a, b, "--method", "toy-line", "-o", "n=3", "--dataset", "digits", "--eval-limit", "50",
                  "--sub-points", "1", "--out", out, ok=False)
    assert res.exit_code in (0, 3), res.output
    assert CALLS == [{"n": 3}]
    assert json.loads((out / "results.json").read_text())["method"] == "toy-line"


def test_a_registered_path_methods_own_check_refuses_its_options_before_any_work(toy, tmp_path, shared_data):
    a, b = save_pair(tmp_path)
    res = run_cli("path", a, b, "--method", "toy-line", "-o", "steps=3", "--dataset", "digits", "--out",
                  tmp_path / "out", ok=False)
    assert res.exit_code == 2 and CALLS == []
    assert "steps" in res.output


def test_without_the_registration_the_method_is_unknown(tmp_path, shared_data):
    a, b = save_pair(tmp_path)
    res = run_cli("path", a, b, "--method", "toy-line", "--dataset", "digits", "--out", tmp_path / "out", ok=False)
    assert res.exit_code == 2 and "toy-line" in res.output
