"""`modeconn sweep CONFIG`: a grid of runs (seeds × widths × methods …) on Ray or sequentially, resumable.

A sweep config (TOML or JSON) names a *task* and gives its parameters: ``base`` (fixed values) and ``grid``
(lists; the runs are their Cartesian product)::

    name = "barrier-vs-width"
    task = "barrier"
    [base]
    dataset = "digits"
    epochs = 10
    [grid]
    seed = [0, 1]
    width = [32, 128]
    method = ["naive", "weight"]

The whole grid is validated *before any run starts*: a typo names the key (and the valid keys); a value that is not
a finite number names the key and the value; a bad value names the run, whether the task's typed parameter model
refuses it or the task's own check (:attr:`SweepTask.check`: the data located, the model built on the meta device —
what a run would refuse, found without training); two grid points that are the same run (``seed = [0, 0]``, or
``width = [8, 8.0]``) are refused, since they would count one run twice in the statistics over seeds. Each run writes
``runs/<run-id>/result.json`` atomically, ``run-id`` being a digest of its parameters, so a killed sweep
resumes without recomputing finished runs. Results are aggregated into ``results.json``, ``results.csv``
and ``report.md``: one row per run, and — over the grid's ``seed`` axis — mean ± sample std and n of every
metric per setting of the other parameters (:func:`over_seeds`).

Seeds: the ``barrier`` task's seed ``s`` trains the pair of init seeds ``(2s, 2s + 1)``, so different seeds never
share a model and the repetitions are independent.

Backends: ``ray`` (``ray.init()`` locally, or ``address=`` a cluster; one Ray task per run, CPU count
per task configurable) and ``sequential`` (in-process; the default when Ray is not installed —
``pip install 'modeconn[ray]'``).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import itertools
import json
import math
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError
from torch import nn

from ..config import StrictConfig
from ..errors import ConfigError, ModeconnError
from .._util.jsonio import write_json
from ..match.methods import command_line_methods
from ..models._validation import unknown_names_error, validation_error_to_config_error
from .._util.atomic import atomic_write_text
from ..registry import Registry
from ..report import markdown_table

Log = Callable[[str], None]
BACKENDS = ("auto", "ray", "sequential")


@dataclass(frozen=True)
class SweepTask:
    """A sweep task: its typed parameters (one grid point) and the function running one point → metrics."""

    params: type[StrictConfig]
    run: Callable[[Any], dict[str, Any]]
    version: int = 1
    """Bumped when the meaning of the parameters changes; part of the run id, so finished runs of an older
    version are never reused for a newer one."""
    check: Callable[[Any], None] | None = None
    """Everything a run would refuse that the parameter model cannot see (data present, architecture buildable on
    that data), checked without training; raises ConfigError / DataError. Called for every grid point before any
    run starts."""


TASKS: Registry[SweepTask] = Registry("sweep task")


# ------------------------------------------------------------------------------------------------- tasks
class BarrierTask(StrictConfig):
    """One grid point of the ``barrier`` task: train two models (init seeds ``2·seed`` and ``2·seed + 1``, so that
    the pairs of different seeds are independent) and measure the test-loss barrier of the linear path after
    alignment ``method`` (docs/methods.md, "Barriers")."""

    dataset: str = "digits"
    model: Literal["mlp", "cnn", "vgg", "resnet20"] = "mlp"
    width: float = Field(64, gt=0)
    depth: int = Field(2, ge=1)
    epochs: int = Field(10, ge=1)
    lr: float = Field(0.05, gt=0)
    batch_size: int = Field(64, ge=1)
    limit_train: int | None = Field(None, ge=1)
    method: Literal[("naive", *command_line_methods(learns=False))] = "weight"
    lambdas: int = Field(11, ge=3)
    seed: int = Field(0, ge=0)


def _model_kwargs(p: BarrierTask) -> dict[str, Any]:
    if p.model == "mlp":
        if p.width != int(p.width):
            raise ConfigError(f"width {p.width}: the mlp's width is a whole number of units")
        return {"width": int(p.width), "depth": p.depth}
    if p.model == "resnet20":
        return {"width": p.width}
    return {}


def _training(p: BarrierTask) -> dict[str, Any]:
    """The training settings of a pair (:class:`~modeconn.train.TrainConfig` fields but the seed)."""
    return {"epochs": p.epochs, "lr": p.lr, "batch_size": p.batch_size}


def pair_seeds(seed: int) -> tuple[int, int]:
    """The init seeds of the pair trained for sweep seed ``seed``: ``(2·seed, 2·seed + 1)`` — disjoint across seeds."""
    return 2 * seed, 2 * seed + 1


@functools.lru_cache(maxsize=2)
def _trained_pair(training: str) -> tuple[Any, tuple[nn.Module, nn.Module]]:
    """The dataset and the two trained models of one training setting (``BarrierTask`` JSON without the
    evaluation-only fields). Cached per process: grid points that differ only in ``method`` / ``lambdas``
    reuse the pair instead of training it again (alignment and evaluation never mutate the models)."""
    from ..data import load_dataset
    from ..experiments.training import train_models

    p = BarrierTask(**json.loads(training))
    bundle = load_dataset(p.dataset, limit_train=p.limit_train)
    a, b = train_models(p.model, bundle, pair_seeds(p.seed), _training(p),
                        **_model_kwargs(p))
    return bundle, (a, b)


@functools.lru_cache(maxsize=8)
def _data_shape(dataset: str) -> tuple[tuple[int, ...], int]:
    """``(input shape, classes)`` of ``dataset``, read from its files (ConfigError / DataError as a run would)."""
    from ..data import load_dataset

    bundle = load_dataset(dataset, limit_train=1)
    return tuple(bundle.input_shape), bundle.num_classes


def check_barrier_task(p: BarrierTask) -> None:
    """What a ``barrier`` run would refuse, without training: the dataset (its files read), the training settings of
    both seeds, and the architecture built on the meta device and run on one batch of the data's shape."""
    import torch

    from ..models import build_model
    from ..train import TrainConfig

    shape, classes = _data_shape(p.dataset)
    for seed in pair_seeds(p.seed):
        TrainConfig(seed=seed, **_training(p))
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = build_model(p.model, in_shape=shape, num_classes=classes, **_model_kwargs(p))
        try:
            model(torch.empty(2, *shape))
        except RuntimeError as err:
            raise ConfigError(f"model {p.model!r} does not run on {p.dataset!r} inputs of shape {shape}: {err}") from None


