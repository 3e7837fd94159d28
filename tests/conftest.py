"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared real-data directory: ``$MODECONN_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("MODECONN_DATA")
    if env:
        return Path(env).expanduser().resolve()
    return (Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve()
