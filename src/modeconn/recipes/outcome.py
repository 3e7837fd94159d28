"""What a recipe hands back to the command line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Outcome:
    """``out`` (the directory written), ``contents`` (what it holds, for the "written to" line), ``lines`` (the
    summary to print first), ``what`` (the noun: "aligned checkpoint", …) and ``quiet`` (print nothing: a rank other
    than 0 of a multi-process run)."""

    out: Path
    contents: str
    lines: tuple[str, ...] = ()
    what: str = "outputs"
    quiet: bool = False
