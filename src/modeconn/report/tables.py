"""Barrier tables: one column registry for the full markdown table (``report.md``) and the compact terminal table.

Every number is labelled with its barrier definition: the markdown table uses the full names, the terminal table
(which must read at 80 columns) abbreviates them and prints :func:`legend` under it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..path import Curve


@dataclass(frozen=True)
class Column:
    """One barrier column: ``key`` of :meth:`Curve.summary`, full ``name`` (report.md), ``short`` header for the
    terminal (at most 8 characters a line), ``definition`` (the legend) and how the value prints."""

    key: str
    name: str
    short: str
    definition: str
    percent: bool = False  # a fraction printed as a percentage

    def cell(self, value: float) -> str:
        return f"{100 * value:.2f}%" if self.percent else f"{value:.4f}"


COLUMNS: tuple[Column, ...] = (
    Column("barrier_mean_loss", "barrier_mean (loss)", "B_mean\nloss",
           "max_λ L(λ) − ½(L(A) + L(B)) (Frankle et al. 2020)"),
    Column("barrier_interp_loss", "barrier_interp (loss)", "B_interp\nloss",
           "max_λ [L(λ) − ((1−λ)L(A) + λL(B))] (Entezari et al. 2022)"),
    Column("peak_loss", "peak (loss)", "peak\nloss", "max_λ L(λ)"),
    Column("barrier_mean_error", "barrier_mean (error)", "B_mean\nerror",
           "max_λ E(λ) − ½(E(A) + E(B)) on the error E = 1 − accuracy"),
    Column("midpoint_acc", "midpoint acc", "acc\nλ=½", "accuracy of the path's point at λ = ½", percent=True),
    Column("accuracy_drop_pct", "rel. acc. drop %", "acc drop\n%",
           "100 · (max(acc(A), acc(B)) − min_λ acc(λ)) / max(acc(A), acc(B))"),
)
"""Every barrier column, in table order (report.md shows all of them)."""

TERMINAL_KEYS = ("barrier_mean_loss", "barrier_interp_loss", "peak_loss", "barrier_mean_error", "midpoint_acc")
"""The columns the commands print (the rest is in report.md)."""

FLAT_MARK = "*"
FLAT_NOTE = ("barrier_mean is attained at an endpoint (the path never rises above its higher end), so it is only "
             "½|L(A) − L(B)|, half the endpoint difference, not a barrier; barrier_interp is the informative number")


def column(key: str) -> Column:
    """The column of ``key`` (KeyError naming the valid keys)."""
    for c in COLUMNS:
        if c.key == key:
            return c
    raise KeyError(f"unknown barrier column {key!r}; valid: {', '.join(c.key for c in COLUMNS)}")


def flat_at_endpoint(summary: Mapping[str, float]) -> bool:
    """True when the path's highest loss is an endpoint's (one split of :meth:`Curve.summary`): then
    ``barrier_mean = ½|L(A) − L(B)|`` only measures the endpoints' difference."""
    return summary["peak_loss"] <= max(summary["endpoint_loss"])


def barrier_cells(summary: Mapping[str, float], keys: tuple[str, ...]) -> list[str]:
    """The formatted values of ``keys`` for one split of a summary; barrier_mean (loss) of a path whose peak is an
    endpoint carries :data:`FLAT_MARK`."""
    cells = []
    for key in keys:
        text = column(key).cell(summary[key])
        if key == "barrier_mean_loss" and flat_at_endpoint(summary):
            text += FLAT_MARK
        cells.append(text)
    return cells


def legend(columns: Sequence[Column], *, short: bool) -> list[str]:
    """One definition per column, ``name = definition``, prefixed by the terminal's abbreviation when ``short``,
    then the units."""
    lines = [(f"{c.short.replace(chr(10), ' ')}: " if short else "") + f"{c.name} = {c.definition}" for c in columns]
    lines.append("L = mean cross-entropy (nats) on the evaluated examples; error = 1 − accuracy.")
    return lines


def definitions() -> str:
    """The markdown list defining every column of :data:`COLUMNS` and the endpoint-attained mark."""
    return "\n".join([f"- {line}" for line in legend(COLUMNS, short=False)]
                     + [f"- `{FLAT_MARK}` after a barrier_mean (loss) value: {FLAT_NOTE}."])


def barrier_table(curves: Mapping[str, Curve], split: str) -> str:
    """The full markdown table: one row per method (label → Curve), every column of :data:`COLUMNS` on ``split``,
    and under it, where it happens, the note naming the rows whose barrier_mean is attained at an endpoint (the
    column definitions: :func:`definitions`)."""
    head = "| method | " + " | ".join(c.name for c in COLUMNS) + " |"
    sep = "|---|" + "---:|" * len(COLUMNS)
    keys = tuple(c.key for c in COLUMNS)
    rows, flat = [], []
    for label, curve in curves.items():
        s = curve.summary()[split]
        rows.append(f"| {label} | " + " | ".join(barrier_cells(s, keys)) + " |")
        if flat_at_endpoint(s):
            flat.append(label)
    note = ["", f"`{FLAT_MARK}` {', '.join(flat)}: {FLAT_NOTE}."] if flat else []
    return "\n".join([head, sep, *rows, *note])


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A plain markdown table."""
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
