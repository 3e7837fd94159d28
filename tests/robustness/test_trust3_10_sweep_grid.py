"""Trust round 3, class 10 (sweeps): the whole grid is checked before any run trains, and no run counts twice.

A grid whose later point is invalid (an unknown dataset, a width the architecture cannot have, a seed whose pair
overflows the training seed) is refused before the first run trains; ``seed = [0, 0]`` (or ``width = [8, 8.0]``) is
refused instead of reporting n = 2 with ± 0 from one run; ``lr = inf`` is named as what it is, not "got None". The
check of this class is :func:`nothing_trained`: the trainer is replaced by one that fails the test if called. The
negative control drops the task's check and shows the first run trained before the bad point is seen.
"""

from __future__ import annotations

import dataclasses

import pytest

from modeconn.errors import ConfigError
from modeconn.recipes import sweep as sw
from modeconn.experiments import training

from cli_runner import run_cli

TRAINED: list[tuple] = []


@pytest.fixture
def nothing_trained(monkeypatch):
    """The check of this class: training any model fails the test (and is recorded)."""
    TRAINED.clear()

    def refuse(arch, bundle, seeds, *a, **k):
        TRAINED.append((arch, tuple(seeds)))
        raise AssertionError(f"a run trained {arch} seeds {seeds} before the grid was checked")

    monkeypatch.setattr(training, "train_models", refuse)
    sw._trained_pair.cache_clear()
    yield
    assert TRAINED == [], f"trained before the grid was refused: {TRAINED}"


def _sweep(tmp_path, base=None, **grid):
    base = {"epochs": 1, **({} if "width" in grid else {"width": 8}), **(base or {})}
    cfg = sw.SweepConfig(name="t", task="barrier", base=base, grid=grid)
    return sw.run_sweep(cfg, tmp_path / "sweep", backend="sequential", log=lambda s: None)


@pytest.mark.parametrize("grid, named", [
    ({"dataset": ["digits", "digitz"]}, "unknown dataset 'digitz'"),
    ({"width": [8, 0.5]}, "width 0.5"),
    ({"seed": [0, 2**62]}, "seed"),
    ({"model": ["mlp", "vgg"], "width": [8, 8.5]}, "width 8.5"),
])
def test_a_bad_later_grid_point_is_refused_before_any_run(tmp_path, nothing_trained, grid, named):
    with pytest.raises(ConfigError, match="sweep run") as err:
        _sweep(tmp_path, **grid)
    assert named in str(err.value)
    assert not (tmp_path / "sweep" / "runs").exists()


@pytest.mark.parametrize("grid, named", [
    ({"seed": [0, 0]}, "grid seed lists 0 twice"),
    ({"seed": [0, 1], "width": [8, 8.0]}, "grid width lists 8"),
    ({"method": ["weight", "naive", "weight"]}, "grid method lists 'weight' twice"),
])
def test_duplicate_grid_points_are_refused(tmp_path, nothing_trained, grid, named):
    with pytest.raises(ConfigError, match="same run") as err:
        _sweep(tmp_path, **grid)
    assert named in str(err.value) and "counted twice" in str(err.value)


@pytest.mark.parametrize("where", ["base", "grid"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_non_finite_values_are_named_not_got_none(tmp_path, nothing_trained, where, value):
    toml = tmp_path / "s.toml"
    lr = f"lr = {value}" if where == "base" else f"lr = [0.05, {value}]"
    toml.write_text(f'task = "barrier"\n[base]\nepochs = 1\n{lr if where == "base" else ""}\n'
                    f'[grid]\nseed = [0]\n{lr if where == "grid" else ""}\n')
    res = run_cli("sweep", toml, "--out", tmp_path / "out", "--backend", "sequential", ok=False)
    assert res.exit_code == 2, res.output
    assert f"lr = {value}" in res.output and "not a finite number" in res.output, res.output
    assert "None" not in res.output


def test_the_check_reads_no_training(tmp_path, nothing_trained):
    """A valid grid passes the check (data read, models built on the meta device) without any training."""
    cfg = sw.SweepConfig(task="barrier", base={"epochs": 1},
                         grid={"seed": [0, 1], "model": ["mlp", "cnn", "resnet20"], "method": ["naive", "weight"]})
    assert len(sw.expand(cfg)) == 12


def test_negative_control_without_the_task_check_the_first_run_trains(tmp_path, monkeypatch):
    """Without the task's check (the behaviour before the fix) the first grid point trains before the unknown dataset
    of the second is found."""
    TRAINED.clear()

    def train(arch, bundle, seeds, *a, **k):
        TRAINED.append(tuple(seeds))
        raise RuntimeError("trained")

    monkeypatch.setattr(training, "train_models", train)
    sw._trained_pair.cache_clear()
    monkeypatch.setitem(sw.TASKS._items, "barrier", dataclasses.replace(sw.TASKS.get("barrier"), check=None))
    with pytest.raises(RuntimeError, match="trained"):
        _sweep(tmp_path, dataset=["digits", "digitz"])
    assert TRAINED, "the first run did not train"
