"""Progress of the long phases in the API: activation matching, the barrier comparison (whose alignment phase
ran silent for minutes) and check report each stage through the one protocol; their default ``progress=True`` draws tqdm bars
on stderr and ``progress=False`` is silent."""

from __future__ import annotations

import pytest
import torch

import modeconn as mc
from modeconn.data import load_dataset
from modeconn.diagnostics.compare import compare_alignments
from modeconn.models import build_model


@pytest.fixture(autouse=True)
def _tqdm_on(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)


@pytest.fixture(scope="module")
def digits_pair():
    bundle = load_dataset("digits", limit_train=200)
    a, b = (build_model("mlp", seed=s, in_shape=(1, 8, 8), num_classes=10, width=16, depth=1) for s in (0, 1))
    return bundle, a, b


def _loader(bundle):
    return torch.utils.data.DataLoader(bundle.train, batch_size=50)


def test_activation_matching_shows_a_bar_by_default_and_is_silent_when_asked(digits_pair, capsys):
    bundle, a, b = digits_pair
    spec = mc.symmetry_spec(a, bundle.train.tensors[0][:2])
    mc.activation_matching(spec, a, b, _loader(bundle))
    err = capsys.readouterr().err
    assert "activation statistics" in err and "assignment" in err
    mc.activation_matching(spec, a, b, _loader(bundle), progress=False)
    assert capsys.readouterr().err == ""  # negative control


def test_the_barrier_comparison_reports_its_alignment_and_path_phases(digits_pair, capsys):
    bundle, a, b = digits_pair
    calls = []
    compare_alignments(a, a.state_dict(), b.state_dict(), bundle, ["naive", "activation"], lambdas=3, eval_limit=50,
                       progress=lambda stage, done, total, **m: calls.append((stage, done, total)))
    stages = {stage for stage, _, _ in calls}
    assert {"activation statistics", "assignment", "path points (naive)", "path points (activation)"} <= stages
    assert ("path points (activation)", 3, 3) in calls
    capsys.readouterr()
    compare_alignments(a, a.state_dict(), b.state_dict(), bundle, ["activation"], lambdas=3, eval_limit=50)
    assert "activation statistics" in capsys.readouterr().err  # the default: tqdm bars
    compare_alignments(a, a.state_dict(), b.state_dict(), bundle, ["activation"], lambdas=3, eval_limit=50,
                       progress=False)
    assert capsys.readouterr().err == ""


def test_check_reports_its_phases(digits_pair, capsys):
    bundle, a, b = digits_pair
    calls = []
    mc.check(a, b, data=bundle, max_batches=1, eval_limit=50,
             progress=lambda stage, done, total, **m: calls.append((stage, done, total, m.get("phase"))))
    phases = [c for c in calls if c[0] == "check"]
    assert phases == [("check", 0, 4, "endpoints"), ("check", 1, 4, "realization costs"),
                      ("check", 2, 4, "weight matching"), ("check", 3, 4, "activations"), ("check", 4, 4, None)]
    assert any(c[0].startswith("run 1/") for c in calls)  # weight matching's own sweeps
    capsys.readouterr()
    mc.check(a, b, data=bundle, max_batches=1, eval_limit=50)
    assert "check" in capsys.readouterr().err
    mc.check(a, b, data=bundle, max_batches=1, eval_limit=50, progress=False)
    assert capsys.readouterr().err == ""


def test_weight_matching_and_evaluate_path_take_progress_true(digits_pair, capsys):
    bundle, a, b = digits_pair
    spec = mc.symmetry_spec(a, bundle.train.tensors[0][:2])
    mc.weight_matching(spec, a.state_dict(), b.state_dict(), progress=True)
    mc.evaluate_path(a, a.state_dict(), b.state_dict(), {"test": _loader(bundle)}, lambdas=3, progress=True)
    err = capsys.readouterr().err
    assert "sweep" in err and "path points" in err
    mc.weight_matching(spec, a.state_dict(), b.state_dict(), progress=False)
    mc.evaluate_path(a, a.state_dict(), b.state_dict(), {"test": _loader(bundle)}, lambdas=3, progress=False)
    assert capsys.readouterr().err == ""
