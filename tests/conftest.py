"""Shared pytest fixtures, and the check, at session start, that the shared data sets are where the tests look."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TEST_DATASETS = ("mnist", "fashion-mnist", "austen", "minilm")
"""The data sets the tests read from the shared data directory (``$MODECONN_DATA``)."""
MISSING_DATA_EXIT = pytest.ExitCode.USAGE_ERROR
"""pytest's exit status when the shared data directory lacks :data:`TEST_DATASETS`."""


def _data_parents() -> list[tuple[str, Path]]:
    """``(origin, directory)`` where the data is looked for, as :mod:`modeconn.data.locate` does: ``$MODECONN_DATA``
    when set, else its defaults (``shared/data`` beside the checkout, then ``../shared/data``)."""
    from modeconn.data.locate import ENV_VAR, default_data_roots

    env = os.environ.get(ENV_VAR)
    if env:
        return [(f"${ENV_VAR}", Path(env).expanduser().resolve())]
    return [(f"${ENV_VAR} unset: {origin}", parent) for origin, parent in default_data_roots()]


def _missing(parent: Path) -> list[str]:
    """The data sets of :data:`TEST_DATASETS` that :func:`~modeconn.data.locate.find_data_dir` does not find in
    ``parent``."""
    from modeconn.data.locate import find_data_dir
    from modeconn.errors import DataError

    missing = []
    for name in TEST_DATASETS:
        try:
            find_data_dir(name, parent, download=False)
        except DataError:
            missing.append(name)
    return missing


def find_test_data() -> tuple[Path | None, list[str]]:
    """The first data directory of :func:`_data_parents` holding every data set of :data:`TEST_DATASETS` (None if
    none does), and what each directory looked at before it lacks."""
    looked = []
    for origin, parent in _data_parents():
        if not parent.is_dir():
            looked.append(f"{parent} ({origin}): no such directory")
            continue
        missing = _missing(parent)
        if not missing:
            return parent, looked
        looked.append(f"{parent} ({origin}): missing " + ", ".join(missing))
    return None, looked


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop at once, naming the directory looked at, when the shared data is not there (instead of failing every
    test that reads it)."""
    from modeconn.data.locate import expected_layout

    found, looked = find_test_data()
    if found is None:
        pytest.exit("the tests need the shared data sets " + ", ".join(TEST_DATASETS) + "; looked in:\n  "
                    + "\n  ".join(looked) + "\nExpected in that directory: "
                    + "; ".join(expected_layout(n) for n in TEST_DATASETS) + ".\nTo fix: clone the repository beside "
                    "shared/ as the README says (so that ../shared/data exists), or set "
                    "MODECONN_DATA=/path/to/shared/data.", returncode=MISSING_DATA_EXIT)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared real-data directory: ``$MODECONN_DATA``, or its default holding the data (checked at session
    start)."""
    return find_test_data()[0]


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads (and the CI machine is shared): one thread per module."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
