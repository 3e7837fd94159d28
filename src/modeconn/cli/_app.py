"""The typer app and what every command shares: the console, errors, option parsing, the output check, progress."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from ..errors import ModeconnError
from ._help import App, Group

DATA_HELP = "data directory (default: $MODECONN_DATA, else shared/data; docs: Data)"
DOWNLOAD_HELP = "download MNIST / Fashion-MNIST if missing (SHA-256 verified)"
RESTARTS_HELP = "weight: the most runs (default 1)"
MAX_ITER_HELP = "weight: the most sweeps per run (default 100)"
DEVICE_HELP = "cpu (default), cuda, mps …"
OVERWRITE_HELP = "replace a non-empty --out that modeconn wrote"
METHOD_OPTION_HELP = "a method setting key=value, repeatable; the settings: modeconn list settings METHOD"
DATASET_HELP = "a dataset (modeconn list datasets) or the PATH of your data (docs: Data); default: the checkpoint's"


app = App(
    cls=Group,
    help="modeconn: mode connectivity for PyTorch — align, interpolate, measure barriers, merge.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(soft_wrap=True, log_path=False)  # no "file:line" column in log lines


def _show_version(value: bool) -> None:
    if value:
        from .. import __version__

        console.print(f"modeconn {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """modeconn: mode connectivity for PyTorch — align, interpolate, measure barriers, merge."""

def data_option() -> Any:
    return typer.Option(None, "--data", help=DATA_HELP)


def download_option() -> Any:
    return typer.Option(False, "--download", help=DOWNLOAD_HELP)


def overwrite_option(help: str = OVERWRITE_HELP) -> Any:
    return typer.Option(False, "--overwrite", help=help)


def fail(err: Exception) -> None:
    """Print ``err`` and exit with status 2 (the status of every refused input)."""
    console.print(f"[bold red]error:[/] {escape(str(err))}")  # messages may hold brackets: modeconn[ray], x[.gz]
    raise typer.Exit(code=2)


@contextmanager
def errors_exit(download: bool = False) -> Iterator[None]:
    """Turn a :class:`ModeconnError` raised inside the block into ``error: …`` and exit status 2; with ``download``
    (the ``--download`` flag) missing MNIST / Fashion-MNIST files are downloaded inside the block."""
    from ..data.locate import downloads_allowed

    try:
        with downloads_allowed(download):
            yield
    except ModeconnError as err:
        fail(err)


def log(message: str) -> None:
    console.log(message)


def parse_kv(items: list[str], what: str) -> dict[str, Any]:
    """``["k=v", …]`` → ``{k: json-or-string v}``; BadParameter naming ``what`` for an item without ``=``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} must look like key=value, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def check_out(out: Path | None, inputs, overwrite: bool) -> None:
    """Before any work: --out must not be, contain or lie inside an input, and a non-empty --out is replaced only
    with --overwrite and only if modeconn wrote it (ConfigError naming the reason)."""
    from .._util.outdir import check_output_target

    if out is not None:
        check_output_target(out, inputs=[p for p in inputs if p is not None], overwrite=overwrite)


def task_list(tasks: str | None) -> tuple[str, ...]:
    """``--tasks``/``--eval``'s comma-separated lm-eval task names (None or blank: none)."""
    return tuple(t.strip() for t in (tasks or "").split(",") if t.strip())


def written(out: Path, contents: str, what: str = "outputs") -> None:
    console.print(f"[bold green]{what} written to[/] {escape(str(Path(out).resolve()))}  ({escape(contents)})")


@contextmanager
def progress_bar(enabled: bool = True, log_every_s: float = 10.0):
    """The one progress adapter: yields ``progress(stage, done, total, **metrics)`` (the protocol of
    :mod:`modeconn.match.progress`), one bar per stage with its metrics, elapsed time and ETA; without a terminal
    (a log file, CI) a plain log line every ``log_every_s`` seconds (across stages: a hundred short weight-matching
    sweeps make no hundred lines) and at the end of a stage that lasted that long. Yields None when not
    ``enabled`` (ranks other than 0)."""
    if not enabled:
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[metrics]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        state: dict[str, Any] = {}

        def update(stage: str, done: int, total: int | None = None, **metrics: Any) -> None:
            now = time.monotonic()
            if state.get("stage") != stage or done < state.get("done", 0):
                if "task" in state:
                    bar.remove_task(state["task"])
                state.update(stage=stage, task=bar.add_task(stage, total=total, metrics=""), start=now)
                state.setdefault("logged", now)
            text = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
            state["done"] = done
            bar.update(state["task"], completed=done, total=total, metrics=text)
            ended = done == total and now - state["start"] >= log_every_s  # a short stage's end is no news
            if not console.is_terminal and (now - state["logged"] >= log_every_s or ended):
                state["logged"] = now
                eta = (now - state["start"]) / max(done, 1) * max((total or done) - done, 0)
                share = f" ({100 * done / total:.0f}%)" if total else ""
                console.log(f"{stage}: {done}/{total if total is not None else '?'}{share} {text} "
                            f"({now - state['start']:.0f} s elapsed, ETA {eta:.0f} s)")

        yield update