def run_barrier_task(p: BarrierTask) -> dict[str, Any]:
    """Train the pair (or reuse it, :func:`_trained_pair`), align, evaluate the linear path on the test split;
    barrier_mean / interp (loss)."""
    from ..data import make_loader
    from ..path import evaluate_model, evaluate_path
    from ..symmetry import symmetry_spec
    from ..diagnostics.compare import align

    start = time.perf_counter()
    bundle, (a, b) = _trained_pair(p.model_copy(update={"method": "naive", "lambdas": 3}).model_dump_json())
    spec = symmetry_spec(a, bundle.train.tensors[0][:2])
    res = align(p.method, spec, a, a.state_dict(), b.state_dict(), bundle, seed=p.seed)
    sd_b = b.state_dict() if res is None else res.apply(b.state_dict())
    test = {"test": make_loader(bundle.test, 1000)}
    curve = evaluate_path(a, a.state_dict(), sd_b, test, lambdas=p.lambdas, spec=spec,
                          bn_loader=make_loader(bundle.train, 256, shuffle=True, seed=p.seed), bn_batches=10)
    return {
        "init_seeds": list(pair_seeds(p.seed)),
        "test_acc_a": evaluate_model(a, test["test"])["acc"],
        "test_acc_b": evaluate_model(b, test["test"])["acc"],
        "barrier_mean_loss": curve.barrier("mean", "test"),
        "barrier_interp_loss": curve.barrier("interp", "test"),
        "midpoint_acc": float(curve.values("test", "acc")[len(curve.lambdas) // 2]),
        "seconds": time.perf_counter() - start,
    }


TASKS.register("barrier")(SweepTask(BarrierTask, run_barrier_task, version=2,  # 2: seeds (2s, 2s+1)
                                    check=check_barrier_task))


# ------------------------------------------------------------------------------------------------ config
class SweepConfig(StrictConfig):
    """A sweep: ``task`` (registered in :data:`TASKS`), fixed ``base`` parameters and a ``grid`` of lists."""

    name: str = "sweep"
    task: str
    base: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)


def read_sweep_config(path: str | Path) -> SweepConfig:
    """Parse a TOML (``.toml``) or JSON sweep file. Raises ConfigError naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep config {path} not found")
    text = path.read_text(encoding="utf-8")
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a table/object at the top level")
    try:
        return SweepConfig(**raw)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _check_finite(config: SweepConfig) -> None:
    """ConfigError naming the key and value of a base or grid value that is not a finite number (``inf``, ``nan``):
    no task parameter means anything by them, and JSON (run ids, results) cannot hold them."""
    values = [("base", k, v) for k, v in config.base.items()]
    values += [("grid", k, v) for k, vs in config.grid.items() for v in vs]
    for where, key, value in values:
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"sweep {where} {key} = {value!r}: not a finite number")


def _same_run(config: SweepConfig, first: dict[str, Any], second: dict[str, Any]) -> str:
    """Which grid values make two grid points the same run, for the error message."""
    differ = [k for k in config.grid if first[k] != second[k]]
    if differ:
        return "; ".join(f"grid {k} lists {first[k]!r} and {second[k]!r}, the same value" for k in differ)
    return "; ".join(f"grid {k} lists {first[k]!r} twice" for k in config.grid if config.grid[k].count(first[k]) > 1)


def _validated(task: SweepTask, params: dict[str, Any]) -> StrictConfig:
    """The task's parameters of one grid point, checked as a run would check them; ConfigError naming the run."""
    try:
        p = task.params.model_validate(params)
        if task.check is not None:
            task.check(p)
    except ValidationError as err:
        raise validation_error_to_config_error(err, f"sweep run {params}") from None
    except ModeconnError as err:
        raise type(err)(f"sweep run {params}: {err}") from None
    return p


def expand(config: SweepConfig) -> list[dict[str, Any]]:
    """Every run's full parameter dict (base + one grid combination), each validated before any run starts: a typo
    names the key and lists the valid ones; a value that is not a finite number names the key; a bad value names the
    run (the task's parameter model and :attr:`SweepTask.check`); grid points that are the same run are refused."""
    task = TASKS.get(config.task)
    params_model = task.params
    valid = set(params_model.model_fields)
    for where, keys in (("base", config.base), ("grid", config.grid)):
        unknown = sorted(set(keys) - valid)
        if unknown:
            raise unknown_names_error(f"sweep task {config.task!r} ({where})", unknown, valid, noun="parameter")
    overlap = sorted(set(config.base) & set(config.grid))
    if overlap:
        raise ConfigError(f"parameters {overlap} are both in base and grid; keep each in one place")
    empty = [k for k, v in config.grid.items() if not v]
    if empty:
        raise ConfigError(f"grid lists {empty} are empty")
    _check_finite(config)
    names = list(config.grid)
    runs, seen = [], {}
    for combo in itertools.product(*(config.grid[k] for k in names)):
        params = {**config.base, **dict(zip(names, combo, strict=False))}
        key = json.dumps(_validated(task, params).model_dump(mode="json"), sort_keys=True)
        if key in seen:
            raise ConfigError(f"sweep runs {seen[key]} and {params} are the same run ({_same_run(config, seen[key], params)}): "
                              "it would be counted twice in the statistics over seeds; list each value once")
        seen[key] = params
        runs.append(params)
    return runs


def run_id(task: str, params: Mapping[str, Any], version: int = 1) -> str:
    """A stable id of one run: sha256 of the task name, its version (when above 1) and its parameters (sorted
    JSON), 16 hex digits."""
    key = [task, params] if version == 1 else [task, version, params]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _execute(task: str, params: dict[str, Any]) -> dict[str, Any]:
    t = TASKS.get(task)
    return t.run(t.params(**params))


# --------------------------------------------------------------------------------------------- backends
def _resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ConfigError(f"unknown sweep backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "sequential":
        return backend
    try:
        import ray  # noqa: F401
    except ImportError:
        if backend == "ray":
            raise ConfigError("backend 'ray' needs Ray: pip install 'modeconn[ray]' (or use --backend sequential)") from None
        return "sequential"
    return "ray"


def _run_sequential(task: str, todo: list[tuple[str, dict]], save: Callable[[str, dict, dict], None], log: Log) -> None:
    for i, (rid, params) in enumerate(todo, 1):
        log(f"run {i}/{len(todo)} {rid}: {params}")
        save(rid, params, _execute(task, params))


def _run_ray(task: str, todo: list[tuple[str, dict]], save: Callable[[str, dict, dict], None], log: Log,
             address: str | None, cpus_per_run: float) -> None:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        remote = ray.remote(num_cpus=cpus_per_run)(_execute)
        pending = {remote.remote(task, params): (rid, params) for rid, params in todo}
        done = 0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            rid, params = pending.pop(ready[0])
            save(rid, params, ray.get(ready[0]))  # a failed run raises here, finished ones are already saved
            done += 1
            log(f"finished {done}/{len(todo)} {rid}: {params}")
    finally:
        if started:
            ray.shutdown()


# ------------------------------------------------------------------------------------------------ driver
def run_sweep(config: SweepConfig | str | Path, out: str | Path, *, backend: str = "auto", address: str | None = None,
              cpus_per_run: float = 1.0, log: Log = print) -> dict[str, Any]:
    """Run every grid point not finished yet in ``out`` and aggregate all results.

    Args:
        config: a :class:`SweepConfig` or the path of a TOML/JSON sweep file.
        out: the sweep directory (``runs/<run-id>/result.json`` per run; ``results.json``, ``results.csv``,
            ``report.md`` aggregated). Reusing it resumes: finished runs are skipped. A directory holding
            another sweep (different task or grid) is refused.
        backend: ``"auto"`` (Ray if installed, else sequential), ``"ray"`` or ``"sequential"``.
        address: Ray cluster address (None: a local ``ray.init()``).
        cpus_per_run: CPUs Ray reserves per run.

    Returns: the aggregated results (``rows``: one per run, parameters + metrics).
    Raises: ConfigError (bad config, typo'd parameter, unknown backend, another sweep in ``out``) before
        any run starts; what a task raises (runs finished before it are kept).
    """
    config = config if isinstance(config, SweepConfig) else read_sweep_config(config)
    runs = expand(config)  # validation of every run before anything starts
    backend = _resolve_backend(backend)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"name": config.name, "task": config.task, "base": config.base, "grid": config.grid}
    mf = out / "sweep.json"
    if mf.exists():
        old = json.loads(mf.read_text())
        if {k: old.get(k) for k in ("task", "base", "grid")} != {k: manifest[k] for k in ("task", "base", "grid")}:
            raise ConfigError(f"{out} holds another sweep ({old.get('name')!r}, task {old.get('task')!r}); "
                              "choose another --out")
    else:
        write_json(mf, manifest, nan="null")
    ids = [run_id(config.task, p, TASKS.get(config.task).version) for p in runs]
    todo = [(rid, p) for rid, p in zip(ids, runs, strict=False) if not (out / "runs" / rid / "result.json").is_file()]
    log(f"{len(runs)} runs, {len(runs) - len(todo)} already finished, backend {backend}")

    def save(rid: str, params: dict, metrics: dict) -> None:
        d = out / "runs" / rid
        d.mkdir(parents=True, exist_ok=True)
        write_json(d / "result.json", {"run_id": rid, "params": params, "metrics": metrics}, nan="null")

    if todo:
        if backend == "ray":
            _run_ray(config.task, todo, save, log, address, cpus_per_run)
        else:
            _run_sequential(config.task, todo, save, log)
    return aggregate(out, config, ids)


SEED_AXIS = "seed"
"""The grid parameter repetitions run over; :func:`over_seeds` aggregates across it."""


def over_seeds(rows: list[dict[str, Any]], params: list[str]) -> list[dict[str, Any]]:
    """One row per setting of ``params`` other than the seed: those parameters, ``n`` (runs, i.e. seeds) and, for
    every numeric metric (not ``seconds``), ``{"mean", "std", "n"}`` over the seeds (sample std, None for one run)."""
    from ..report.stats import mean_std

    keys = [p for p in params if p != SEED_AXIS]
    numeric = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    metrics = [k for k in dict.fromkeys(k for r in rows for k in r)
               if k not in params and k not in ("run_id", "seconds") and all(numeric(r.get(k)) for r in rows)]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(json.dumps([r.get(k) for k in keys]), []).append(r)
    return [{**{k: g[0].get(k) for k in keys}, "n": len(g), **{m: mean_std([r[m] for r in g]) for m in metrics}}
            for g in groups.values()]


def aggregated_table(agg: list[dict[str, Any]], fixed: Mapping[str, Any] | None = None) -> str:
    """The markdown table of :func:`over_seeds` rows: parameters, n, then "mean ± std" per metric (the mean alone
    for n = 1). Parameters in ``fixed`` (the sweep's ``base``: the same in every row) are left out, preceded by one
    line naming them."""
    from ..report.stats import format_mean_std

    if not agg:
        return ""
    fixed = dict(fixed or {})
    columns = [c for c in agg[0] if c not in fixed]
    head = f"Fixed: {', '.join(f'{k}={v}' for k, v in fixed.items())}.\n\n" if fixed else ""
    cell = lambda v: format_mean_std(v, digits=4) if isinstance(v, dict) else v  # noqa: E731
    return head + markdown_table(columns, [[cell(r[c]) for c in columns] for r in agg])


def _report(config: SweepConfig, rows: list[dict[str, Any]], agg: list[dict[str, Any]], columns: list[str]) -> str:
    seeds = config.grid.get(SEED_AXIS, [config.base.get(SEED_AXIS, 0)])
    return "\n".join([
        f"# sweep {config.name} (task {config.task})", "",
        "## Over seeds: mean ± std (n) per setting", "",
        f"Seeds {seeds}; n = runs (seeds) per setting; std = sample standard deviation over the seeds (n − 1 in the "
        "denominator), shown only for n > 1. The barrier task's seed s trains the independent pair of init seeds "
        "(2s, 2s + 1).", "",
        aggregated_table(agg, config.base), "",
        "## Every run", "",
        markdown_table(columns, [[r.get(c, "") for c in columns] for r in rows]), "",
    ])


def aggregate(out: Path, config: SweepConfig, ids: list[str]) -> dict[str, Any]:
    """Collect ``runs/<id>/result.json`` of ``ids`` into one table per run (JSON, CSV, markdown) and one over the
    seeds (:func:`over_seeds`; ``results.json["over_seeds"]`` and ``report.md``)."""
    rows, params = [], []
    for rid in ids:
        f = out / "runs" / rid / "result.json"
        try:
            r = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ModeconnError(f"{f}: unreadable run result: {err}") from None
        rows.append({"run_id": rid, **r["params"], **r["metrics"]})
        params += [k for k in r["params"] if k not in params]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    agg = over_seeds(rows, params)
    results = {"name": config.name, "task": config.task, "grid": config.grid, "base": config.base, "rows": rows,
               "over_seeds": agg}
    write_json(out / "results.json", results, nan="null")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "results.csv", buf.getvalue())
    atomic_write_text(out / "report.md", _report(config, rows, agg, columns))
    return results
