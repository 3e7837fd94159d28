"""``modeconn align``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (DATASET_HELP, DEVICE_HELP, MAX_ITER_HELP, METHOD_OPTION_HELP, RESTARTS_HELP, app, console,
                   data_option, download_option, errors_exit, live_help, log, overwrite_option, parse_kv,
                   progress_bar, user_data)
from ._print import show


def _method_help() -> str:
    """The methods registered when help is shown (:func:`~._app.live_help`)."""
    from ..match.methods import command_line_methods

    return ("alignment method: " + ", ".join(command_line_methods() + command_line_methods(continuous=True))
            + " (modeconn list methods)")


@app.command(cls=live_help(method=_method_help))
def align(
    a: Path = typer.Argument(..., help="checkpoint directory of the reference model A"),
    b: Path = typer.Argument(..., help="checkpoint directory of model B (to be moved into A's basin)"),
    out: Path = typer.Option(..., help="checkpoint directory for the aligned B (plus alignment.json)"),
    method: str = typer.Option("weight", help=_method_help()),
    option: list[str] = typer.Option([], "--option", "-o", help=METHOD_OPTION_HELP),
    dataset: str | None = typer.Option(None, help="methods that read data: " + DATASET_HELP),
    data: Path | None = data_option(),
    download: bool = download_option(),
    limit_train: int | None = typer.Option(None, min=1, help="methods that read data: the first N training examples"),
    seed: int | None = typer.Option(None, help="seed of the methods with random choices (default 0)"),
    steps: int | None = typer.Option(None, min=1, help="learned matching: Adam steps (default 200; vision 300)"),
    lr: float | None = typer.Option(None, help="learned matching: Adam learning rate (default 0.01; vision 0.001)"),
    lambda_schedule: str | None = typer.Option(None, help="learned matching: λ per step: uniform, narrow or fixed"),
    lambda_value: float | None = typer.Option(None, help="learned matching: centre λ₀ of narrow / fixed (default 0.5)"),
    parameterization: str | None = typer.Option(None, help="dual / one-sided: cayley, matrix_exp or unconstrained"),
    batch_size: int | None = typer.Option(None, min=1, help="dual / one-sided: blocks per step (default 16)"),
    restarts: int | None = typer.Option(None, min=1, help=RESTARTS_HELP),
    max_iter: int | None = typer.Option(None, min=1, help=MAX_ITER_HELP),
    groups: str = typer.Option("permutation", help="Hugging Face: permutation (B's layout) or full (orthogonal "
                               "residual, per-head QK/OV; writes a/ and b/)"),
    overwrite: bool = overwrite_option(),
    device: str | None = typer.Option(None, help=DEVICE_HELP),
    shard: bool = typer.Option(False, "--shard", help="dual / one-sided under torchrun: shard the endpoints, "
                               "transforms and Adam state over the processes"),
) -> None:
    """Align B to A and write the aligned B as a checkpoint directory.

    The aligned B computes the same function as B (checked on an input batch); alignment.json records the group
    element, objective and timings. Hugging Face directories (modeconn list families) are aligned by streaming
    weight matching, so models larger than memory work; causal LMs with --method dual or one-sided also learn the
    continuous symmetries (writes a/, b/ and transforms.safetensors; torchrun splits the batches).

    An option the method does not use on the checkpoints' kind is refused, naming why. Docs: the Align,
    Transformers and Multi-process guides.
    """
    from ..recipes.align import AlignOptions, align as run_align

    opts = AlignOptions(method=method, dataset=dataset, data=data, download=download, limit_train=limit_train, seed=seed,
                        steps=steps, lr=lr, lambda_schedule=lambda_schedule, lambda_value=lambda_value,
                        parameterization=parameterization, batch_size=batch_size, restarts=restarts,
                        max_iter=max_iter, groups=groups, overwrite=overwrite, device=device, shard=shard,
                        options=parse_kv(option, "--option"))
    with errors_exit(download), user_data(dataset, None, "text", None, seed), progress_bar() as progress:
        outcome = run_align(a, b, out, opts, progress=progress, log=log,
                                note=lambda s: console.print(f"[yellow]{s}[/]"))
    show(outcome)
