"""``modeconn demo``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import app, check_out, console, errors_exit, log, overwrite_option, written
from .tables import comparison_table


@app.command()
def demo(
    out: Path | None = typer.Option(None, help="output directory (default runs/demo-<time>)"),
    overwrite: bool = overwrite_option(),
    epochs: int | None = typer.Option(None, min=1, help="training epochs per model (default 40)"),
    seed_a: int = typer.Option(0, help="seed of model A"),
    seed_b: int = typer.Option(1, help="seed of model B"),
) -> None:
    """The main job (offline): two MLPs on the bundled digits, naive vs aligned barriers, midpoint merge.

    Trains two 3×512 MLPs from different seeds on scikit-learn's digits, measures the naive barrier,
    aligns B to A with weight matching and with activation matching, measures again and merges at the
    midpoint. Writes results.json, report.md, barrier.png and both checkpoints (models/A, models/B).
    """
    from ..recipes.demo import run_demo
    from ..experiments.output import default_out

    out = out or default_out("demo")
    with errors_exit():
        check_out(out, [], overwrite)
        with console.status("running the demo"):
            _, results = run_demo(out, seeds=(seed_a, seed_b), epochs=epochs, overwrite=overwrite, log=log,
                                  progress=False)
    console.print(comparison_table(results))
    written(out, "report.md, results.json, barrier.png, models/")
