"""``modeconn check``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (DATASET_HELP, app, check_out, data_option, download_option, errors_exit, log, overwrite_option,
                   progress_bar)
from ._print import show
from ._user_data import reads_user_data


@app.command()
@reads_user_data
def check(
    a: Path = typer.Argument(..., help="checkpoint directory of model A"),
    b: Path | None = typer.Argument(None, help="checkpoint directory of model B (omit: predict for a twin of A)"),
    dataset: str | None = typer.Option(None, help=DATASET_HELP),
    data: Path | None = data_option(),
    download: bool = download_option(),
    limit_train: int | None = typer.Option(None, min=1, help="use only the first N training examples"),
    max_batches: int = typer.Option(5, min=1, help="training batches (of 500) for activations and layer inputs"),
    eval_limit: int = typer.Option(2000, min=1, help="test examples for the endpoints' and aligned midpoints' loss"),
    seed: int = typer.Option(0, help="seed of the batches (and of your image folder's held-out share)"),
    out: Path | None = typer.Option(None, help="output directory (default runs/check-<time>)"),
    overwrite: bool = overwrite_option(),
    device: str | None = typer.Option(None, help="device of the forward passes and matching: cpu, cuda, mps … "
                                      "(default cpu)"),
) -> None:
    """Will A and B merge? Predicts the barrier without evaluating the path.

    Predicts the test-loss barrier_mean of merging A and B as they are and after weight / activation matching, a go
    / no-go verdict (barrier_mean below 0.1 nats) and the method to use; with A alone, whether an independently
    trained twin of A would merge without alignment. Writes report.md, results.json and check.png. Docs: the "Will
    these merge?" guide.
    """
    from ..experiments.output import default_out
    from ..recipes.check import CheckOptions, run_check

    out = out or default_out("check")
    opts = CheckOptions(dataset=dataset, data=data, limit_train=limit_train, max_batches=max_batches,
                        eval_limit=eval_limit, seed=seed, overwrite=overwrite, device=device)
    with errors_exit(download):
        check_out(out, [a, b, data], overwrite)
        with progress_bar() as progress:
            outcome = run_check(a, b, out, opts, log=log, progress=progress)
    show(outcome)
