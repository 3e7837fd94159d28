"""The `modeconn` command line (typer). Every command prints where its outputs went."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import ModeconnError

app = typer.Typer(
    help="modeconn: mode connectivity for PyTorch — align, interpolate, measure barriers, merge.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(soft_wrap=True)

METHOD_HELP = "alignment method: naive (none), weight (weight matching), activation (activation matching), learned (STE)"
DATA_HELP = "data directory (default: $MODECONN_DATA, then standard places; see README 'Data')"


def _fail(err: Exception) -> None:
    console.print(f"[bold red]error:[/] {err}")
    raise typer.Exit(code=2)


def _parse_kv(items: list[str], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} must look like key=value, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@contextmanager
def _path_progress(label: str = "path points"):
    """A rich progress bar fed by a ``progress(i, total)`` callback (a new task whenever ``i`` restarts at 1)."""
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        state: dict = {}

        def update(i: int, total: int) -> None:
            if i == 1 or "task" not in state:
                state["task"] = bar.add_task("path", total=total)
            bar.update(state["task"], completed=i)

        yield update


def _barrier_table(comparison, split: str = "test") -> Table:
    from .experiments.compare import METHOD_LABELS

    table = Table(title=f"barriers on the {split} split (loss = cross-entropy; error = 1 − acc)")
    for col in ("method", "barrier_mean (loss)", "barrier_interp (loss)", "peak (loss)", "barrier_mean (error)",
                "midpoint acc", "merged acc"):
        table.add_column(col, justify="right" if col != "method" else "left")
    for m, c in comparison.curves.items():
        s = c.summary()[split]
        table.add_row(METHOD_LABELS[m], f"{s['barrier_mean_loss']:.4f}", f"{s['barrier_interp_loss']:.4f}",
                      f"{s['peak_loss']:.4f}", f"{s['barrier_mean_error']:.4f}", f"{100 * s['midpoint_acc']:.2f}%",
                      f"{100 * comparison.merged[m][split]['acc']:.2f}%")
    return table


@app.command()
def demo(
    out: Optional[Path] = typer.Option(None, help="output directory (default runs/demo-<time>); must not exist or be empty"),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out"),
    epochs: Optional[int] = typer.Option(None, min=1, help="training epochs per model (default 40)"),
    seed_a: int = typer.Option(0, help="seed of model A"),
    seed_b: int = typer.Option(1, help="seed of model B"),
) -> None:
    """The main job (offline): two MLPs on the bundled digits, naive vs aligned barriers, midpoint merge.

    Trains two 3×512 MLPs from different seeds on scikit-learn's digits, measures the naive barrier,
    aligns B to A with weight matching and with activation matching, measures again and merges at the
    midpoint. Writes results.json, report.md, barrier.png and both checkpoints (models/A, models/B).
    """
    from .experiments import run_demo
    from .experiments.output import default_out

    out = out or default_out("demo")
    try:
        with console.status("running the demo"):
            _, results = run_demo(out, seeds=(seed_a, seed_b), epochs=epochs, overwrite=overwrite,
                                  log=lambda s: console.log(s), progress=False)
    except ModeconnError as err:
        _fail(err)
    _print_barriers(results)
    console.print(f"[bold green]outputs written to[/] {out.resolve()}  (report.md, results.json, barrier.png, models/)")


def _print_barriers(results: dict) -> None:
    from .experiments.compare import METHOD_LABELS

    table = Table(title="barrier_mean on test loss (cross-entropy); merged = midpoint of the aligned pair")
    for col in ("method", "barrier_mean (test loss)", "barrier_interp (test loss)", "barrier_mean (test error)",
                "merged test acc"):
        table.add_column(col, justify="right" if col != "method" else "left")
    for m, s in results["barriers"].items():
        t = s["test"]
        table.add_row(METHOD_LABELS[m], f"{t['barrier_mean_loss']:.4f}", f"{t['barrier_interp_loss']:.4f}",
                      f"{t['barrier_mean_error']:.4f}", f"{100 * results['midpoint_merge'][m]['test']['acc']:.2f}%")
    console.print(table)


@app.command()
def train(
    out: Path = typer.Option(..., help="checkpoint directory to write (config.json + model.safetensors + metrics.json)"),
    model: str = typer.Option("mlp", help="architecture: mlp, vgg, resnet20, cnn"),
    dataset: str = typer.Option("digits", help="dataset: digits, mnist, fashion-mnist, cifar10, cifar100"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    model_arg: list[str] = typer.Option([], "--model-arg", "-m", help="architecture option key=value, e.g. -m width=512 -m depth=3"),
    seed: int = typer.Option(0, help="seed of initialisation and data order"),
    epochs: int = typer.Option(10, min=1),
    lr: float = typer.Option(0.05, help="peak learning rate"),
    batch_size: int = typer.Option(128, min=1),
    optimizer: str = typer.Option("sgd", help="sgd or adamw"),
    weight_decay: float = typer.Option(5e-4, min=0.0),
    warmup_epochs: float = typer.Option(0.0, min=0.0),
    schedule: str = typer.Option("cosine", help="cosine, linear or constant"),
    limit_train: Optional[int] = typer.Option(None, min=1, help="use only the first N training examples"),
    device: str = typer.Option("cpu", help="torch device, e.g. cpu or cuda"),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out"),
) -> None:
    """Train one model on a dataset and write a checkpoint directory.

    The directory holds config.json (architecture, kwargs, training config, dataset), model.safetensors
    and metrics.json (per-epoch history, validation and test metrics).
    """
    from .data import load_dataset
    from .models import validate_model_kwargs
    from .train import TrainConfig, train_checkpoint

    try:
        cfg = TrainConfig(seed=seed, epochs=epochs, lr=lr, batch_size=batch_size, optimizer=optimizer,
                          weight_decay=weight_decay, warmup_epochs=warmup_epochs, schedule=schedule, device=device)
        kwargs = _parse_kv(model_arg, "--model-arg")
        bundle = load_dataset(dataset, data, limit_train=limit_train)
        kwargs = {"in_shape": bundle.input_shape, "num_classes": bundle.num_classes, **kwargs}
        validate_model_kwargs(model, kwargs)
        path = train_checkpoint(model, kwargs, bundle.train, cfg, out, val_set=bundle.val, test_set=bundle.test,
                                extra_config={"dataset": dataset}, overwrite=overwrite)
    except ModeconnError as err:
        _fail(err)
    metrics = json.loads((path / "metrics.json").read_text())
    console.print(f"test acc {100 * metrics['test']['acc']:.2f}%, test loss {metrics['test']['loss']:.4f}")
    console.print(f"[bold green]checkpoint written to[/] {path.resolve()}")


def _load_pair(a: Path, b: Path):
    from .experiments.checkpoints import load_same_architecture

    (ma, mb), (ca, _) = load_same_architecture([a, b])
    return ma, mb, ca


def _dataset_for(config: dict, dataset: Optional[str], data: Optional[Path], limit_train: Optional[int]):
    from .data import load_dataset

    name = dataset or config.get("dataset")
    if name is None:
        raise ModeconnError("the checkpoint does not record its dataset; pass --dataset")
    return load_dataset(name, data, limit_train=limit_train)


@app.command()
def barrier(
    a: Path = typer.Argument(..., help="checkpoint directory of model A"),
    b: Path = typer.Argument(..., help="checkpoint directory of model B"),
    method: list[str] = typer.Option(["naive", "weight", "activation"], "--method", help=METHOD_HELP + " (repeatable)"),
    dataset: Optional[str] = typer.Option(None, help="dataset (default: the one recorded in A's config.json)"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    bn: str = typer.Option("reset", help="BatchNorm policy: reset, interpolate, keep, repair"),
    lambdas: int = typer.Option(25, min=2, help="points on the path, endpoints included"),
    eval_limit: Optional[int] = typer.Option(None, min=1, help="evaluate on the first N examples of each split"),
    limit_train: Optional[int] = typer.Option(None, min=1, help="use only the first N training examples"),
    seed: int = typer.Option(0),
    out: Optional[Path] = typer.Option(None, help="output directory (default runs/barrier-<time>)"),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out"),
) -> None:
    """Barriers between two checkpoints, naive and after each alignment method.

    Evaluates loss and accuracy along the linear path on train and test for every --method, reports
    barrier_mean, barrier_interp and peak (loss) and the error barriers, merges at λ=½, and writes
    results.json, report.md and barrier.png.
    """
    from .experiments.barrier import run_barrier
    from .experiments.compare import check_methods
    from .experiments.output import default_out
    from .path.batchnorm import check_bn_policy

    out = out or default_out("barrier")
    try:
        check_methods(method)
        check_bn_policy(bn)
        ma, mb, cfg = _load_pair(a, b)
        bundle = _dataset_for(cfg, dataset, data, limit_train)
        with _path_progress() as progress:
            comparison = run_barrier(out, ma, mb, bundle, method, bn=bn, lambdas=lambdas, eval_limit=eval_limit,
                                     seed=seed, overwrite=overwrite, names=(str(a), str(b)),
                                     log=lambda s: console.log(s), progress=progress)
    except ModeconnError as err:
        _fail(err)
    console.print(_barrier_table(comparison, "test"))
    console.print(f"[bold green]outputs written to[/] {out.resolve()}  (report.md, results.json, barrier.png)")


@app.command()
def align(
    a: Path = typer.Argument(..., help="checkpoint directory of the reference model A"),
    b: Path = typer.Argument(..., help="checkpoint directory of model B (to be permuted into A's basin)"),
    out: Path = typer.Option(..., help="checkpoint directory for the aligned B (plus alignment.json)"),
    method: str = typer.Option("weight", help="weight, activation or learned"),
    dataset: Optional[str] = typer.Option(None, help="dataset for activation/learned matching (default: A's)"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    limit_train: Optional[int] = typer.Option(None, min=1),
    seed: int = typer.Option(0),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out"),
) -> None:
    """Align B to A and write the aligned B as a checkpoint directory.

    The aligned B computes the same function as B (checked on an input batch); alignment.json records
    the group element, objective and timings.
    """
    from .experiments.checkpoints import example_input
    from .experiments.compare import align as run_align
    from .experiments.compare import check_methods
    from .io import save_checkpoint
    from .symmetry import symmetry_spec

    try:
        if method == "naive" or method not in check_methods([method]):
            raise ModeconnError(f"--method must be one of weight, activation, learned (got {method!r})")
        ma, mb, cfg = _load_pair(a, b)
        bundle = _dataset_for(cfg, dataset, data, limit_train) if method != "weight" else None
        x0 = bundle.train.tensors[0][:2] if bundle is not None else example_input(cfg)
        spec = symmetry_spec(ma, x0)
        res = run_align(method, spec, ma, ma.state_dict(), mb.state_dict(), bundle, seed=seed)
        aligned = res.apply(mb.state_dict())
        import copy

        mb_aligned = copy.deepcopy(mb)
        mb_aligned.load_state_dict(aligned)
        _check_same_function(mb, mb_aligned, x0)
        path = save_checkpoint(out, mb_aligned, config={k: v for k, v in cfg.items() if k not in (
            "architecture", "kwargs", "modeconn_version", "format_version")} | {"aligned_to": str(a), "alignment": method},
            metrics={"alignment": {"method": method, "objective": res.objective, "stats": res.stats}},
            extra_json={"alignment.json": res.to_json()}, overwrite=overwrite)
    except ModeconnError as err:
        _fail(err)
    console.print(f"{method} matching objective {res.objective:.4f} ({len(spec.spaces)} spaces)")
    console.print(f"[bold green]aligned checkpoint written to[/] {path.resolve()}")


def _check_same_function(m1, m2, x) -> None:
    import torch

    with torch.no_grad():
        y1, y2 = m1.eval()(x), m2.eval()(x)
    if not torch.allclose(y1, y2, atol=1e-4, rtol=1e-4):
        raise ModeconnError(f"internal error: alignment changed the function (max |Δlogit| = {(y1 - y2).abs().max():.3g})")


@app.command()
def merge(
    models: list[Path] = typer.Argument(..., help="two or more checkpoint directories (the first is the reference)"),
    out: Path = typer.Option(..., help="checkpoint directory for the merged model"),
    weights: Optional[str] = typer.Option(None, help="comma-separated weights, one per model (default uniform)"),
    align_method: str = typer.Option("weight", "--align", help="align every model to the first first: weight, activation, none"),
    bn: str = typer.Option("reset", help="BatchNorm policy after averaging: reset, interpolate, repair"),
    dataset: Optional[str] = typer.Option(None, help="dataset for BN reset / REPAIR / activation matching (default: the first model's)"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    limit_train: Optional[int] = typer.Option(None, min=1),
    seed: int = typer.Option(0),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out"),
) -> None:
    """Merge two or more checkpoints into one.

    Aligns every model to the first (unless --align none), averages with --weights, re-estimates
    BatchNorm statistics (reset) or applies REPAIR, evaluates on the test split and writes a checkpoint.
    """
    from .experiments.merge import run_merge

    try:
        w = [float(x) for x in weights.split(",")] if weights else None
        path, metrics = run_merge(models, out, weights=w, align_method=align_method, bn=bn, dataset=dataset,
                                  data=data, limit_train=limit_train, seed=seed, overwrite=overwrite,
                                  log=lambda s: console.log(s))
    except ValueError as err:
        _fail(err)
    except ModeconnError as err:
        _fail(err)
    if metrics:
        console.print(f"merged model: test acc {100 * metrics['test']['acc']:.2f}%, test loss {metrics['test']['loss']:.4f}")
    console.print(f"[bold green]merged checkpoint written to[/] {path.resolve()}")


@app.command("path")
def path_command(
    a: Path = typer.Argument(..., help="checkpoint directory of model A (the path's start)"),
    b: Path = typer.Argument(..., help="checkpoint directory of model B (the path's end)"),
    method: str = typer.Option("llpf", help="llpf, cross-sphere, bezier, polychain, autoneb or linear"),
    option: list[str] = typer.Option([], "--option", "-o", help="method setting key=value, repeatable (e.g. -o step=0.02 "
                                     "-o ticks=200 for llpf; -o control_points=3 for bezier)"),
    budget: Optional[int] = typer.Option(None, min=1, help="gradient evaluations for bezier/polychain/autoneb"),
    dataset: Optional[str] = typer.Option(None, help="dataset (default: the one recorded in A's config.json)"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    limit_train: Optional[int] = typer.Option(None, min=1, help="use only the first N training examples"),
    eval_limit: Optional[int] = typer.Option(None, min=1, help="evaluate on the first N examples of each split"),
    sub_points: int = typer.Option(3, min=0, help="linear sub-points per segment for the continuity check"),
    seed: int = typer.Option(0, help="seed of the BatchNorm recalibration batches"),
    out: Optional[Path] = typer.Option(None, help="output directory (default runs/path-<time>)"),
    resume: bool = typer.Option(False, help="continue a killed LLPF search in --out (same settings)"),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out"),
) -> None:
    """Find a low-loss path from A to B and evaluate it.

    Writes the path (out/path: safetensors shards + path.json, loadable with modeconn.path.Path.load),
    results.json (loss/accuracy at every point on train and test with BatchNorm recomputed per point,
    continuity check, peak loss, path length, gradient evaluations, wall time), report.md and path_loss.png.
    LLPF checkpoints as it runs: kill it and rerun with --resume to continue.
    """
    from .experiments.output import default_out
    from .experiments.paths import check_path_options, run_path

    out = out or default_out("path")
    try:
        options = _parse_kv(option, "--option")
        check_path_options(method, options)  # typos fail before anything is loaded
        ma, mb, cfg = _load_pair(a, b)
        bundle = _dataset_for(cfg, dataset, data, limit_train)
        with _path_progress("search / evaluation") as progress:
            results = run_path(out, method, ma, mb, bundle, options, budget=budget, eval_limit=eval_limit,
                               sub_points=sub_points, seed=seed, resume=resume, overwrite=overwrite,
                               names=(str(a), str(b)), log=lambda s: console.log(s), progress=progress)
    except ModeconnError as err:
        _fail(err)
    r = results["summary"]
    console.print(f"{method}: {r['points']} points, peak train loss {r['peak_train_loss']:.4f} "
                  f"(endpoints {max(results['endpoint_train_loss']):.4f}), dense peak {r['dense_peak_train_loss']:.4f}, "
                  f"{r['grad_evals']} gradient evaluations, {r['wall_time_s']:.1f} s")
    console.print(f"[bold green]outputs written to[/] {out.resolve()}  (path/, results.json, report.md, path_loss.png)")


@app.command()
def experiment(
    name: str = typer.Argument(..., help="llpf, identifiability-sigma, identifiability-k, identifiability-coherence, "
                                         "identifiability-resnet"),
    quick: bool = typer.Option(False, help="the small CI size (minutes on 2 cores) instead of the full size"),
    pairs: Optional[int] = typer.Option(None, min=1, help="model pairs per setting (default: 1 quick, 3 full)"),
    epochs: Optional[int] = typer.Option(None, min=1, help="training epochs per model (default per experiment)"),
    width: Optional[int] = typer.Option(None, min=1, help="hidden width of the MLPs (default 64 quick, 256/512 full)"),
    limit_train: Optional[int] = typer.Option(None, min=1, help="training examples per model (default per size)"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    out: Optional[Path] = typer.Option(None, help="output directory (default runs/<name>-<time>)"),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out"),
) -> None:
    """Run a named experiment; writes results.json, report.md and summary.png.

    llpf (METHODS.md §2) trains three BN ResNet20s on Fashion-MNIST and compares the linear path, LLPF (three
    seeds), the all-at-once ablation, Bezier and AutoNEB at LLPF's gradient budget, and cross-sphere LLPF
    between models trained with and without weight decay (writes paths_loss.png and paths_pca.png).
    The identifiability experiments (METHODS.md §1) train pairs of W-asymmetric and standard networks and
    report unaligned vs weight-matched barriers, the identity/optimal activation-matching ratio, accuracy,
    swap costs (k sweep) and subspace coherence (coherence sweep), mean ± std over pairs.
    """
    from .experiments.identifiability import EXPERIMENTS, run_identifiability
    from .experiments.output import default_out

    try:
        if name not in (*EXPERIMENTS, "llpf"):
            raise ModeconnError(f"unknown experiment {name!r}; valid: llpf, {', '.join(EXPERIMENTS)}")
        out = out or default_out(name)
        if name == "llpf":
            _run_llpf_experiment(out, quick, pairs, epochs, width, limit_train, data, overwrite)
            return
        with console.status(f"running {name}"):
            results = run_identifiability(name, out, quick=quick, pairs=pairs, epochs=epochs, width=width,
                                          limit_train=limit_train, data=data, overwrite=overwrite,
                                          log=lambda s: console.log(s))
    except ModeconnError as err:
        _fail(err)
    from .experiments.identifiability import report

    console.print(report(results).split("![summary]")[0])
    console.print(f"[bold green]outputs written to[/] {out.resolve()}  (report.md, results.json, summary.png)")


def _run_llpf_experiment(out, quick, pairs, epochs, width, limit_train, data, overwrite) -> None:
    from dataclasses import replace

    from .experiments.llpf_experiment import SIZES, report, run_llpf_experiment

    if pairs is not None:
        raise ModeconnError("--pairs does not apply to the llpf experiment (it trains three models A, B, C)")
    size = SIZES["quick" if quick else "full"]
    changes = {k: v for k, v in (("epochs", epochs), ("width", width), ("limit_train", limit_train)) if v is not None}
    with console.status("running llpf"):
        results = run_llpf_experiment(out, data=data, overwrite=overwrite, size=replace(size, **changes),
                                      log=lambda s: console.log(s))
    console.print(report(results).split("![")[0])
    console.print(f"[bold green]outputs written to[/] {out.resolve()}  (report.md, results.json, paths_loss.png, "
                  "paths_pca.png, paths/)")


@app.command()
def sweep(
    config: Path = typer.Argument(..., help="sweep file (TOML or JSON): name, task, [base], [grid]"),
    out: Optional[Path] = typer.Option(None, help="sweep directory (default runs/sweep-<name>); rerun to resume"),
    backend: str = typer.Option("auto", help="auto (Ray if installed), ray, or sequential"),
    address: Optional[str] = typer.Option(None, help="Ray cluster address (default: a local ray.init())"),
    cpus_per_run: float = typer.Option(1.0, min=0.01, help="CPUs Ray reserves per run"),
) -> None:
    """Run a grid of runs (seeds × widths × methods …) and aggregate the results into one table.

    Every run's parameters are validated before the first run starts (a typo names the key). Each run
    writes runs/<run-id>/result.json atomically; rerunning with the same --out skips finished runs.
    Writes results.json, results.csv and report.md. Ray is optional: pip install 'modeconn[ray]'.
    """
    from .experiments.sweep import read_sweep_config, run_sweep

    try:
        cfg = read_sweep_config(config)
        out = out or Path("runs") / f"sweep-{cfg.name}"
        with console.status(f"sweep {cfg.name}"):
            results = run_sweep(cfg, out, backend=backend, address=address, cpus_per_run=cpus_per_run,
                                log=lambda s: console.log(s))
    except ModeconnError as err:
        _fail(err)
    console.print((out / "report.md").read_text())
    console.print(f"[bold green]{len(results['rows'])} runs aggregated in[/] {out.resolve()}  "
                  "(results.json, results.csv, report.md, runs/)")


def main() -> None:  # pragma: no cover - entry point
    app()
