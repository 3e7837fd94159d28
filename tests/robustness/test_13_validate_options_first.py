"""Class 13 — a misspelt method or option discovered only after a long load.

Options are validated before anything expensive: function options before any tracing, LAP, deep copy or forward
pass; experiment/CLI options before any checkpoint or dataset is read. The ordering is proven by combining the
typo with a checkpoint path that does not exist (the typo must be what is reported), or by making the expensive
step fail loudly if it is ever reached.
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from archs import make
from rb_helpers import batches
from typer.testing import CliRunner

import modeconn as mc
from modeconn.errors import ConfigError
from modeconn.diagnostics import compare as compare_mod
from modeconn.experiments import identifiability as ident_mod
from modeconn.recipes import merge_modeconn as merge_mod
from modeconn.recipes import merge_plan as merge_plan_mod
from modeconn.io import save_checkpoint
from modeconn.models import build_model
from modeconn.path import evaluate as evaluate_mod
from modeconn.train import TrainConfig

io_mod = importlib.import_module("modeconn.io.checkpoint")
weight_mod = importlib.import_module("modeconn.match.weight")
learned_mod = importlib.import_module("modeconn.match.learned")
activation_mod = importlib.import_module("modeconn.match.activation")
trace_mod = importlib.import_module("modeconn.symmetry.trace")


def assert_typo_first(fn, typo: str) -> None:
    """The check of this class: ``fn()`` fails with a ConfigError naming ``typo`` (and not with anything else)."""
    try:
        fn()
    except ConfigError as err:
        assert typo in str(err), f"ConfigError does not name {typo!r}: {err}"
        return
    except Exception as err:
        raise AssertionError(f"the typo {typo!r} was not reported first; got {type(err).__name__}: {err}") from err
    raise AssertionError(f"the typo {typo!r} was accepted")


def _boom(*args, **kwargs):
    raise AssertionError("expensive work started before the options were validated")


@pytest.fixture
def expensive_steps_explode(monkeypatch):
    for mod, name in [(weight_mod, "_Problem"), (learned_mod, "weight_matching"), (activation_mod, "capture"),
                      (trace_mod, "_fx_trace"), (evaluate_mod, "_Workbench"), (evaluate_mod, "weighted_average"),
                      (io_mod, "_open_safetensors_header"), (io_mod, "load_state_dict"), (compare_mod, "symmetry_spec"),
                      (ident_mod, "load_dataset"), (merge_mod, "load_same_architecture")]:
        monkeypatch.setattr(mod, name, _boom)


@pytest.fixture(scope="module")
def setup():
    model, x = make("mlp-bn")
    other, _ = make("mlp-bn", seed=1)
    return model, x, mc.symmetry_spec(model, x), model.state_dict(), other.state_dict(), batches(x.shape[1:], n=1)


FUNCTION_TYPOS = {
    "weight_matching init": (lambda m, x, s, a, b, ld: mc.weight_matching(s, a, b, init="greedyy"), "greedyy"),
    "weight_matching rtol": (lambda m, x, s, a, b, ld: mc.weight_matching(s, a, b, rtol=-1e-9), "rtol"),
    "weight_matching keys": (lambda m, x, s, a, b, ld: mc.weight_matching(s, a, b, keys=["blocks.0.lineer.weight"]),
                             "blocks.0.lineer.weight"),
    "weight_matching restarts": (lambda m, x, s, a, b, ld: mc.weight_matching(s, a, b, restarts=0), "restarts"),
    "learned lambda_sampling": (lambda m, x, s, a, b, ld: mc.learned_matching(s, m, a, b, ld, lambda_sampling="unifrom"),
                                "unifrom"),
    "activation max_batches": (lambda m, x, s, a, b, ld: mc.activation_matching(s, m, m, ld, max_batches=0), "max_batches"),
    "symmetry_spec on_unsupported": (lambda m, x, s, a, b, ld: mc.symmetry_spec(m, x, on_unsupported="frezee"), "frezee"),
    "evaluate_path bn": (lambda m, x, s, a, b, ld: mc.evaluate_path(m, a, b, ld, bn="rest", bn_loader=ld), "rest"),
    "evaluate_path lambdas": (lambda m, x, s, a, b, ld: mc.evaluate_path(m, a, b, ld, lambdas=[0.0, 2.0], bn_loader=ld), "lambdas"),
    "merge bn": (lambda m, x, s, a, b, ld: mc.merge([a, b], model=m, bn="rset", bn_loader=ld), "rset"),
    "build_model kwarg": (lambda m, x, s, a, b, ld: build_model("mlp", in_shape=(1, 4, 4), num_classes=2, widht=3), "widht"),
    "TrainConfig field": (lambda m, x, s, a, b, ld: TrainConfig(optimzer="sgd"), "optimzer"),
    "compare methods": (lambda m, x, s, a, b, ld: compare_mod.compare_alignments(m, a, b, None, ["naive", "wieght"]), "wieght"),
}


@pytest.mark.parametrize("case", list(FUNCTION_TYPOS))
def test_function_options_are_validated_before_any_work(expensive_steps_explode, setup, case):
    fn, typo = FUNCTION_TYPOS[case]
    assert_typo_first(lambda: fn(*setup), typo)


NOPE = ("/nonexistent/ckpt-a", "/nonexistent/ckpt-b")


@pytest.mark.parametrize(
    "kwargs, typo",
    [({"align_method": "wieght"}, "wieght"), ({"bn": "rest"}, "rest"), ({"weights": [0.5, 0.25, 0.25]}, "--weights")],
    ids=["align", "bn", "weights"],
)
def test_merge_recipe_reports_the_typo_not_the_missing_checkpoint(expensive_steps_explode, tmp_path, kwargs, typo):
    assert_typo_first(lambda: merge_mod.run_merge(list(NOPE), tmp_path / "out", **kwargs), typo)
    assert not (tmp_path / "out").exists()


def test_experiment_name_is_validated_before_data_loads(expensive_steps_explode, tmp_path):
    assert_typo_first(lambda: ident_mod.run_identifiability("identifiability-sigmaa", tmp_path / "out"), "identifiability-sigmaa")
    assert not (tmp_path / "out").exists()


def test_checkpoint_config_typo_is_reported_before_weights_are_read(expensive_steps_explode, tmp_path):
    ckpt = save_checkpoint(tmp_path / "c", build_model("mlp", in_shape=(1, 4, 4), num_classes=2, depth=1, width=4))
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["kwargs"]["widht"] = cfg["kwargs"].pop("width")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert_typo_first(lambda: mc.load_checkpoint(ckpt), "widht")


def test_negative_control_late_validation_is_caught(monkeypatch, tmp_path):
    monkeypatch.setattr(merge_plan_mod, "check_bn_policy", lambda bn: None)  # broken: bn only checked after loading
    with pytest.raises(AssertionError, match="not reported first.*CheckpointError"):
        assert_typo_first(lambda: merge_mod.run_merge(list(NOPE), tmp_path / "out", bn="rest"), "rest")


# ------------------------------------------------------------------------------------------------ command line
runner = CliRunner()


def cli_typo_first(args, typo: str) -> None:
    """The CLI check: non-zero exit, the typo named, nothing about the (non-existent) checkpoints."""
    res = runner.invoke(mc.cli.app, [str(a) for a in args])
    assert res.exit_code != 0, res.output
    assert typo in res.output, f"{typo!r} not reported: {res.output}"
    assert "not found" not in res.output and "nonexistent" not in res.output, f"the load ran first: {res.output}"


CLI_TYPOS = {
    "barrier --method": (["barrier", *NOPE, "--method", "wieght"], "wieght"),
    "barrier --bn": (["barrier", *NOPE, "--bn", "rest"], "rest"),
    "align --method": (["align", *NOPE, "--out", "OUT", "--method", "wieght"], "wieght"),
    "merge --align": (["merge", *NOPE, "--out", "OUT", "--align", "wieght"], "wieght"),
    "merge --bn": (["merge", *NOPE, "--out", "OUT", "--bn", "rest"], "rest"),
    "experiment name": (["experiment", "identifiability-sigmaa", "--out", "OUT"], "identifiability-sigmaa"),
    "train --optimizer": (["train", "--out", "OUT", "--optimizer", "sgdd", "--dataset", "mnist", "--data", "/nonexistent/data"],
                          "sgdd"),
}


@pytest.mark.parametrize("case", list(CLI_TYPOS))
def test_cli_reports_the_typo_before_loading(tmp_path, case):
    import modeconn.cli  # noqa: F401 - typer app

    args, typo = CLI_TYPOS[case]
    cli_typo_first([str(tmp_path / "out") if a == "OUT" else a for a in args], typo)
    assert not (tmp_path / "out").exists()


def test_negative_control_cli_without_method_check_is_caught(monkeypatch):
    import modeconn.cli  # noqa: F401

    monkeypatch.setattr(compare_mod, "check_methods", lambda methods: list(methods))  # broken: no up-front check
    with pytest.raises(AssertionError, match="not reported|the load ran first"):
        cli_typo_first(["barrier", *NOPE, "--method", "wieght"], "wieght")


def test_valid_options_still_run(setup):
    """The up-front checks accept every documented value (guards against over-eager validation)."""
    model, _, spec, a, b, loader = setup
    for init in ("greedy", "identity", spec.identity()):
        mc.weight_matching(spec, a, b, init=init, restarts=1, rtol=0.0, keys=[k for k in spec.tensors if spec.tensors[k]])
    mc.activation_matching(spec, model, model, loader, max_batches=1)
    for bn in ("reset", "interpolate", "keep", "repair"):
        mc.merge([a, b], model=model, bn=bn, bn_loader=loader, spec=spec)
    assert torch.is_tensor(mc.interpolate(a, b, 0.5)["head.weight"])
