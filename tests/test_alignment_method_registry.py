"""Adding an alignment method exposed on the command line is one module plus one registration: a toy method (its own
function and StrictConfig, registered here; no command edited) runs through ``modeconn align --method`` and
``modeconn merge --align`` with its option given by ``-o``, is listed by ``align --help`` and ``merge --help``, and its
config refuses a bad option before any work."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from modeconn.config import StrictConfig
from modeconn.match.methods import ALIGNMENT_METHODS, AlignmentMethod, register
from modeconn.match.options import PositiveInt
from modeconn.match.result import Alignment

sys.path.insert(0, str(Path(__file__).parent / "robustness"))
from trust_helpers import save_pair  # noqa: E402

CALLS: list[int] = []


class ToyConfig(StrictConfig):
    """The toy method's one option."""

    tag: PositiveInt = 1


def toy_identity(spec, sd_a, sd_b, config=None, **options) -> Alignment:
    """The identity element, recording the option it ran with."""
    cfg = ToyConfig.from_any(config, **options)
    CALLS.append(cfg.tag)
    return Alignment("toyident", spec, spec.identity(), 0.0, stats={"tag": cfg.tag})


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(ALIGNMENT_METHODS, "_items", dict(ALIGNMENT_METHODS._items))  # removed after the test
    register(AlignmentMethod("toyident", "toy identity alignment", toy_identity, ToyConfig, "none", needs_data=False,
                             streams=False, groups=None, objective_sense="maximize"))
    CALLS.clear()
    yield


def _flat(text: str) -> str:
    """Help text without rich's box characters and line wrapping."""
    return "".join(text.replace("│", " ").split())


def test_a_registered_method_runs_through_align(toy, tmp_path, shared_data):
    a, b = save_pair(tmp_path)
    out = tmp_path / "aligned"
    run_cli("align", a, b, "--method", "toyident", "-o", "tag=3", "--out", out)
    assert CALLS == [3]
    record = json.loads((out / "alignment.json").read_text())
    assert record["options"] == {"tag": 3} and record["stats"]["tag"] == 3
    from modeconn.io import load_state_dict

    aligned, original = load_state_dict(out / "model.safetensors"), load_state_dict(b / "model.safetensors")
    assert all(torch.equal(aligned[k], original[k]) for k in original)  # the identity element moves nothing


def test_a_registered_method_runs_through_merge(toy, tmp_path, shared_data):
    a, b = save_pair(tmp_path)
    out = tmp_path / "merged"
    run_cli("merge", a, b, "--align", "toyident", "-o", "tag=2", "--bn", "interpolate", "--out", out)
    assert CALLS == [2]
    config = json.loads((out / "config.json").read_text())
    assert config["align"] == "toyident" and config["align_settings"]["tag"] == 2


def test_a_registered_method_is_listed_by_help(toy):
    assert "toyident—toyidentityalignment" in _flat(run_cli("align", "--help").output)
    assert "toyident" in _flat(run_cli("merge", "--help").output)


def test_its_config_refuses_a_bad_option_before_any_work(toy, tmp_path, shared_data):
    a, b = save_pair(tmp_path)
    for command, flag in (("align", "--method"), ("merge", "--align")):
        res = run_cli(command, a, b, flag, "toyident", "-o", "tag=0", "--out", tmp_path / "x", ok=False)
        assert res.exit_code == 2 and "tag" in res.output, res.output
        res = run_cli(command, a, b, flag, "toyident", "-o", "steps=5", "--out", tmp_path / "x", ok=False)
        assert res.exit_code == 2 and "steps" in res.output and "toyident" in res.output and "tag" in res.output
    assert CALLS == [] and not (tmp_path / "x").exists()


def test_without_the_registration_the_method_is_unknown(tmp_path, shared_data):
    a, b = save_pair(tmp_path)
    res = run_cli("align", a, b, "--method", "toyident", "--out", tmp_path / "x", ok=False)
    assert res.exit_code == 2 and "toyident" in res.output
    assert "toyident" not in _flat(run_cli("align", "--help").output)


def test_a_registered_method_runs_through_barrier_with_its_option(toy, tmp_path, shared_data):
    a, b = save_pair(tmp_path)
    out = tmp_path / "barrier"
    run_cli("barrier", a, b, "--method", "naive", "--method", "toyident", "-o", "tag=4", "--dataset", "digits", "--lambdas", "2",
            "--eval-limit", "50", "--out", out)
    assert CALLS == [4]
    assert "toyident" in json.loads((out / "results.json").read_text())["methods"]
    assert "toyident" in _flat(run_cli("barrier", "--help").output)
    res = run_cli("barrier", a, b, "--method", "toyident", "-o", "tag=0", "--out", tmp_path / "x", ok=False)
    assert res.exit_code == 2 and "tag" in res.output and CALLS == [4]
