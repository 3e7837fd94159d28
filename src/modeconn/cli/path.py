"""``modeconn path``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (DATASET_HELP, app, check_out, console, data_option, download_option, errors_exit, log,
                   overwrite_option, parse_kv, progress_bar, written)
from ._help import live_help
from ._user_data import reads_user_data
from .tables import report_text


def _method_help() -> str:
    from ..path.methods import PATH_METHODS

    return "path method: " + ", ".join(m.name for m in PATH_METHODS.entries()) + " (modeconn list path-methods)"


@app.command("path", cls=live_help(method=_method_help))
@reads_user_data
def path_command(
    a: Path = typer.Argument(..., help="checkpoint directory of model A (the path's start)"),
    b: Path = typer.Argument(..., help="checkpoint directory of model B (the path's end)"),
    method: str = typer.Option("llpf", help=_method_help()),
    option: list[str] = typer.Option([], "--option", "-o", help="a method setting key=value, repeatable (e.g. -o "
                                     "ticks=200); the settings: modeconn list settings METHOD"),
    budget: int | None = typer.Option(None, min=1, help="the most gradient evaluations; every method's schedule "
                                      "scales to it (default 5000: minutes on small models; try 20000+ for a "
                                      "low-loss LLPF path on a CNN)"),
    dataset: str | None = typer.Option(None, help=DATASET_HELP),
    data: Path | None = data_option(),
    download: bool = download_option(),
    limit_train: int | None = typer.Option(None, min=1, help="use only the first N training examples"),
    eval_limit: int | None = typer.Option(2000, min=1, help="evaluate on the first N examples of each split"),
    sub_points: int = typer.Option(3, min=0, help="continuity check: linear sub-points per segment"),
    continuity_tol: float = typer.Option(0.05, min=0.0, help="continuity check: the most a sub-point may rise above "
                                         "its segment's ends (nats)"),
    seed: int = typer.Option(0, help="seed of the BatchNorm recalibration batches"),
    out: Path | None = typer.Option(None, help="output directory (default runs/path-<time>)"),
    resume: bool = typer.Option(False, "--resume", help="continue a killed LLPF search for --out"),
    overwrite: bool = overwrite_option("replace a non-empty --out (and an interrupted search for it)"),
) -> None:
    """Find a low-loss path from A to B and evaluate it.

    Writes the path (path/, loadable with modeconn.path.Path.load), results.json (loss and accuracy at every
    point, continuity check, peak loss, length, gradient evaluations), report.md and path_loss.png. LLPF
    checkpoints as it runs: rerun a killed search with --resume. The straight line A → B is shown beside the path,
    which is called low-loss when its peak is within 0.1 nats of the endpoints. Docs: the Low-loss paths guide.

    Exit status: 0 for a complete path (it reaches B and every segment passes the continuity check), 3 for an
    incomplete one (outputs still written, saying why), 2 for an error, 130 when interrupted.
    """
    from ..experiments.output import default_out
    from ..recipes.path import INCOMPLETE_EXIT_CODE, path as run_path

    out = out or default_out("path")
    with errors_exit(download):
        check_out(out, [a, b, data], overwrite or resume)  # --resume continues modeconn's own run there
        options = parse_kv(option, "--option")
        try:
            with progress_bar() as progress:
                stage = {"name": "search"}
                results = run_path(a, b, method, options, out, dataset=dataset, data=data, limit_train=limit_train,
                                   budget=budget, eval_limit=eval_limit, sub_points=sub_points, seed=seed,
                                   resume=resume, overwrite=overwrite, continuity_tol=continuity_tol, log=log,
                                   progress=lambda done, total: progress(stage["name"], done, total),
                                   on_stage=lambda name: stage.update(name=name))
        except KeyboardInterrupt:
            from ..recipes.path import interrupted_note

            console.print(interrupted_note(out, method), style="bold yellow", markup=False)
            raise typer.Exit(code=130) from None
    console.print(report_text(results["headline"]), style=None if results["complete"] else "bold red", markup=False)
    written(out, "path/, results.json, report.md, path_loss.png")
    if not results["complete"]:
        raise typer.Exit(code=INCOMPLETE_EXIT_CODE)
