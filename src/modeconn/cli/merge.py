"""``modeconn merge``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (DATASET_HELP, DEVICE_HELP, MAX_ITER_HELP, METHOD_OPTION_HELP, RESTARTS_HELP, app, console,
                   data_option, errors_exit, log, overwrite_option, parse_kv, progress_bar, task_list)
from ._help import live_help
from ._print import show
from ._user_data import reads_user_data


def _rule_help() -> str:
    """The rules registered when help is shown (:func:`~._app.live_help`)."""
    from ..path.merge_rules import MERGE_RULES

    return "merge rule: " + ", ".join(r.name for r in MERGE_RULES.entries()) + " (modeconn list rules)"


def _align_help() -> str:
    """The --align choices registered when help is shown (:func:`~._app.live_help`)."""
    from ..recipes.merge_plan import align_choices

    return "align every model to the first: " + ", ".join(align_choices())


@app.command(cls=live_help(align_method=_align_help, rule=_rule_help))
@reads_user_data
def merge(
    models: list[Path] = typer.Argument(None, help="two or more checkpoint directories (or Hugging Face cache "
                                        "entries); the first is the reference"),
    out: Path = typer.Option(..., help="checkpoint directory for the merged model"),
    config: Path | None = typer.Option(None, help="a merge recipe (mergekit's YAML) instead of models and rules"),
    weights: str | None = typer.Option(None, help="comma-separated weights, one per model (default uniform)"),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help="normalise --weights to sum 1"),
    rule: str = typer.Option("linear", help=_rule_help()),
    base: str | None = typer.Option(None, help="the base model of a task-vector rule or SLERP (one of the models)"),
    param: list[str] = typer.Option([], "--param", help="a rule parameter name=value, repeatable (e.g. density=0.5)"),
    dtype: str | None = typer.Option(None, help="Hugging Face: dtype of the output (default: the first model's)"),
    align_method: str = typer.Option("weight", "--align", help=_align_help()),
    option: list[str] = typer.Option([], "--option", "-o", help=METHOD_OPTION_HELP),
    bn: str = typer.Option("reset", help="BatchNorm policy after averaging: reset, interpolate, repair"),
    dataset: str | None = typer.Option(None, help=DATASET_HELP),
    data: Path | None = data_option(),
    limit_train: int | None = typer.Option(None, min=1, help="the first N training examples"),
    seed: int | None = typer.Option(None, help="seed of every random choice (default 0)"),
    restarts: int | None = typer.Option(None, min=1, help=RESTARTS_HELP),
    max_iter: int | None = typer.Option(None, min=1, help=MAX_ITER_HELP),
    overwrite: bool = overwrite_option(),
    device: str | None = typer.Option(None, help=DEVICE_HELP),
    eval_tasks: str | None = typer.Option(None, "--eval", help="lm-eval tasks to score the merge on"),
    include_path: Path | None = typer.Option(None, help="--eval: local lm-eval task directory"),
) -> None:
    """Merge two or more checkpoints into one.

    Aligns every model to the first (unless --align none), merges them by --rule, fixes BatchNorm statistics,
    evaluates and writes a checkpoint (Hugging Face: shard by shard, with a model card). Rules other than linear
    need pip install 'modeconn\\[mergekit]'. Docs: the Merge guide.
    """
    from ..recipes.merge import MergeOptions, merge as run_merge

    opts = MergeOptions(weights=[w.strip() for w in weights.split(",")] if weights else None,
                        normalize=normalize, rule=rule, align=align_method, bn=bn, dataset=dataset, data=data,
                        limit_train=limit_train, seed=seed, restarts=restarts, max_iter=max_iter,
                        overwrite=overwrite, base=base, params=tuple(param), dtype=dtype, config=config,
                        device=device, options=parse_kv(option, "--option"),
                        eval_tasks=task_list(eval_tasks),
                        include_path=include_path)
    with errors_exit(), progress_bar() as progress:
        outcome = run_merge(models or [], out, opts, progress=progress, log=log,
                            note=lambda s: console.print(f"note: {s}"))
    show(outcome)
