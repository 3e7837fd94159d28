"""Markdown tables of barriers (every number labelled with its barrier definition)."""

from __future__ import annotations

from collections.abc import Mapping

from ..path import Curve

COLUMNS = [
    ("barrier_mean_loss", "barrier_mean (loss)"),
    ("barrier_interp_loss", "barrier_interp (loss)"),
    ("peak_loss", "peak (loss)"),
    ("barrier_mean_error", "barrier_mean (error)"),
    ("midpoint_acc", "midpoint acc"),
    ("accuracy_drop_pct", "rel. acc. drop %"),
]


def barrier_table(curves: Mapping[str, Curve], split: str) -> str:
    """One row per method with every barrier form on ``split``."""
    head = "| method | " + " | ".join(c for _, c in COLUMNS) + " |"
    sep = "|---|" + "---:|" * len(COLUMNS)
    rows = []
    for label, curve in curves.items():
        s = curve.summary()[split]
        cells = [f"{100 * s[k]:.2f}%" if k == "midpoint_acc" else f"{s[k]:.4f}" for k, _ in COLUMNS]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join([head, sep, *rows])


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A plain markdown table."""
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
