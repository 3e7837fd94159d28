"""Printing a recipe's :class:`~modeconn.recipes.outcome.Outcome`."""

from __future__ import annotations

from ._app import console, written


def show(outcome) -> None:
    """The outcome's summary lines, then where its outputs went (nothing for a quiet outcome)."""
    if outcome.quiet:
        return
    for line in outcome.lines:
        console.print(line, markup=False)
    written(outcome.out, outcome.contents, outcome.what)
