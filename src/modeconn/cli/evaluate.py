"""``modeconn eval``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import app, data_option, download_option, errors_exit, log, overwrite_option, task_list
from ._print import show
from ._user_data import reads_user_data


@app.command("eval")
@reads_user_data
def eval_command(
    model: Path = typer.Argument(..., help="checkpoint directory: a modeconn checkpoint or a Hugging Face causal LM"),
    dataset: str | None = typer.Option(None, help="the dataset whose test split is scored (default: the "
                                       "checkpoint's; causal LMs: a text dataset)"),
    data: Path | None = data_option(),
    download: bool = download_option(),
    limit_train: int | None = typer.Option(None, min=1, help="use only the first N training examples (blocks)"),
    eval_limit: int | None = typer.Option(None, min=1, help="score the first N examples (blocks) of the test split"),
    tasks: str | None = typer.Option(None, help="comma-separated lm-evaluation-harness tasks (causal LMs; pip install "
                                     "'modeconn\\[eval]')"),
    include_path: Path | None = typer.Option(None, help="directory of local lm-eval task YAML files (they may run "
                                             "Python: only tasks you trust)"),
    limit: float | None = typer.Option(None, help="lm-eval: at most N documents per task (or a fraction in (0, 1))"),
    num_fewshot: int | None = typer.Option(None, min=0, help="lm-eval: few-shot examples (default: each task's own)"),
    batch_size: int = typer.Option(8, min=1, help="lm-eval: requests per batch"),
    seed: int = typer.Option(0, help="lm-eval's random, numpy, torch and few-shot seeds"),
    out: Path | None = typer.Option(None, help="output directory (default runs/eval-<time>)"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Score one checkpoint: test loss and accuracy (perplexity for LMs), and lm-eval tasks for causal LMs.

    Writes results.json and report.md (atomically). A NaN/Inf loss or score is an error: nothing is written.
    """
    from ..experiments.output import default_out
    from ..recipes.evaluate import EvalOptions, evaluate

    opts = EvalOptions(dataset=dataset, data=data, limit_train=limit_train, eval_limit=eval_limit,
                       tasks=task_list(tasks),
                       include_path=include_path, limit=limit, num_fewshot=num_fewshot, batch_size=batch_size,
                       seed=seed, overwrite=overwrite)
    with errors_exit(download):
        outcome = evaluate(model, out or default_out("eval"), opts, log=log)
    show(outcome)
