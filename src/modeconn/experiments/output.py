"""Atomic result directories: everything is written into a temporary sibling and renamed into place."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._util.outdir import output_directory as _owned_output_directory
from .._util.jsonio import to_json


def default_out(kind: str) -> Path:
    """``runs/<kind>-YYYYmmdd-HHMMSS`` under the current directory."""
    return Path("runs") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


@contextmanager
def output_directory(out: str | os.PathLike, overwrite: bool = False, *, inputs: Iterable[str | os.PathLike] = (),
                     command: str = "") -> Iterator[Path]:
    """Yield a temporary directory; on success it becomes ``out`` (one atomic swap), on error it is removed
    and a previous ``out`` is left in place, untouched (:func:`modeconn._util.outdir.output_directory`).

    Checked before any work: ``out`` must not be, contain or lie inside an input; an existing non-empty ``out`` is
    replaced only with ``overwrite`` and only if modeconn wrote it. Raises ConfigError otherwise.
    """
    with _owned_output_directory(out, inputs=inputs, overwrite=overwrite, command=command) as tmp:
        yield tmp


def write_json(path: Path, payload: Any) -> Path:
    """Results as strict JSON (measured NaN/Inf, a diverged run's, → null; numpy → lists, paths → strings) written
    to ``path`` — a file inside the directory :func:`output_directory` assembles, which is what makes it atomic."""
    path.write_text(to_json(payload, str(path), nan="null"))
    return path


def write_results(tmp: Path, results: dict[str, Any], report: Callable[[dict[str, Any]], str], start: float) -> dict:
    """Record the wall time since ``start`` (``time.perf_counter()``) as ``results["seconds"]``, then write
    ``results.json`` and ``report.md`` (``report(results)``) into ``tmp``; returns ``results``."""
    results["seconds"] = time.perf_counter() - start
    write_json(tmp / "results.json", results)
    (tmp / "report.md").write_text(report(results))
    return results
