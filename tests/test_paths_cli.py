"""`modeconn path` and the path-finding dispatch (recipes.path, path.methods): every method through the CLI on real data,
options validated before anything is loaded, resume of a killed LLPF search, and LLPFConfig's rules."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runner import run_cli as _run

from modeconn.data import load_dataset
from modeconn.errors import ConfigError
from modeconn.path.methods import PATH_METHODS, check_path_options, find_path
from modeconn.recipes.path import run_path
from modeconn.io import load_checkpoint
from modeconn.models import build_model
from modeconn.path import LLPFConfig, Path, fdf_groups, llpf_m2m

pytestmark = pytest.mark.usefixtures("one_thread")
LLPF_OPTS = ["-o", "ticks=12", "-o", "step=0.25", "-o", "lr=0.05", "-o", "threshold=0.15", "-o", "min_steps=3",
             "-o", "max_steps=60", "-o", "batch_size=64"]




@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    for name, seed in (("a", 0), ("b", 1)):
        _run("train", "--out", root / name, "--dataset", "digits", "--epochs", "15", "--seed", seed,
             "-m", "width=48", "-m", "depth=2", "--batch-size", "64", "--lr", "0.05")
    return root


def _results(out):
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_every_method_through_the_cli_gives_a_saved_path_with_the_checkpoints_as_endpoints(pair):
    peaks = {}
    for method, extra in [("linear", []), ("llpf", LLPF_OPTS), ("bezier", ["--budget", "60", "-o", "lr=0.05"]),
                          ("autoneb", ["--budget", "60", "-o", "lr=0.05", "-o", "steps_per_cycle=5"])]:
        out = pair / f"out-{method}"
        _run("path", pair / "a", pair / "b", "--method", method, *extra, "--out", out, "--sub-points", "1")
        r = _results(out)
        assert {"results.json", "report.md", "path_loss.png", "path"} <= {p.name for p in out.iterdir()}
        model_a, _ = load_checkpoint(pair / "a")
        model_b, _ = load_checkpoint(pair / "b")
        path = Path.load(out / "path", model_a)
        for point, model in ((path[0], model_a), (path[len(path) - 1], model_b)):
            assert all(torch.equal(point[k], v) for k, v in model.state_dict().items())
        s = r["summary"]
        assert s["points"] == len(path) and s["dense_peak_train_loss"] >= s["peak_train_loss"]
        if method in ("bezier", "autoneb"):
            assert 0 < s["grad_evals"] <= 60
        peaks[method] = s["peak_train_loss"]
    assert peaks["llpf"] < 0.5 * peaks["linear"]
    assert min(peaks["bezier"], peaks["autoneb"]) < peaks["linear"]


def test_a_typo_in_an_option_is_reported_before_the_checkpoints_are_read(tmp_path):
    res = _run("path", tmp_path / "missing-a", tmp_path / "missing-b", "--method", "llpf", "-o", "ordr=fdf",
               "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "'ordr'" in res.output and "did you mean 'order'" in res.output
    assert "not found" not in res.output
    res = _run("path", tmp_path / "a", tmp_path / "b", "--method", "llfp", "--out", tmp_path / "o", ok=False)
    assert "unknown path method 'llfp'" in res.output and "llpf" in res.output
    for method, bad in [("bezier", {"stepz": 3}), ("autoneb", {"pivots": 3}), ("linear", {"n_points": 3}),
                        ("cross-sphere", {"m2o_stp": 0.1}), ("llpf", {"step": 2.0})]:
        with pytest.raises(ConfigError, match=next(iter(bad))):
            check_path_options(method, bad)
    assert set(PATH_METHODS) == {"linear", "llpf", "cross-sphere", "bezier", "polychain", "autoneb"}


def test_a_killed_llpf_search_resumes_to_the_same_path_and_a_used_out_is_protected(pair, tmp_path):
    model_a, _ = load_checkpoint(pair / "a")
    model_b, _ = load_checkpoint(pair / "b")
    bundle = load_dataset("digits")
    opts = dict(ticks=8, step=0.3, lr=0.05, threshold=0.15, min_steps=2, max_steps=20, batch_size=64,
                checkpoint_every=2)
    full = run_path(tmp_path / "full", "llpf", model_a, model_b, bundle, opts, eval_limit=100, sub_points=0,
                    log=lambda s: None)

    def kill_at_tick_5(i, total):
        if i == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_path(tmp_path / "run", "llpf", model_a, model_b, bundle, opts, eval_limit=100, sub_points=0,
                 log=lambda s: None, progress=kill_at_tick_5)
    with pytest.raises(ConfigError, match="--resume"):
        run_path(tmp_path / "run", "llpf", model_a, model_b, bundle, opts, log=lambda s: None)
    resumed = run_path(tmp_path / "run", "llpf", model_a, model_b, bundle, opts, eval_limit=100, sub_points=0,
                       resume=True, log=lambda s: None)
    assert Path.load(tmp_path / "run" / "path").digest == Path.load(tmp_path / "full" / "path").digest
    assert resumed["summary"]["peak_train_loss"] == full["summary"]["peak_train_loss"]


def test_llpf_config_merges_overrides_names_typos_and_refuses_a_schedule_that_leaves_groups_locked():
    base = LLPFConfig(step=0.2, ticks=30)
    merged = LLPFConfig.from_any(base, lr=0.5)
    assert (merged.step, merged.ticks, merged.lr) == (0.2, 30, 0.5)
    assert LLPFConfig.from_any({"ticks": 7}).ticks == 7 and LLPFConfig.from_any(None) == LLPFConfig()
    with pytest.raises(ConfigError, match="'tick'.*did you mean 'ticks'"):
        LLPFConfig.from_any(base, tick=3)
    with pytest.raises(ConfigError, match="min_steps"):
        LLPFConfig(min_steps=5, max_steps=2)
    with pytest.raises(ConfigError, match="step"):
        LLPFConfig(step=0.0)
    model = build_model("resnet20", in_shape=(1, 8, 8), num_classes=10, width=0.5, seed=0)
    per_layer, stages = fdf_groups(model), fdf_groups(model, level=2)
    assert len(per_layer) > 20 and [model_prefix(g) for g in stages] == ["stem", "stages.0", "stages.1", "stages.2",
                                                                          "head"]
    sd = model.state_dict()
    data = torch.utils.data.TensorDataset(torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,)))
    with pytest.raises(ConfigError, match="leaves FDF groups locked"):
        llpf_m2m(model, sd, sd, data, ticks=10, unlock_every=1, max_steps=0, min_steps=0)
    path = llpf_m2m(model, sd, build_model("resnet20", in_shape=(1, 8, 8), num_classes=10, width=0.5, seed=1).state_dict(),
                    data, ticks=10, fdf_level=2, max_steps=0, min_steps=0)
    assert len(path.info["groups"]) == 5 and path.info["settings"]["fdf_level"] == 2


def model_prefix(group):
    return ".".join(group[0].split(".")[:2]) if group[0].startswith("stages") else group[0].split(".")[0]


def test_find_path_budget_is_validated_and_passed_to_the_curve_methods(pair):
    model_a, _ = load_checkpoint(pair / "a")
    model_b, _ = load_checkpoint(pair / "b")
    train = load_dataset("digits").train
    with pytest.raises(ConfigError, match="budget"):
        find_path("bezier", model_a, model_a.state_dict(), model_b.state_dict(), train, budget=0)
    p = find_path("polychain", model_a, model_a.state_dict(), model_b.state_dict(), train, {"n_points": 5}, budget=7)
    assert p.compute["grad_evals"] == 7 and len(p) == 5 and p.method.startswith("polychain")
