"""Markdown reports made to read in a terminal of a given width (80 columns by default).

Tables narrow enough are aligned in columns; wider ones are *stacked*: one block per row, its first cell as the
heading and one ``column: value`` line per other cell, so no header or value is ever truncated. Prose lines and
list items are wrapped at the width (list items keep a hanging indent); figure links are dropped.
"""

from __future__ import annotations

import textwrap

WIDTH = 80
"""The width every printed report and table is made to fit (a terminal's default, and a log file's)."""


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_rule(line: str) -> bool:
    return set(line.replace("|", "").replace(":", "").replace("-", "").strip()) == set() and "-" in line


def wrap(line: str, width: int = WIDTH, hang: str | None = None) -> list[str]:
    """``line`` wrapped at ``width``; continuation lines get ``hang`` (default: the line's own indent, plus two
    spaces for a list item ``- ``)."""
    body = line.lstrip()
    indent = line[: len(line) - len(body)]
    hang = hang if hang is not None else indent + ("  " if body.startswith(("- ", "* ")) else "")
    return textwrap.wrap(body, width, initial_indent=indent, subsequent_indent=hang, break_long_words=True,
                         break_on_hyphens=False) or [""]


def table_lines(header: list[str], rows: list[list[str]], width: int = WIDTH) -> list[str]:
    """A table as aligned columns if it fits ``width``, else stacked (one block per row); every line ≤ ``width``."""
    widths = [max(len(str(r[i])) if i < len(r) else 0 for r in [header, *rows]) for i in range(len(header))]
    if sum(widths) + 2 * (len(widths) - 1) <= width:
        fmt = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=False)).rstrip()  # noqa: E731
        return [fmt(header), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)]
    out: list[str] = []
    for r in rows:
        out += wrap(f"{header[0]}: {r[0]}" if header[0] else str(r[0]), width)
        for name, value in zip(header[1:], r[1:], strict=False):
            out += wrap(f"    {name}: {value}", width)
    return out


def fit_markdown(text: str, width: int = WIDTH) -> str:
    """``text`` (markdown) rewritten so that no line is longer than ``width``: tables aligned or stacked
    (:func:`table_lines`), other lines wrapped (:func:`wrap`), image lines (``![…](…)``) dropped."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("|") and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            j = i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            out += table_lines(_cells(line), [_cells(r) for r in lines[i + 2:j]], width)
            i = j
            continue
        if not line.lstrip().startswith("!["):
            out += wrap(line, width) if len(line) > width else [line]
        i += 1
    return "\n".join(out)
