"""Robustness suite (issue #9): one regression module per failure class; tiny models, one thread."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _robustness_one_thread(one_thread):
    """Every module of this directory runs single-threaded (tiny models; the CI machine is shared)."""
    yield
