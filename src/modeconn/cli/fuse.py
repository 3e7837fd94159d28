"""``modeconn fuse``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import DATASET_HELP, app, check_out, data_option, errors_exit, log, overwrite_option
from ._print import show


@app.command()
def fuse(
    model_a: Path = typer.Argument(..., help="checkpoint directory of model A (the reference)"),
    model_b: Path = typer.Argument(..., help="checkpoint directory of model B: A's architecture at another width"),
    out: Path = typer.Option(..., help="checkpoint directory for the fused model"),
    width: float | None = typer.Option(None, help="the fused model's width option, or a Hugging Face model's FFN width "
                                                   "(default: the narrower model's)"),
    dataset: str | None = typer.Option(None, help=DATASET_HELP),
    data: Path | None = data_option(),
    limit_train: int | None = typer.Option(None, min=1, help="the first N training examples"),
    batches: int = typer.Option(20, min=1, help="training batches (128 examples, or 8 text blocks) whose activations pair the units"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Fuse two checkpoints of one architecture at different widths into one of --width.

    Per symmetry space, the units of A and B are paired by activation correlation on training data (a partial
    assignment), both models keep their paired units and are averaged; BatchNorm statistics are re-estimated.
    Writes a checkpoint of A's architecture at --width and reports its test accuracy. Hugging Face causal LMs of one
    family whose intermediate_size differs: FFN units paired on --dataset text, residual and heads aligned by weight
    matching; a stock checkpoint is written. Docs: the Merge guide.
    """
    from ..recipes.fuse import fuse as run_fuse

    with errors_exit():
        check_out(out, (model_a, model_b, data), overwrite)
        outcome = run_fuse(model_a, model_b, out, width=width, dataset=dataset, data=data, limit_train=limit_train,
                           batches=batches, overwrite=overwrite, log=log)
    show(outcome)
