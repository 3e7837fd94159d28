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


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads (and the CI machine is shared): one thread per module."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
