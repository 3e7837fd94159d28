"""Helpers for benchmark scripts: timing and atomic JSON output (benchmarks are never unit tests)."""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_1_5_15_min": list(os.getloadavg()),
    }


def write_json(name: str, payload: dict, path: str | Path | None = None) -> Path:
    """Write ``benchmarks/results/<name>.json`` (or ``path``) atomically and return its path."""
    path = Path(path) if path is not None else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"environment": environment(), **payload}, f, indent=2)
    os.replace(tmp, path)
    return path
