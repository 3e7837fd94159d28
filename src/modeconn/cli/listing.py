"""``modeconn list``: the registries (methods, rules, path methods, families, checkpoint kinds, experiments) and one
method's settings, printed from :mod:`modeconn.recipes.registries` (the same sections as the docs' reference)."""

from __future__ import annotations

import typer

from ._app import app, console, errors_exit
from .tables import report_text


def _kinds() -> str:
    from ..recipes.registries import LISTINGS

    return ", ".join(LISTINGS.names())


@app.command("list")
def list_command(
    kind: str = typer.Argument(..., help=f"what to list: {_kinds()}"),
    name: str | None = typer.Argument(None, help="with settings: an alignment or path method (e.g. weight, llpf)"),
) -> None:
    """List what a registry holds, or one method's -o settings with their defaults.

    Examples: modeconn list rules; modeconn list settings llpf.
    """
    from ..recipes.registries import listing

    with errors_exit():
        text = listing(kind, name)
    console.print(report_text(text.replace("`", "")), markup=False, highlight=False)
