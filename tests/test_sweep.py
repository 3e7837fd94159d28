"""`modeconn sweep`: grid expansion validated before any run, resumable runs, aggregation, and the Ray backend
giving the same results as the sequential one on a 2×2 grid of real barrier runs (digits)."""

from __future__ import annotations

import json

import pytest
from pydantic import Field
from typer.testing import CliRunner

from modeconn.cli import app
from modeconn.config import StrictConfig
from modeconn.errors import ConfigError
from modeconn.recipes import sweep as sw

pytestmark = pytest.mark.usefixtures("one_thread")

GRID = """
name = "tiny"
task = "barrier"
[base]
dataset = "digits"
epochs = 2
width = 16
lambdas = 3
[grid]
seed = [0, 1]
method = ["naive", "weight"]
"""


class Product(StrictConfig):
    x: int = Field(ge=0)
    y: int = 1


CALLS: list[dict] = []


def _product(p: Product) -> dict:
    CALLS.append(p.model_dump())
    if p.x == 99:
        raise RuntimeError("killed")
    return {"z": p.x * p.y}


if "product" not in sw.TASKS:
    sw.TASKS.register("product")(sw.SweepTask(Product, _product))


def _cfg(**grid):
    return sw.SweepConfig(name="p", task="product", grid=grid)


def test_typos_and_bad_values_fail_before_any_run_and_name_the_key(tmp_path):
    CALLS.clear()
    with pytest.raises(ConfigError, match="'z'.*valid parameters: x, y"):
        sw.run_sweep(sw.SweepConfig(task="product", base={"z": 1}, grid={"x": [1, 2]}), tmp_path / "a")
    with pytest.raises(ConfigError, match="sweep run .*'x': -1"):
        sw.run_sweep(_cfg(x=[1, -1]), tmp_path / "b")
    with pytest.raises(ConfigError, match="unknown sweep task 'prodcut'.*Did you mean 'product'"):
        sw.run_sweep(sw.SweepConfig(task="prodcut", grid={"x": [1]}), tmp_path / "c")
    with pytest.raises(ConfigError, match="'gird'"):
        sw.SweepConfig(task="product", gird={"x": [1]})
    with pytest.raises(ConfigError, match="backend"):
        sw.run_sweep(_cfg(x=[1]), tmp_path / "d", backend="dask")
    assert CALLS == []  # nothing ran
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        sw.read_sweep_config(bad)


def test_a_killed_sweep_resumes_without_recomputing_finished_runs(tmp_path):
    CALLS.clear()
    out = tmp_path / "s"
    with pytest.raises(RuntimeError, match="killed"):
        sw.run_sweep(_cfg(x=[1, 2, 99], y=[3]), out, backend="sequential", log=lambda s: None)
    assert [c["x"] for c in CALLS] == [1, 2, 99]
    CALLS.clear()
    sw.TASKS._items["product"] = sw.SweepTask(Product, lambda p: (CALLS.append(p.model_dump()), {"z": -1})[1])
    try:
        res = sw.run_sweep(_cfg(x=[1, 2, 99], y=[3]), out, backend="sequential", log=lambda s: None)
    finally:
        sw.TASKS._items["product"] = sw.SweepTask(Product, _product)
    assert [c["x"] for c in CALLS] == [99]  # only the unfinished run
    assert [(r["x"], r["z"]) for r in res["rows"]] == [(1, 3), (2, 6), (99, -1)]
    assert (out / "results.csv").read_text().splitlines()[0] == "run_id,x,y,z"
    with pytest.raises(ConfigError, match="holds another sweep"):
        sw.run_sweep(_cfg(x=[5]), out, backend="sequential")


@pytest.mark.slow
def test_ray_and_sequential_backends_give_the_same_table_on_a_2x2_barrier_grid(tmp_path):
    cfg_file = tmp_path / "grid.toml"
    cfg_file.write_text(GRID)
    res = CliRunner().invoke(app, ["sweep", str(cfg_file), "--out", str(tmp_path / "seq"), "--backend", "sequential"])
    assert res.exit_code == 0, res.output
    ray_res = sw.run_sweep(cfg_file, tmp_path / "ray", backend="ray", log=lambda s: None)
    seq = json.loads((tmp_path / "seq" / "results.json").read_text())["rows"]
    assert len(seq) == len(ray_res["rows"]) == 4
    for a, b in zip(seq, ray_res["rows"], strict=False):
        assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}
    for seed in (0, 1):
        rows = {r["method"]: r for r in seq if r["seed"] == seed}
        assert rows["weight"]["barrier_mean_loss"] < rows["naive"]["barrier_mean_loss"]
