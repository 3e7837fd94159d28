"""Endless batch iteration over a re-iterable loader (learned and dual matching).

:func:`endless` re-iterates the loader at the start of every epoch — ``iter(loader)`` again, so a shuffling
``DataLoader`` draws a fresh order each epoch and nothing holds an epoch in memory (``itertools.cycle`` caches the
first epoch's batches and replays them, shuffle included).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from ..errors import ConfigError

T = TypeVar("T")


def endless(loader: Iterable[T], *, skip: int = 0, what: str = "the loader") -> Iterator[T]:
    """The batches of ``loader`` epoch after epoch (``iter(loader)`` once per epoch), the first ``skip`` left out.

    Args: ``loader``: a re-iterable of batches (a DataLoader, a list …); ``skip``: batches to drop first (a resumed
        run skips the ones it consumed; ≥ 0); ``what``: names the caller in errors.
    Raises: ConfigError (when the batch is requested) if an epoch yields no batch: an empty loader, or a one-shot
        iterator that ran out.
    """
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
        raise ConfigError(f"skip must be an int ≥ 0, got {skip!r}")
    seen = 0
    epoch = 0
    while True:
        empty = True
        for batch in loader:
            empty = False
            seen += 1
            if seen > skip:
                yield batch
        if empty:
            if epoch and iter(loader) is loader:  # an iterator, not a re-iterable loader
                raise ConfigError(f"{what}: the loader is a one-shot iterator and ran out after {seen} batches; "
                                  "pass a re-iterable loader (a DataLoader or a list of batches)")
            raise ConfigError(f"{what} got an empty loader (no batches)")
        epoch += 1
