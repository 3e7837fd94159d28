"""``modeconn align``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (DATASET_HELP, DEVICE_HELP, MAX_ITER_HELP, METHOD_OPTION_HELP, RESTARTS_HELP, app, console,
                   data_option, download_option, errors_exit, log, overwrite_option, parse_kv, progress_bar)
from ._help import live_help
from ._print import show
from ._user_data import reads_user_data


def _method_help() -> str:
    """The methods registered when help is shown (:func:`~._app.live_help`)."""
    from ..match.methods import command_line_methods

    return "alignment method: " + ", ".join(command_line_methods() + command_line_methods(continuous=True)) + " (below)"


def _epilog() -> str:
    """The methods with their summaries, registered when help is shown; the Hugging Face families are a
    ``modeconn list families`` away."""
    from ..match.methods import ALIGNMENT_METHODS, command_line_methods

    methods = [ALIGNMENT_METHODS.get(m) for m in command_line_methods() + command_line_methods(continuous=True)]
    return ("Methods (modeconn list methods): " + "; ".join(f"{m.name} — {m.summary}" for m in methods)
            + ".\n\nHugging Face model types: modeconn list families.")


@app.command(cls=live_help(_epilog, method=_method_help))
@reads_user_data
def align(
    a: Path = typer.Argument(..., help="checkpoint directory of the reference model A"),
    b: Path = typer.Argument(..., help="checkpoint directory of model B"),
    out: Path = typer.Option(..., help="checkpoint directory for the aligned B (plus alignment.json)"),
    method: str = typer.Option("weight", help=_method_help()),
    option: list[str] = typer.Option([], "--option", "-o", help=METHOD_OPTION_HELP),
    dataset: str | None = typer.Option(None, help=DATASET_HELP),
    data: Path | None = data_option(),
    download: bool = download_option(),
    limit_train: int | None = typer.Option(None, min=1, help="the first N training examples"),
    seed: int | None = typer.Option(None, help="random seed (default 0)"),
    steps: int | None = typer.Option(None, min=1, help="learned: Adam steps (default 200)"),
    lr: float | None = typer.Option(None, help="learned: Adam lr (default 0.01)"),
    lambda_schedule: str | None = typer.Option(None, help="learned: λ uniform, narrow or fixed"),
    lambda_value: float | None = typer.Option(None, help="learned: λ₀ (default 0.5)"),
    parameterization: str | None = typer.Option(None, help="dual: cayley, matrix_exp or unconstrained"),
    batch_size: int | None = typer.Option(None, min=1, help="dual: blocks per step (16)"),
    restarts: int | None = typer.Option(None, min=1, help=RESTARTS_HELP),
    max_iter: int | None = typer.Option(None, min=1, help=MAX_ITER_HELP),
    groups: str = typer.Option("permutation", help="Hugging Face: permutation, or full (orthogonal residual …)"),
    overwrite: bool = overwrite_option(),
    device: str | None = typer.Option(None, help=DEVICE_HELP),
    shard: bool = typer.Option(False, "--shard", help="dual under torchrun: shard endpoints and Adam state"),
) -> None:
    """Align B to A and write the aligned B as a checkpoint directory.

    The aligned B computes B's function (checked); alignment.json records the element, objective and timings.
    Hugging Face directories stream one tensor at a time (models larger than memory); dual and one-sided learn
    the continuous symmetries of causal LMs. An option the method does not use is refused by name. Docs: the
    Align, Transformers and Multi-process guides.
    """
    from ..recipes.align import AlignOptions, align as run_align

    opts = AlignOptions(method=method, dataset=dataset, data=data, download=download, limit_train=limit_train, seed=seed,
                        steps=steps, lr=lr, lambda_schedule=lambda_schedule, lambda_value=lambda_value,
                        parameterization=parameterization, batch_size=batch_size, restarts=restarts,
                        max_iter=max_iter, groups=groups, overwrite=overwrite, device=device, shard=shard,
                        options=parse_kv(option, "--option"))
    with errors_exit(download), progress_bar() as progress:
        outcome = run_align(a, b, out, opts, progress=progress, log=log,
                                note=lambda s: console.print(f"[yellow]{s}[/]"))
    show(outcome)
