"""The `modeconn` command line (typer). Every command prints where its outputs went."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
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
def _path_progress(label: str = "path points", log_every_s: float = 10.0):
    """A rich progress bar with ETA fed by a ``progress(i, total)`` callback (a new task whenever ``i`` restarts at
    1); without a terminal (a log file, CI) a plain line every ``log_every_s`` seconds instead."""
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        state: dict = {}

        def update(i: int, total: int) -> None:
            now = time.monotonic()
            if i == 1 or "task" not in state:
                state.update(task=bar.add_task("path", total=total), start=now, logged=now)
            bar.update(state["task"], completed=i)
            if not console.is_terminal and (now - state["logged"] >= log_every_s or i == total):
                state["logged"] = now
                rate = (now - state["start"]) / max(i, 1)
                console.log(f"{label}: {i}/{total} ({100 * i / max(total, 1):.0f}%), "
                            f"{now - state['start']:.0f} s elapsed, ETA {rate * max(total - i, 0):.0f} s")

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
        _check_out(out, [], overwrite)
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
    model: str = typer.Option("mlp", help="architecture: mlp, vgg, resnet20, cnn, mobilenetv2, cct; "
                                          "gpt-neox-tiny (a causal LM, for text datasets)"),
    dataset: str = typer.Option("digits", help="dataset: digits, mnist, fashion-mnist, cifar10, cifar100; "
                                               "austen (text: next-token prediction)"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    model_arg: list[str] = typer.Option([], "--model-arg", "-m", help="architecture option key=value, e.g. -m width=512 -m depth=3"),
    dataset_arg: list[str] = typer.Option(
        [], "--dataset-arg", help="text dataset option key=value: vocab_size (default 4096), context_length "
                                  "(default 128), val_fraction, test_fraction (default 0.05 each)"),
    seed: int = typer.Option(0, help="seed of initialisation and data order"),
    epochs: int = typer.Option(10, min=1),
    lr: float = typer.Option(0.05, help="peak learning rate (language models: try --optimizer adamw --lr 3e-3)"),
    batch_size: int = typer.Option(128, min=1, help="examples per step (text: blocks of context_length tokens)"),
    optimizer: str = typer.Option("sgd", help="sgd or adamw"),
    weight_decay: float = typer.Option(5e-4, min=0.0),
    warmup_epochs: float = typer.Option(0.0, min=0.0),
    schedule: str = typer.Option("cosine", help="cosine, linear or constant"),
    grad_clip: Optional[float] = typer.Option(None, min=0.0, help="clip the global gradient norm to this value"),
    limit_train: Optional[int] = typer.Option(None, min=1, help="use only the first N training examples (text: blocks)"),
    device: str = typer.Option("cpu", help="torch device, e.g. cpu or cuda"),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out"),
) -> None:
    """Train one model on a dataset and write a checkpoint directory.

    The directory holds config.json (architecture, kwargs, training config, dataset), model.safetensors
    and metrics.json (per-epoch history, validation and test metrics). For a text dataset (austen) the
    model maps token blocks to next-token logits (e.g. --model gpt-neox-tiny); losses are nats per token,
    metrics.json also gives perplexity, config.json records dataset_options, and the tokenizer is saved as
    tokenizer.json (load it with tokenizers.Tokenizer.from_file to decode).
    """
    from .data import TextBundle, load_dataset
    from .models import validate_model_kwargs
    from .train import TrainConfig, train_checkpoint

    try:
        _check_out(out, [data], overwrite)
        cfg = TrainConfig(seed=seed, epochs=epochs, lr=lr, batch_size=batch_size, optimizer=optimizer,
                          weight_decay=weight_decay, warmup_epochs=warmup_epochs, schedule=schedule,
                          grad_clip=grad_clip, device=device)
        kwargs = _parse_kv(model_arg, "--model-arg")
        options = _parse_kv(dataset_arg, "--dataset-arg")
        bundle = load_dataset(dataset, data, limit_train=limit_train, **options)
        kwargs = {"in_shape": bundle.input_shape, "num_classes": bundle.num_classes, **kwargs}
        validate_model_kwargs(model, kwargs)
        extra_config: dict[str, Any] = {"dataset": dataset}
        extra_json = None
        if isinstance(bundle, TextBundle):
            extra_config["dataset_options"] = bundle.options
            extra_config["tokenizer_sha256"] = bundle.tokenizer_sha256
            extra_json = {"tokenizer.json": json.loads(bundle.tokenizer_json())}
        path = train_checkpoint(model, kwargs, bundle.train, cfg, out, val_set=bundle.val, test_set=bundle.test,
                                extra_config=extra_config, extra_json=extra_json, overwrite=overwrite)
    except ModeconnError as err:
        _fail(err)
    metrics = json.loads((path / "metrics.json").read_text())
    test = metrics["test"]
    if "ppl" in test:
        console.print(f"test loss {test['loss']:.4f} nats/token (perplexity {test['ppl']:.2f}), "
                      f"next-token acc {100 * test['acc']:.2f}%")
    else:
        console.print(f"test acc {100 * test['acc']:.2f}%, test loss {test['loss']:.4f}")
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
    return load_dataset(name, data, limit_train=limit_train, **config.get("dataset_options", {}))


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
        _check_out(out, [a, b, data], overwrite)
        check_methods(method)
        check_bn_policy(bn)
        ma, mb, cfg = _load_pair(a, b)
        bundle = _dataset_for(cfg, dataset, data, limit_train)
        with _path_progress() as progress:
            comparison = run_barrier(out, ma, mb, bundle, method, bn=bn, lambdas=lambdas, eval_limit=eval_limit,
                                     seed=seed, overwrite=overwrite, names=(str(a), str(b)),
                                     inputs=[a, b], log=lambda s: console.log(s), progress=progress)
    except ModeconnError as err:
        _fail(err)
    console.print(_barrier_table(comparison, "test"))
    console.print(f"[bold green]outputs written to[/] {out.resolve()}  (report.md, results.json, barrier.png)")


@app.command()
def align(
    a: Path = typer.Argument(..., help="checkpoint directory of the reference model A"),
    b: Path = typer.Argument(..., help="checkpoint directory of model B (to be permuted into A's basin)"),
    out: Path = typer.Option(..., help="checkpoint directory for the aligned B (plus alignment.json)"),
    method: str = typer.Option("weight", help="weight, activation, learned (STE), one-sided or dual (one-sided and "
                                              "dual: language models only; learned on language models: deprecated "
                                              "name of one-sided)"),
    dataset: Optional[str] = typer.Option(None, help="dataset for activation/learned matching (default: A's)"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    limit_train: Optional[int] = typer.Option(None, min=1),
    seed: int = typer.Option(0),
    steps: int = typer.Option(200, min=1, help="language models (dual / one-sided): Adam steps of learned matching"),
    lr: float = typer.Option(0.01, help="language models (dual / one-sided): Adam learning rate of the transforms"),
    lambda_schedule: str = typer.Option("uniform", help="language models: λ per step: uniform, narrow or fixed"),
    lambda_value: float = typer.Option(0.5, help="language models: centre λ₀ ∈ [0, 1] of the narrow / fixed schedule"),
    parameterization: str = typer.Option("cayley", help="language models: cayley, matrix_exp or unconstrained"),
    batch_size: int = typer.Option(16, min=1, help="language models: training blocks per learned-matching step"),
    restarts: int | None = typer.Option(None, min=1, help="Hugging Face directories: weight-matching runs (default 4)"),
    max_iter: int | None = typer.Option(None, min=1, help="Hugging Face directories: sweeps per run (default 100)"),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out"),
) -> None:
    """Align B to A and write the aligned B as a checkpoint directory.

    The aligned B computes the same function as B (checked on an input batch); alignment.json records
    the group element, objective and timings.

    Hugging Face checkpoint directories (config.json with model_type; model.safetensors or shards with
    model.safetensors.index.json), e.g. Pythia / GPT-2 / Llama: streaming weight matching (--method weight only)
    that reads one tensor at a time, so models larger than memory work; permutation groups (residual, per-head
    q·k and v·o, FFN), no normalization absorption. --out gets B's layout (same shard files and index), B's
    config.json and other side files, and alignment.json. A sweep over Pythia-1B shapes takes about 6 minutes on
    one CPU core in under 1 GiB (benchmarks/bench_stream_wm.py): try --restarts 1 --max-iter 2.

    Language-model checkpoints (gpt-neox-tiny) with --method dual (LMC-DM, METHODS.md §3) or one-sided
    (--method learned there is its deprecated name): both models are absorbed (normalizations folded), the full group is bound (orthogonal
    residual, head permutation, per-head invertible QK / OV, FFN permutation), weight matching gives the
    discrete parts and the start, and the continuous transforms are learned on the training split. --out
    then holds a/ and b/ (the transformed absorbed endpoints; load with modeconn.symmetry.load_absorbed),
    transforms.safetensors and alignment.json. Multi-process: `torchrun --standalone --nproc_per_node N -m
    modeconn align ...` splits every batch over the N processes (--batch-size ≥ N; NCCL on cuda:LOCAL_RANK where
    CUDA is available, else gloo); rank 0 alone writes --out and prints.
    """
    from .experiments.checkpoints import example_input
    from .experiments.compare import align as run_align
    from .experiments.compare import check_methods
    from .io import save_checkpoint
    from .symmetry import symmetry_spec

    try:
        _check_out(out, [a, b, data], overwrite)
        if method not in ("weight", "activation", "learned", "one-sided", "dual"):
            raise ModeconnError(f"--method must be one of weight, activation, learned, one-sided, dual (got {method!r})")
        if _align_hf_if_applicable(a, b, out, method, dataset, seed, restarts, max_iter, overwrite):
            return
        _no_hf_options(restarts, max_iter)
        if _align_lm_if_applicable(a, b, out, method, dataset, data, limit_train, seed, steps, lr, lambda_schedule,
                                   lambda_value, parameterization, batch_size, overwrite):
            return
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
            extra_json={"alignment.json": res.to_json()}, overwrite=overwrite, inputs=[a, b], command="align")
    except ModeconnError as err:
        _fail(err)
    console.print(f"{method} matching objective {res.objective:.4f} ({len(spec.spaces)} spaces)")
    console.print(f"[bold green]aligned checkpoint written to[/] {path.resolve()}")


def _align_lm_if_applicable(a, b, out, method, dataset, data, limit_train, seed, steps, lr, lambda_schedule,
                            lambda_value, parameterization, batch_size, overwrite) -> bool:
    """``align`` for language-model checkpoints with --method dual / one-sided (or learned, deprecated there); False if
    it does not apply.
    Every option and both configs are checked before any weights are read. Under ``torchrun`` the learned matching
    is data-parallel over the processes (:func:`~modeconn.match.dual.init_distributed`: NCCL and ``cuda:LOCAL_RANK``
    where CUDA is available, gloo on the CPU otherwise); only rank 0 writes --out, logs and shows the progress bar."""
    from .io import load_checkpoint, read_config
    from .match.dual import LAMBDA_SCHEDULES, init_distributed, launched_world_size
    from .match.parametrize import get_parameterization
    from .models import TOKEN_MODELS

    configs = [read_config(a), read_config(b)]
    is_lm = any(c.get("architecture") in TOKEN_MODELS for c in configs)
    if not is_lm:
        if method in ("dual", "one-sided"):
            raise ModeconnError(f"--method {method} needs language-model checkpoints (architecture gpt-neox-tiny); "
                                f"{a} is {configs[0].get('architecture')!r}: use weight, activation or learned")
        return False
    if method not in ("dual", "one-sided", "learned"):
        return False
    if method == "learned":  # one name, one algorithm: learned is STE matching; on LMs it meant one-sided
        console.print("[yellow]deprecated:[/] --method learned on language models is one-sided learned matching; "
                      "use --method one-sided")
        method = "one-sided"
    from .experiments.lmc_dm import align_lm_checkpoints, check_same_lm_configs

    if lambda_schedule not in LAMBDA_SCHEDULES:
        raise ModeconnError(f"--lambda-schedule must be one of {', '.join(LAMBDA_SCHEDULES)} (got {lambda_schedule!r})")
    if not 0.0 <= lambda_value <= 1.0:
        raise ModeconnError(f"--lambda-value must lie in [0, 1] (got {lambda_value}); λ is the weight of B on the path")
    if not lr > 0:
        raise ModeconnError(f"--lr must be > 0 (got {lr})")
    get_parameterization(parameterization)  # ConfigError naming the choices
    check_same_lm_configs(configs, [a, b])
    world = launched_world_size()
    if batch_size < world:
        raise ModeconnError(f"--batch-size {batch_size} is smaller than the number of processes ({world}): every "
                            "process needs a share of each batch; raise --batch-size or start fewer processes")
    info = init_distributed()
    try:
        ma, ca = load_checkpoint(a)
        mb, _ = load_checkpoint(b)
        bundle = _dataset_for(ca, dataset, data, limit_train)
        with _matching_progress(f"{method} matching", enabled=info.rank == 0) as progress:
            rec = align_lm_checkpoints(ma, mb, bundle, out, method=method, steps=steps, lr=lr,
                                       lambda_schedule=lambda_schedule, lambda_value=lambda_value,
                                       parameterization=parameterization, batch_size=batch_size, seed=seed,
                                       overwrite=overwrite, progress=progress, log=lambda s: console.log(s),
                                       device=info.device)
    finally:
        if info.initialized_here:
            import torch.distributed

            torch.distributed.destroy_process_group()
    if info.rank != 0:
        return True
    procs = f" on {info.world_size} processes" if info.world_size > 1 else ""
    console.print(f"{'dual' if method == 'dual' else 'one-sided learned'} matching: path loss "
                  f"{rec['first_loss']:.4f} → {rec['objective']:.4f} nats/token over {steps} steps{procs} "
                  f"({len(rec['spaces'])} spaces, weight-matching objective {rec['wm_objective']:.4f})")
    console.print(f"[bold green]aligned endpoints written to[/] {Path(out).resolve()}  (a/, b/, "
                  "transforms.safetensors, alignment.json)")
    return True


@contextmanager
def _matching_progress(label: str, enabled: bool = True):
    """A rich progress bar (steps done, the last step's loss, elapsed and remaining time) fed by the learned matching's
    ``progress(stage, done, total, loss=…)`` callback (:mod:`modeconn.match.progress`; the former ``(step, steps,
    loss)`` call still works); yields None (no bar) when not ``enabled`` (ranks other than 0)."""
    if not enabled:
        yield None
        return
    from rich.progress import TimeRemainingColumn

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task(label, total=None, loss="–")

        def update(*args, **metrics) -> None:
            step, steps, loss = (args[1], args[2], metrics.get("loss")) if isinstance(args[0], str) else args
            bar.update(task, completed=step, total=steps, loss="–" if loss is None else f"{loss:.4f}")

        yield update


def _hf_dirs(paths) -> bool:
    """True if every path is a Hugging Face checkpoint directory, False if none is; ModeconnError for a mix."""
    from .stream import is_hf_checkpoint

    hf = [is_hf_checkpoint(p) for p in paths]
    if any(hf) and not all(hf):
        from .io import read_json_object

        for p, h in zip(paths, hf):  # a missing directory or unreadable config.json is named as such
            if not h:
                read_json_object(Path(p) / "config.json", "config file")
        kinds = ", ".join(f"{p} ({'Hugging Face' if h else 'modeconn'})" for p, h in zip(paths, hf))
        raise ModeconnError(f"mixed checkpoint kinds: {kinds}; all must be modeconn checkpoints or all Hugging Face "
                            "directories (config.json with model_type)")
    return bool(hf) and all(hf)


def _parse_weights(weights: Optional[str], n_models: int, normalize: bool = True) -> Optional[list[float]]:
    """--weights "0.7,0.7" → [0.5, 0.5] (normalised, with a note) or, with --no-normalize, as given; validated by
    :func:`modeconn.path.interpolate.merge_weights` (ConfigError naming the option and the bad entry)."""
    from .path.interpolate import merge_weights, weights_sum_to_one

    if not weights:
        return None
    raw = [x.strip() for x in weights.split(",")]
    w = merge_weights(raw, n_models, normalize=normalize, option="--weights")
    if normalize and not weights_sum_to_one([float(x) for x in raw]):
        console.print(f"note: --weights {weights} normalised to sum 1: {','.join(f'{x:g}' for x in w)} "
                      "(--no-normalize uses them as given)")
    return w


def _check_single_process() -> None:
    """ModeconnError when streaming would run under torchrun (it is single-process: every rank would write
    --out)."""
    from .match.dual import launched_world_size

    if launched_world_size() > 1:
        raise ModeconnError("streaming align/merge of Hugging Face checkpoints runs in one process; launch it without "
                            "torchrun (multi-process runs are for --method dual / one-sided)")


def _check_out(out: Optional[Path], inputs, overwrite: bool) -> None:
    """Before any work: --out must not be, contain or lie inside an input, and an existing non-empty --out is
    replaced only with --overwrite and only if modeconn wrote it (ConfigError naming the reason)."""
    from ._util.outdir import check_output_target

    if out is not None:
        check_output_target(out, inputs=[p for p in inputs if p is not None], overwrite=overwrite)


def _no_hf_options(restarts, max_iter) -> None:
    if restarts is not None or max_iter is not None:
        raise ModeconnError("--restarts / --max-iter apply to Hugging Face checkpoint directories (streaming weight "
                            "matching) only")


@contextmanager
def _stage_progress():
    """A rich progress bar fed by ``progress(stage, done, total)``: one bar per stage (a new stage replaces the last)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        state: dict = {}

        def update(stage: str, done: int, total: int, **metrics) -> None:
            if state.get("stage") != stage:
                if "task" in state:
                    bar.remove_task(state["task"])
                state.update(stage=stage, task=bar.add_task(stage, total=total))
            bar.update(state["task"], completed=done, total=total)

        yield update


def _align_hf_if_applicable(a, b, out, method, dataset, seed, restarts, max_iter, overwrite) -> bool:
    """``align`` for Hugging Face checkpoint directories (streaming weight matching); False if A and B are not.
    Configs (field by field), shards, the spec and --out are checked before the matching starts."""
    if not _hf_dirs([a, b]):
        return False
    from .stream import align_hf_checkpoints

    _check_single_process()
    if method != "weight":
        raise ModeconnError(f"Hugging Face checkpoint directories are aligned by streaming weight matching only "
                            f"(--method weight, got {method!r}): activation, learned and dual matching need both "
                            "models in memory and data")
    if dataset is not None:
        raise ModeconnError("--dataset does not apply: weight matching of Hugging Face checkpoints reads no data")
    with _stage_progress() as progress:
        res = align_hf_checkpoints(a, b, out, seed=seed, restarts=restarts or 4, max_iter=max_iter or 100,
                                   overwrite=overwrite, progress=progress)
    console.print(f"streaming weight matching objective {res.objective:.4f} (upper bound "
                  f"{res.stats['upper_bound']:.4f}; {len(res.element)} spaces, {res.stats['seconds']:.1f} s)")
    console.print(f"[bold green]aligned checkpoint written to[/] {Path(out).resolve()}  (config.json, safetensors "
                  "shards and index as B, alignment.json)")
    return True


def _merge_hf_if_applicable(models, out, weights, align_method, bn, dataset, data, limit_train, seed, restarts,
                            max_iter, overwrite, normalize=True) -> bool:
    """``merge`` for Hugging Face checkpoint directories: streaming weight matching to the first, weighted average
    written shard by shard; no BatchNorm handling and no evaluation (no data). False if the models are not HF dirs."""
    if not _hf_dirs(models):
        return False
    from .stream import merge_hf_checkpoints

    _check_single_process()
    if bn == "repair" or dataset is not None or data is not None or limit_train is not None:
        raise ModeconnError("Hugging Face checkpoints are merged without data: --bn repair, --dataset, --data and "
                            "--limit-train do not apply (transformer LMs have no BatchNorm statistics to reset)")
    with _stage_progress() as progress:
        rec = merge_hf_checkpoints(models, out, weights=weights, align=align_method, seed=seed,
                                   restarts=restarts or 4, max_iter=max_iter or 100, overwrite=overwrite,
                                   progress=progress, normalize=normalize)
    for r in rec["alignments"]:
        console.print(f"{r['model']}: streaming weight matching objective {r['objective']:.4f}")
    console.print(f"[bold green]merged checkpoint written to[/] {Path(out).resolve()}  (config.json, safetensors "
                  "shards and index as the first model, merge.json)")
    return True


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
    weights: Optional[str] = typer.Option(None, help="comma-separated weights, one per model (default uniform); "
                                          "non-negative and normalised to sum 1 unless --no-normalize"),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help="normalise --weights to sum 1 (default); "
                                   "--no-normalize: any finite weights as given (task-arithmetic sums, extrapolation)"),
    align_method: str = typer.Option("weight", "--align", help="align every model to the first first: weight, activation, none"),
    bn: str = typer.Option("reset", help="BatchNorm policy after averaging: reset, interpolate, repair"),
    dataset: Optional[str] = typer.Option(None, help="dataset for BN reset / REPAIR / activation matching (default: the first model's)"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    limit_train: Optional[int] = typer.Option(None, min=1),
    seed: int = typer.Option(0),
    restarts: int | None = typer.Option(None, min=1, help="Hugging Face directories: weight-matching runs (default 4)"),
    max_iter: int | None = typer.Option(None, min=1, help="Hugging Face directories: sweeps per run (default 100)"),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out"),
) -> None:
    """Merge two or more checkpoints into one.

    Aligns every model to the first (unless --align none), averages with --weights, re-estimates
    BatchNorm statistics (reset) or applies REPAIR, evaluates on the test split and writes a checkpoint.

    Hugging Face checkpoint directories (config.json with model_type, safetensors shards or one file): --align
    weight (streaming weight matching) or none, then the weighted average is written shard by shard in the first
    model's layout with its config.json and merge.json; no BatchNorm step and no evaluation (no data is read).
    """
    from .experiments.merge import run_merge

    try:
        _check_out(out, [*models, data], overwrite)
        w = _parse_weights(weights, len(models), normalize)
        if _merge_hf_if_applicable(models, out, w, align_method, bn, dataset, data, limit_train, seed, restarts,
                                   max_iter, overwrite, normalize):
            return
        _no_hf_options(restarts, max_iter)
        path, metrics = run_merge(models, out, weights=w, align_method=align_method, bn=bn, dataset=dataset,
                                  data=data, limit_train=limit_train, seed=seed, overwrite=overwrite, normalize=normalize,
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
    budget: Optional[int] = typer.Option(None, min=1, help="most gradient evaluations, honoured by every method (llpf: each "
                                         "tick's refinement capped at its fair share); the number used is reported"),
    dataset: Optional[str] = typer.Option(None, help="dataset (default: the one recorded in A's config.json)"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    limit_train: Optional[int] = typer.Option(None, min=1, help="use only the first N training examples"),
    eval_limit: Optional[int] = typer.Option(2000, min=1, help="evaluate on the first N examples of each split"),
    sub_points: int = typer.Option(3, min=0, help="linear sub-points per segment for the continuity check"),
    continuity_tol: float = typer.Option(0.05, min=0.0, help="a segment passes the continuity check when its "
                                         "sub-points rise at most this much (nats) above its ends"),
    seed: int = typer.Option(0, help="seed of the BatchNorm recalibration batches"),
    out: Optional[Path] = typer.Option(None, help="output directory (default runs/path-<time>)"),
    resume: bool = typer.Option(False, help="continue a killed LLPF search for --out (same settings and data)"),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out (and discard an interrupted search for it)"),
) -> None:
    """Find a low-loss path from A to B and evaluate it.

    Writes the path (out/path: safetensors shards + path.json, loadable with modeconn.path.Path.load),
    results.json (loss/accuracy at every point on train and test with BatchNorm recomputed per point,
    continuity check, peak loss, path length, gradient evaluations, wall time), report.md and path_loss.png.
    LLPF checkpoints as it runs: kill it and rerun with --resume to continue.
    Everything is written to a temporary sibling that replaces --out in one step at the end.

    Exit status: 0 for a complete path (it reaches B and every segment passes the continuity check), 3 for an
    incomplete one (all outputs are still written; report.md and results.json say why), 2 for an error.
    """
    from .experiments.output import default_out
    from .experiments.paths import INCOMPLETE_EXIT_CODE, check_path_options, run_path

    out = out or default_out("path")
    try:
        _check_out(out, [a, b, data], overwrite or resume)  # --resume continues modeconn's own run there
        options = _parse_kv(option, "--option")
        check_path_options(method, options)  # typos fail before anything is loaded
        ma, mb, cfg = _load_pair(a, b)
        bundle = _dataset_for(cfg, dataset, data, limit_train)
        with _path_progress("search / evaluation") as progress:
            results = run_path(out, method, ma, mb, bundle, options, budget=budget, eval_limit=eval_limit,
                               sub_points=sub_points, seed=seed, resume=resume, overwrite=overwrite,
                               names=(str(a), str(b)), inputs=[p for p in (a, b, data) if p is not None],
                               limit_train=limit_train, continuity_tol=continuity_tol,
                               log=lambda s: console.log(s), progress=progress)
    except ModeconnError as err:
        _fail(err)
    console.print(results["headline"], style=None if results["complete"] else "bold red", markup=False)
    console.print(f"[bold green]outputs written to[/] {out.resolve()}  (path/, results.json, report.md, path_loss.png)")
    if not results["complete"]:
        raise typer.Exit(code=INCOMPLETE_EXIT_CODE)


def _experiment_help() -> str:
    from .experiments import EXPERIMENTS
    from .experiments.registry import experiments_help

    return ("Run a named experiment; writes results.json, report.md and its figures.\n\n" + experiments_help()
            + "\n\nValid names: " + ", ".join(EXPERIMENTS))


@app.command(help=_experiment_help())
def experiment(
    name: str = typer.Argument(..., help="experiment name (listed above)"),
    quick: bool = typer.Option(False, help="the small CI size (minutes on 2 cores) instead of the full size"),
    pairs: Optional[int] = typer.Option(None, min=1, help="model pairs per setting (default: 1 quick, 3 full)"),
    epochs: Optional[int] = typer.Option(None, min=1, help="training epochs per model (default per experiment)"),
    width: Optional[int] = typer.Option(None, min=1, help="hidden width of the models (default per experiment)"),
    limit_train: Optional[int] = typer.Option(None, min=1, help="training examples per model (default per size)"),
    data: Optional[Path] = typer.Option(None, help=DATA_HELP),
    out: Optional[Path] = typer.Option(None, help="output directory (default runs/<name>-<time>)"),
    overwrite: bool = typer.Option(False, help="replace --out if modeconn wrote it"),
) -> None:
    from .experiments import EXPERIMENTS
    from .experiments.output import default_out

    try:
        exp = EXPERIMENTS.get(name)
        settings = dict(pairs=pairs, epochs=epochs, width=width, limit_train=limit_train)
        exp.size(quick, **settings)  # a setting that does not apply fails before any work
        out = out or default_out(name)
        _check_out(out, [data], overwrite)
        with console.status(f"running {name}"):
            results = exp(out, quick=quick, data=data, overwrite=overwrite, log=lambda m: console.log(m), **settings)
    except ModeconnError as err:
        _fail(err)
    console.print(exp.report(results).split("![")[0])
    console.print(f"[bold green]outputs written to[/] {out.resolve()}  ({', '.join(exp.outputs)})")


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
