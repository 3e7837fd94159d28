"""``modeconn experiment``: its choices and help come from :data:`modeconn.experiments.EXPERIMENTS`."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (app, check_out, console, data_option, download_option, errors_exit, log, overwrite_option, written)
from ._help import live_help
from .tables import report_text


def _name_help() -> str:
    """The experiments registered when help is shown (:func:`~._app.live_help`)."""
    from ..experiments import EXPERIMENTS

    return "experiment: " + ", ".join(EXPERIMENTS) + " (modeconn list experiments)"


@app.command(cls=live_help(name=_name_help))
def experiment(
    name: str = typer.Argument(..., help=_name_help()),
    quick: bool = typer.Option(False, "--quick", help="the small CI size instead of the full size"),
    size: str | None = typer.Option(None, "--size", metavar="NAME",
                                    help="a named size: quick, full (default) or one the experiment adds"),
    pairs: int | None = typer.Option(None, min=1, help="model pairs per setting (default: 1 quick, 3 full)"),
    epochs: int | None = typer.Option(None, min=1, help="training epochs per model (default per experiment)"),
    width: int | None = typer.Option(None, min=1, help="hidden width of the models (default per experiment)"),
    limit_train: int | None = typer.Option(None, min=1, help="training examples per model (default per size)"),
    data: Path | None = data_option(),
    download: bool = download_option(),
    out: Path | None = typer.Option(None, help="output directory (default runs/<name>-<time>)"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Run a registered experiment (modeconn list experiments); writes results.json, report.md and its figures.

    Docs: Results (the generated reports) and Extending modeconn (adding an experiment).
    """
    from ..experiments import EXPERIMENTS
    from ..experiments.output import default_out

    with errors_exit(download):
        exp = EXPERIMENTS.get(name)
        settings = dict(pairs=pairs, epochs=epochs, width=width, limit_train=limit_train)
        exp.size(quick, size, **settings)  # an unknown size or a setting that does not apply fails before any work
        out = out or default_out(name)
        check_out(out, [data], overwrite)
        with console.status(f"running {name}"):
            results = exp(out, quick=quick, size_name=size, data=data, overwrite=overwrite, log=log, **settings)
    console.print(report_text(exp.report(results).split("![")[0]), markup=False)  # tables fitted to 80 columns
    written(out, ", ".join(exp.outputs))
