"""``modeconn sweep``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from ._app import app, console, errors_exit, log
from .tables import report_text


@app.command()
def sweep(
    config: Path = typer.Argument(..., help="sweep file (TOML or JSON): name, task, \\[base], \\[grid]"),
    out: Path | None = typer.Option(None, help="sweep directory (default runs/sweep-<name>); rerun to resume"),
    backend: str = typer.Option("auto", help="auto (Ray if installed), ray, or sequential"),
    address: str | None = typer.Option(None, help="Ray cluster address (default: a local ray.init())"),
    cpus_per_run: float = typer.Option(1.0, min=0.01, help="CPUs Ray reserves per run"),
) -> None:
    """Run a grid of runs (seeds × widths × methods …) and aggregate the results into one table.

    The whole grid is checked before the first run starts: a typo names the key, a value that is not a finite
    number names the key and value, every grid point's data and model are checked (without training), and two grid
    points that are the same run (seed = [0, 0]) are refused. Each run
    writes runs/<run-id>/result.json atomically; rerunning with the same --out skips finished runs.
    Writes results.json, results.csv and report.md (every run, and mean ± std with n over the grid's seed axis;
    the barrier task's seed s trains the independent pair of init seeds 2s, 2s + 1) and prints the table over
    seeds. Ray is optional: pip install 'modeconn\\[ray]'.
    """
    from ..recipes.sweep import aggregated_table, read_sweep_config, run_sweep

    with errors_exit():
        cfg = read_sweep_config(config)
        out = out or Path("runs") / f"sweep-{cfg.name}"
        with console.status(f"sweep {cfg.name}"):
            results = run_sweep(cfg, out, backend=backend, address=address, cpus_per_run=cpus_per_run, log=log)
    table = aggregated_table(results["over_seeds"], cfg.base)
    console.print(report_text(f"Over seeds (mean ± std, n; full tables in report.md):\n\n{table}"), markup=False)
    console.print(f"[bold green]{len(results['rows'])} runs aggregated in[/] {escape(str(out.resolve()))}  "
                  "(results.json, results.csv, report.md, runs/)")
