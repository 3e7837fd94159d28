"""The tables the commands print: compact enough to read at 80 columns, abbreviations explained under them (the
full tables, with every column spelled out, are in report.md)."""

from __future__ import annotations

from collections.abc import Mapping

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..report.tables import FLAT_MARK, FLAT_NOTE, TERMINAL_KEYS, Column, barrier_cells, column, flat_at_endpoint, legend
from ..report.terminal import WIDTH, fit_markdown, wrap

MERGED = Column("merged_acc", "merged acc", "merged\nacc",
                "accuracy of the midpoint merge of A and aligned B (BatchNorm re-estimated)", percent=True)


def _legend_text(lines: list[str]) -> Text:
    return Text("\n".join(w for line in lines for w in wrap(line, WIDTH, hang="    ")), style="dim")


def barrier_table(summaries: Mapping[str, Mapping], merged: Mapping[str, Mapping], split: str = "test",
                  examples: str = "") -> Group:
    """Barriers of every method on ``split``: ``summaries`` method → :meth:`Curve.summary` (all splits),
    ``merged`` method → split → metrics of the midpoint merge; ``examples`` says what was evaluated (e.g. "all 360
    test examples"). Abbreviated headers and method names, with a legend; fits 80 columns."""
    from ..diagnostics.compare import method_labels

    labels = method_labels()

    title = f"barriers on the {split} split" + (f" ({examples})" if examples else "")
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("method", no_wrap=True)
    for c in (*map(column, TERMINAL_KEYS), MERGED):
        table.add_column(c.short, justify="right", no_wrap=True)
    flat = []
    for m, s in summaries.items():
        table.add_row(m, *barrier_cells(s[split], TERMINAL_KEYS), MERGED.cell(merged[m][split]["acc"]))
        if flat_at_endpoint(s[split]):
            flat.append(m)
    notes = legend([*map(column, TERMINAL_KEYS), MERGED], short=True)
    named = [f"{m} = {labels[m]}" for m in summaries if labels.get(m, m) != m]
    if named:
        notes.append("methods: " + "; ".join(named))
    if flat:
        notes.append(f"{FLAT_MARK} {', '.join(flat)}: {FLAT_NOTE}")
    return Group(table, _legend_text(notes), Text(""))


def comparison_table(results: Mapping, split: str = "test") -> Group:
    """:func:`barrier_table` of a demo / barrier ``results.json`` dict (``barriers``, ``midpoint_merge``,
    ``evaluated``)."""
    evaluated = results.get("evaluated", {}).get(split)
    return barrier_table(results["barriers"], results["midpoint_merge"], split, examples=evaluated or "")


def report_text(markdown: str) -> str:
    """A markdown report as printed: tables aligned or stacked and prose wrapped to 80 columns."""
    return fit_markdown(markdown, WIDTH)
