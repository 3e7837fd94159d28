"""``modeconn barrier``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (DATASET_HELP, METHOD_OPTION_HELP, app, check_out, console, data_option, download_option, errors_exit,
                   log, overwrite_option, parse_kv, progress_bar, task_list, written)
from ._help import live_help
from ._user_data import reads_user_data
from .tables import comparison_table


def _method_help() -> str:
    """The methods registered when help is shown (:func:`~._app.live_help`)."""
    from ..diagnostics.compare import method_labels

    return "alignment method, repeatable: " + ", ".join(method_labels()) + " (modeconn list methods)"


@app.command(cls=live_help(method=_method_help))
@reads_user_data
def barrier(
    a: Path = typer.Argument(..., help="checkpoint directory of model A"),
    b: Path = typer.Argument(..., help="checkpoint directory of model B"),
    method: list[str] = typer.Option(["naive", "weight", "activation"], "--method", help=_method_help()),
    option: list[str] = typer.Option([], "--option", "-o", help=METHOD_OPTION_HELP + " (to every --method that has "
                                     "it)"),
    dataset: str | None = typer.Option(None, help=DATASET_HELP),
    data: Path | None = data_option(),
    download: bool = download_option(),
    bn: str = typer.Option("reset", help="BatchNorm policy: reset, interpolate, keep, repair"),
    lambdas: int = typer.Option(25, min=2, help="points on the path, endpoints included"),
    eval_limit: int | None = typer.Option(None, min=1, help="evaluate on the first N examples of each split"),
    limit_train: int | None = typer.Option(None, min=1, help="use only the first N training examples"),
    seed: int = typer.Option(0, help="seed of the methods' random choices and the BatchNorm batches"),
    out: Path | None = typer.Option(None, help="output directory (default runs/barrier-<time>)"),
    overwrite: bool = overwrite_option(),
    eval_tasks: str | None = typer.Option(None, "--eval", help="lm-eval tasks scored on A, B and each midpoint merge"),
    include_path: Path | None = typer.Option(None, help="--eval: local lm-eval task directory"),
) -> None:
    """Barriers between two checkpoints, naive and after each alignment method.

    Evaluates loss and accuracy along the linear path on train and test for every --method, reports
    barrier_mean, barrier_interp and peak (loss) and the error barriers, merges at λ=½, and writes
    results.json, report.md and barrier.png. Causal LMs: --eval scores lm-eval tasks along too.
    """
    from ..experiments.output import default_out
    from ..recipes.barrier import barrier as run_barrier

    out = out or default_out("barrier")
    with errors_exit(download):
        check_out(out, [a, b, data, include_path], overwrite)
        with progress_bar() as progress:
            comparison = run_barrier(a, b, method, out, options=parse_kv(option, "--option"), dataset=dataset,
                                     data=data, limit_train=limit_train, bn=bn, lambdas=lambdas, eval_limit=eval_limit,
                                     seed=seed, overwrite=overwrite, log=log, progress=progress,
                                     eval_tasks=task_list(eval_tasks),
                                     include_path=include_path)
    console.print(comparison_table(comparison.to_json(), "test"))
    if eval_tasks:
        _print_harness_barriers(out)
    written(out, "report.md, results.json, barrier.png")


def _print_harness_barriers(out: Path) -> None:
    """One line per method and task: each lm-eval metric's barrier (results.json ``lm_eval``)."""
    import json

    record = json.loads((out / "results.json").read_text())["lm_eval"]
    for method, per_task in record["barrier"].items():
        for task, metrics in per_task.items():
            console.print(f"lm-eval {task} barrier ({method}): " + ", ".join(f"{m} {v:+.4g}" for m, v in metrics.items()))
