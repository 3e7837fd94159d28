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
    }


def write_json(name: str, payload: dict) -> Path:
    """Write ``benchmarks/results/<name>.json`` atomically and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    fd, tmp = tempfile.mkstemp(dir=RESULTS, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"environment": environment(), **payload}, f, indent=2)
    os.replace(tmp, path)
    return path
