"""``modeconn path``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (DATASET_HELP, DATA_HELP, DOWNLOAD_HELP, app, check_out, console, context_length_option, errors_exit,
                   label_field_option, log, parse_kv, progress_bar, split_option, text_field_option, two_arg, user_data,
                   written)
from .tables import report_text


def _method_help() -> str:
    from ..path.methods import PATH_METHODS

    return "path method: " + "; ".join(f"{m.name} — {m.summary}" for m in map(PATH_METHODS.get, PATH_METHODS))


@app.command("path")
def path_command(
    a: Path = typer.Argument(..., help="checkpoint directory of model A (the path's start)"),
    b: Path = typer.Argument(..., help="checkpoint directory of model B (the path's end)"),
    method: str = typer.Option("llpf", help=_method_help()),
    option: list[str] = typer.Option([], "--option", "-o", help="method setting key=value, repeatable (e.g. -o step=0.02 "
                                     "-o ticks=200 for llpf; -o control_points=3 for bezier)"),
    budget: int | None = typer.Option(None, min=1, help="most gradient evaluations, honoured by every method (llpf: each "
                                      "tick's refinement capped at its fair share); the number used is reported"),
    dataset: str | None = typer.Option(None, help=DATASET_HELP),
    split: str | None = split_option(),
    text_field: str = text_field_option(),
    label_field: str = label_field_option(),
    context_length: int | None = context_length_option(),
    data: Path | None = typer.Option(None, help=DATA_HELP),
    download: bool = typer.Option(False, help=DOWNLOAD_HELP),
    limit_train: int | None = typer.Option(None, min=1, help="use only the first N training examples"),
    eval_limit: int | None = typer.Option(2000, min=1, help="evaluate on the first N examples of each split"),
    sub_points: int = typer.Option(3, min=0, help="linear sub-points per segment for the continuity check"),
    continuity_tol: float = typer.Option(0.05, min=0.0, help="a segment passes the continuity check when its "
                                         "sub-points rise at most this much (nats) above its ends"),
    seed: int = typer.Option(0, help="seed of the BatchNorm recalibration batches"),
    out: Path | None = typer.Option(None, help="output directory (default runs/path-<time>)"),
    resume: bool = typer.Option(False, help="continue a killed LLPF search for --out (same settings and data)"),
    overwrite: bool = typer.Option(False, help="replace a non-empty --out (and discard an interrupted search for it)"),
) -> None:
    """Find a low-loss path from A to B and evaluate it.

    Writes the path (out/path: safetensors shards + path.json, loadable with modeconn.path.Path.load),
    results.json (loss/accuracy at every point on train and test with BatchNorm recomputed per point,
    continuity check, peak loss, path length, gradient evaluations, wall time), report.md and path_loss.png.
    LLPF checkpoints as it runs: kill it and rerun with --resume to continue.
    Everything is written to a temporary sibling that replaces --out in one step at the end.

    The report, results.json and path_loss.png show the straight line A → B beside the path, and say whether the
    path is low-loss (dense peak within 0.1 nats of the higher endpoint) apart from whether it is continuous.

    Exit status: 0 for a complete path (it reaches B and every segment passes the continuity check), 3 for an
    incomplete one (all outputs are still written; report.md and results.json say why), 2 for an error, 130 when
    interrupted (Ctrl-C; an LLPF search continues with --resume).
    """
    from ..experiments.output import default_out
    from ..recipes.path import INCOMPLETE_EXIT_CODE, path as run_path

    out = out or default_out("path")
    with errors_exit(download):
        check_out(out, [a, b, data], overwrite or resume)  # --resume continues modeconn's own run there
        options = parse_kv(option, "--option")
        try:
            with user_data(dataset, split, text_field, context_length, seed, label_field), progress_bar() as progress:
                results = run_path(a, b, method, options, out, dataset=dataset, data=data, limit_train=limit_train,
                                   budget=budget, eval_limit=eval_limit, sub_points=sub_points, seed=seed,
                                   resume=resume, overwrite=overwrite, continuity_tol=continuity_tol, log=log,
                                   progress=two_arg(progress, "search / evaluation"))
        except KeyboardInterrupt:
            from ..recipes.path import interrupted_note

            console.print(interrupted_note(out, method), style="bold yellow", markup=False)
            raise typer.Exit(code=130) from None
    console.print(report_text(results["headline"]), style=None if results["complete"] else "bold red", markup=False)
    written(out, "path/, results.json, report.md, path_loss.png")
    if not results["complete"]:
        raise typer.Exit(code=INCOMPLETE_EXIT_CODE)
