"""Trust round 3, class 2 — non-finite or meaningless merges written with exit 0.

mergekit rules were checked on their inputs only: ``lambda``/``t`` NaN or 1e39, ``--weights 1e300,…`` or a recipe
``lambda: .inf`` wrote checkpoints full of NaN/Inf; ``density`` < 0 or > 1 and ``t`` outside [0, 1] wrote a model
(a negative density returned the base bit for bit) that ``merge.json`` recorded as applied; a recipe filter matching
no tensor (``filter: mlpp``) silently fell back to the default; ``multislerp`` of three models was refused by a probe
on zero tensors although mergekit merges them.

Now every rule parameter has a range in the rule registry (:class:`~modeconn.path.merge_rules.ParamRange`, checked
for shared, per-model and filtered values before any work), weights must keep ``Σ|w|`` within float32, a filter that
selects no tensor is refused by name, every rule's output is checked per tensor (NaN/Inf from finite inputs is a
NonFiniteError naming rule and tensor, raised in the caller even though tensors are produced on a writer thread),
and ``merge.json`` records only what was applied.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from cli_runner import run_cli
from hf_tiny import make
from safetensors.torch import load_file

from modeconn.io import save_checkpoint
from modeconn.io.lazy import LazyCheckpoint
from modeconn.models import build_model

merge_rules_mod = importlib.import_module("modeconn.path.merge_rules")
interp_mod = importlib.import_module("modeconn.path.interpolate")
stream_mod = importlib.import_module("modeconn.recipes.hf_stream")


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    """Three tiny Llama checkpoints a, b, c (sharded)."""
    root = tmp_path_factory.mktemp("hf")
    for seed, name in enumerate("abc"):
        make("llama", seed).save_pretrained(root / name, max_shard_size="20KB")
    return root


@pytest.fixture(scope="module")
def mc(tmp_path_factory) -> Path:
    """Three tiny modeconn MLP checkpoints a, b, c."""
    root = tmp_path_factory.mktemp("mc")
    for seed, name in enumerate("abc"):
        save_checkpoint(root / name, build_model("mlp", in_shape=(1, 4, 4), num_classes=3, depth=2, width=6, seed=seed))
    return root


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    ckpt = LazyCheckpoint(path)
    return {k: ckpt[k].clone() for k in ckpt}


def assert_refused(res, out: Path, *names: str) -> None:
    """Exit 2 with a modeconn error (no traceback) naming every string of ``names``; ``out`` not created."""
    text = " ".join(res.output.split())  # rich wraps long lines
    assert res.exit_code == 2, f"exit {res.exit_code}: {res.output}{res.exception!r}"
    assert "Traceback" not in res.output and "error:" in text, res.output
    missing = [n for n in names if n not in text]
    assert not missing, f"the error does not name {missing}: {res.output}"
    assert not out.exists(), "a refused merge wrote its output"


def _recipe(root: Path, tmp_path: Path, rule: str, params: dict, *, base: bool = True, n: int = 2,
            model_params: dict | None = None, extra: dict | None = None) -> Path:
    models = [{"model": str(root / m), **({"parameters": model_params} if model_params and i else {})}
              for i, m in enumerate("abc"[:n])]
    recipe = {"merge_method": rule, "models": models, "parameters": params, "align": {"method": "none"},
              **({"base_model": str(root / "a")} if base else {}), **(extra or {})}
    file = tmp_path / "recipe.yml"
    file.write_text(yaml.safe_dump(recipe))
    return file


# ------------------------------------------------------------------------- ranges, before any work (CLI)
# flags → the strings the error must name
FLAG_CASES = {
    "lambda 1e39": (["--rule", "task_arithmetic", "--base", "a", "--param", "lambda=1e39"], ["'lambda'", "1e39"]),
    "lambda nan": (["--rule", "task_arithmetic", "--base", "a", "--param", "lambda=.nan"], ["'lambda'", "nan"]),
    "t nan": (["--rule", "slerp", "--base", "a", "--param", "t=.nan"], ["'t'", "nan", "[0, 1]"]),
    "t 1.5": (["--rule", "slerp", "--base", "a", "--param", "t=1.5"], ["'t'", "1.5", "[0, 1]"]),
    "t -0.1": (["--rule", "slerp", "--base", "a", "--param", "t=-0.1"], ["'t'", "-0.1"]),
    "density -0.1": (["--rule", "ties", "--base", "a", "--param", "density=-0.1"], ["'density'", "-0.1"]),
    "density 1.5": (["--rule", "dare_linear", "--base", "a", "--param", "density=1.5"], ["'density'", "1.5"]),
    "gamma 2": (["--rule", "breadcrumbs", "--base", "a", "--param", "gamma=2"], ["'gamma'", "2"]),
    "epsilon 0.7": (["--rule", "della", "--base", "a", "--param", "epsilon=0.7"], ["'epsilon'", "0.7"]),
    "eps negative": (["--rule", "multislerp", "--param", "eps=-1.0"], ["'eps'", "-1.0"]),
    "max_iter 0": (["--rule", "karcher", "--param", "max_iter=0"], ["'max_iter'", "integer"]),
    "tol inf": (["--rule", "karcher", "--param", "tol=.inf"], ["'tol'", "inf"]),
    "flag not a bool": (["--rule", "ties", "--base", "a", "--param", "normalize=2"], ["'normalize'", "true or false"]),
    "task-vector weights 1e300": (["--rule", "task_arithmetic", "--base", "a", "--weights", "1e300,1e300"],
                                  ["--weights[0]", "float32"]),
    "linear weights 1e300 as given": (["--weights", "1e300,1e300", "--no-normalize"], ["--weights[0]", "float32"]),
}


@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_out_of_range_settings_are_refused_on_hugging_face_checkpoints(hf, tmp_path, case):
    flags, names = FLAG_CASES[case]
    flags = [str(hf / "a") if f == "a" else f for f in flags]
    res = run_cli("merge", hf / "a", hf / "b", "--align", "none", *flags, "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", *names)


@pytest.mark.parametrize("case", ["lambda 1e39", "t 1.5", "density -0.1", "task-vector weights 1e300"])
def test_out_of_range_settings_are_refused_on_modeconn_checkpoints(mc, tmp_path, case):
    flags, names = FLAG_CASES[case]
    flags = [str(mc / "a") if f == "a" else f for f in flags]
    res = run_cli("merge", mc / "a", mc / "b", "--align", "none", "--bn", "interpolate", *flags, "--out",
                  tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", *names)


# recipe parameters → the strings the error must name
RECIPE_CASES = {
    "lambda .inf": ("task_arithmetic", {"lambda": float("inf")}, None, ["'lambda'", "inf"]),
    "t nan (a string in YAML)": ("slerp", {"t": "nan"}, None, ["'t'", "nan"]),
    "t 1e39 (a string in YAML)": ("slerp", {"t": "1e39"}, None, ["'t'", "1e39"]),
    "filter value out of range": ("ties", {"density": [{"filter": "mlp", "value": 2.0}, {"value": 0.5}]}, None,
                                  ["'density'", "filter 'mlp'", "2.0"]),
    "per-model density": ("ties", {}, {"density": 1.5}, ["models[1]", "'density'", "1.5"]),
    "filter matching no tensor": ("ties", {"density": [{"filter": "mlpp", "value": 0.3}, {"value": 0.5}]}, None,
                                  ["parameters.density", "'mlpp'", "matches no tensor"]),
    "filter shadowed by an earlier one": ("ties", {"density": [{"filter": "mlp", "value": 0.3},
                                                               {"filter": "mlp.up", "value": 0.5}, {"value": 0.7}]},
                                          None, ["'mlp.up'", "earlier entry"]),
}


@pytest.mark.parametrize("case", list(RECIPE_CASES))
@pytest.mark.parametrize("align", ["none", "weight"])
def test_bad_recipe_parameters_are_refused(hf, tmp_path, monkeypatch, case, align):
    rule, params, model_params, names = RECIPE_CASES[case]
    monkeypatch.setattr(stream_mod, "weight_matching", _no_heavy_work)  # refused before the alignment
    file = _recipe(hf, tmp_path, rule, params, model_params=model_params, extra={"align": {"method": align}})
    res = run_cli("merge", "--config", file, "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", *names)


def _no_heavy_work(*args, **kwargs):
    raise AssertionError("the alignment started before the recipe was refused")


@pytest.mark.parametrize("model_params, names", [({"lambda": 0.5}, ["models[1].parameters.lambda", "shared"]),
                                                 ({"density": 0.5}, ["models[0].parameters.density", "base model"])],
                         ids=["shared parameter per model", "task-vector parameter on the base"])
def test_per_model_values_the_rule_would_not_apply_are_refused(hf, tmp_path, model_params, names):
    """mergekit reads a shared parameter only from the shared ones, and a task-vector parameter of the base never."""
    file = _recipe(hf, tmp_path, "ties", {"density": 0.5}, model_params=model_params)
    if "density" in model_params:  # on the base (models[0]) instead of the others
        recipe = yaml.safe_load(file.read_text())
        recipe["models"][0]["parameters"], recipe["models"][1] = model_params, {"model": recipe["models"][1]["model"]}
        file.write_text(yaml.safe_dump(recipe))
    res = run_cli("merge", "--config", file, "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", *names)


def test_filter_matching_no_tensor_is_refused_on_modeconn_checkpoints(mc, tmp_path):
    file = _recipe(mc, tmp_path, "ties", {"density": [{"filter": "mlpp", "value": 0.3}, {"value": 0.5}]})
    res = run_cli("merge", "--config", file, "--bn", "interpolate", "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", "'mlpp'", "matches no tensor")


# ------------------------------------------------------------------- outputs checked, tensor by tensor
OVERFLOW = {"lambda": 1.0e30}, {"weight": 1.0e30}  # each within float32's range, their product is not


def test_an_overflowing_rule_is_named_with_its_tensor_and_nothing_is_written(hf, tmp_path):
    """lambda and weight within float32's range, but the scaled task vector overflows: the writer thread's
    NonFiniteError is re-raised in the caller as a modeconn error naming the rule and the tensor."""
    file = _recipe(hf, tmp_path, "task_arithmetic", OVERFLOW[0], model_params=OVERFLOW[1])
    res = run_cli("merge", "--config", file, "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", "'task_arithmetic'", "NaN/Inf", "from finite inputs")
    text = " ".join(res.output.split())
    assert any(f"tensor '{k}'" in text for k in _tensors(hf / "a")), res.output


def test_an_overflow_of_the_output_dtype_is_named(hf, tmp_path):
    res = run_cli("merge", hf / "a", hf / "b", "--align", "none", "--weights", "1e6,1e6", "--no-normalize",
                  "--dtype", "float16", "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", "'linear'", "overflows float16")


def test_an_overflowing_rule_is_named_on_modeconn_checkpoints(mc, tmp_path):
    file = _recipe(mc, tmp_path, "task_arithmetic", OVERFLOW[0], model_params=OVERFLOW[1])
    res = run_cli("merge", "--config", file, "--bn", "interpolate", "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", "'task_arithmetic'", "NaN/Inf")


# --------------------------------------------------------------------------- the probe and the record
def test_multislerp_of_three_models_merges_as_mergekit_does(hf, tmp_path):
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    recipe = {"merge_method": "multislerp", "models": [{"model": str(hf / m), "parameters": {"weight": w}}
                                                       for m, w in zip("abc", (0.5, 0.3, 0.2), strict=True)]}
    run_merge(MergeConfiguration.model_validate(recipe), str(tmp_path / "mergekit"),
              MergeOptions(copy_tokenizer=False, quiet=True, out_shard_size=1 << 30))
    file = tmp_path / "r.yml"
    file.write_text(yaml.safe_dump({**recipe, "align": {"method": "none"}}))
    run_cli("merge", "--config", file, "--out", tmp_path / "ours")
    ours, ref = _tensors(tmp_path / "ours"), _tensors(tmp_path / "mergekit")
    assert set(ours) == set(ref)
    assert all(torch.equal(ours[k], ref[k]) for k in ref)
    run_cli("merge", hf / "a", hf / "b", hf / "c", "--align", "none", "--rule", "multislerp", "--out",
            tmp_path / "flags")  # the command line too (uniform weights)


def test_merge_json_records_only_what_was_applied(hf, tmp_path):
    run_cli("merge", hf / "a", hf / "b", "--align", "none", "--rule", "slerp", "--base", hf / "a", "--param", "t=0.3",
            "--out", tmp_path / "slerp")
    rec = json.loads((tmp_path / "slerp" / "merge.json").read_text())
    assert rec["weights"] is None and rec["seed"] is None and rec["align_settings"] is None  # none were applied
    assert rec["params"] == {"t": 0.3}
    run_cli("merge", hf / "a", hf / "b", hf / "c", "--align", "none", "--rule", "dare_ties", "--base", hf / "a",
            "--param", "density=0.5", "--weights", "1,0.6,0.4", "--seed", 4, "--out", tmp_path / "dare")
    rec = json.loads((tmp_path / "dare" / "merge.json").read_text())
    assert rec["weights"] == [None, 0.6, 0.4] and rec["seed"] == 4  # the base is not weighted
    assert rec["params"] == {"density": 0.5}


# ---------------------------------------------------------------------------------- negative controls
def test_negative_control_unchecked_ranges_are_caught(hf, tmp_path, monkeypatch):
    monkeypatch.setattr(merge_rules_mod, "_check_ranges", lambda rule, settings: None)  # broken: no range check
    flags, names = FLAG_CASES["density -0.1"]
    res = run_cli("merge", hf / "a", hf / "b", "--align", "none", *[str(hf / "a") if f == "a" else f for f in flags],
                  "--out", tmp_path / "o", ok=False)
    with pytest.raises(AssertionError):
        assert_refused(res, tmp_path / "o", *names)


def test_negative_control_unchecked_outputs_are_caught(hf, tmp_path, monkeypatch):
    monkeypatch.setattr(interp_mod, "all_finite", lambda t: True)  # broken: no output check
    file = _recipe(hf, tmp_path, "task_arithmetic", OVERFLOW[0], model_params=OVERFLOW[1])
    res = run_cli("merge", "--config", file, "--out", tmp_path / "o", ok=False)
    with pytest.raises(AssertionError):
        assert_refused(res, tmp_path / "o", "'task_arithmetic'", "NaN/Inf")
    written = [t for f in (tmp_path / "o").glob("*.safetensors") for t in load_file(f).values()]
    assert any(not torch.isfinite(t).all() for t in written)  # what the check prevents


def test_negative_control_unchecked_filters_are_caught(hf, tmp_path, monkeypatch):
    monkeypatch.setattr(merge_rules_mod, "_check_entries", lambda entries, keys, where: None)  # broken
    file = _recipe(hf, tmp_path, *RECIPE_CASES["filter matching no tensor"][:2])
    res = run_cli("merge", "--config", file, "--out", tmp_path / "o", ok=False)
    with pytest.raises(AssertionError):
        assert_refused(res, tmp_path / "o", "'mlpp'")
