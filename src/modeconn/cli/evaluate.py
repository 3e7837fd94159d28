"""``modeconn eval``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (DATA_HELP, DOWNLOAD_HELP, OVERWRITE_HELP, app, context_length_option, errors_exit,
                   label_field_option, log, split_option, text_field_option, user_data)
from ._print import show


@app.command("eval")
def eval_command(
    model: Path = typer.Argument(..., help="checkpoint directory: a modeconn checkpoint or a Hugging Face causal LM"),
    dataset: str | None = typer.Option(None, help="dataset to score the held-out (test) split of (default: the one "
                                       "recorded in a modeconn checkpoint; Hugging Face causal LMs: a text dataset)"),
    split: str | None = split_option(),
    text_field: str = text_field_option(),
    label_field: str = label_field_option(),
    context_length: int | None = context_length_option(),
    data: Path | None = typer.Option(None, help=DATA_HELP),
    download: bool = typer.Option(False, help=DOWNLOAD_HELP),
    limit_train: int | None = typer.Option(None, min=1, help="use only the first N training examples (text: the "
                                           "tokenizer's blocks)"),
    eval_limit: int | None = typer.Option(None, min=1, help="score the first N examples (blocks) of the test split"),
    tasks: str | None = typer.Option(None, help="comma-separated lm-evaluation-harness tasks (causal LMs; built-in "
                                     "names or local YAML tasks from --include-path; pip install 'modeconn\\[eval]')"),
    include_path: Path | None = typer.Option(None, help="directory of local lm-eval task YAML files (a task may run "
                                             "Python it names with !function: point this only at tasks you trust)"),
    limit: float | None = typer.Option(None, help="lm-eval: at most N documents per task (or a fraction in (0, 1))"),
    num_fewshot: int | None = typer.Option(None, min=0, help="lm-eval: few-shot examples (default: each task's own)"),
    batch_size: int = typer.Option(8, min=1, help="lm-eval: requests per batch"),
    seed: int = typer.Option(0, help="lm-eval's random, numpy, torch and few-shot seeds"),
    out: Path | None = typer.Option(None, help="output directory (default runs/eval-<time>)"),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
) -> None:
    """Score one checkpoint: loss and accuracy on a dataset's test split (perplexity for language models) and
    lm-evaluation-harness tasks for causal LMs.

    Writes results.json and report.md (atomically). A NaN/Inf loss or score is an error: nothing is written.
    """
    from ..experiments.output import default_out
    from ..recipes.evaluate import EvalOptions, evaluate

    opts = EvalOptions(dataset=dataset, data=data, limit_train=limit_train, eval_limit=eval_limit,
                       tasks=tuple(t.strip() for t in tasks.split(",") if t.strip()) if tasks is not None else (),
                       include_path=include_path, limit=limit, num_fewshot=num_fewshot, batch_size=batch_size,
                       seed=seed, overwrite=overwrite)
    with errors_exit(download), user_data(dataset, split, text_field, context_length, seed, label_field):
        outcome = evaluate(model, out or default_out("eval"), opts, log=log)
    show(outcome)
