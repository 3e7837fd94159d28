"""The options of the user's own data (``--split``, ``--text-field``, ``--label-field``, ``--context-length``, the seed of the held-out
split), set once by the command line around a command (:func:`user_data_options`) and read where the data is loaded —
the same pattern as :func:`~modeconn.data.locate.downloads_allowed`, so no recipe signature carries them."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import ConfigError

#: Share of the user's data held out (seeded) when no split of theirs is named.
DEFAULT_HELDOUT_FRACTION = 0.1


@dataclass(frozen=True)
class UserDataOptions:
    """How the user's data is read.

    Attributes:
        split: the held-out split: a split name of a ``save_to_disk`` directory, or a second file in the same format;
            None: a seeded ``heldout_fraction`` of the data (image folders: a ``test``/``val`` sub-folder when there
            is one).
        text_field: the column of ``.jsonl``/``.json``/``.csv``/``.parquet``/saved data that holds the text.
        label_field: the column holding each text's label, read for sequence classifiers (an integer class index or
            a name of the model's ``id2label``).
        context_length: tokens per block; None: ``min(128, max_position_embeddings)``.
        heldout_fraction: share held out when no split is named, in ``(0, 1)``.
        seed: seed of that held-out choice (the command's ``--seed``).
    """

    split: str | None = None
    text_field: str = "text"
    label_field: str = "label"
    context_length: int | None = None
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ConfigError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction!r}")
        if self.context_length is not None and self.context_length < 1:
            raise ConfigError(f"--context-length must be a positive integer, got {self.context_length!r}")

    def given(self) -> list[str]:
        """The command-line options set to something other than their default (for refusing them by name)."""
        return [flag for flag, value, default in (("--split", self.split, None), ("--text-field", self.text_field, "text"),
                                                  ("--label-field", self.label_field, "label"),
                                                  ("--context-length", self.context_length, None))
                if value != default]


_OPTIONS: contextvars.ContextVar[UserDataOptions] = contextvars.ContextVar("user_data_options",
                                                                          default=UserDataOptions())


@contextmanager
def user_data_options(options: UserDataOptions) -> Iterator[UserDataOptions]:
    """Within this block the user's data is read with ``options``."""
    token = _OPTIONS.set(options)
    try:
        yield options
    finally:
        _OPTIONS.reset(token)


def current_user_data_options() -> UserDataOptions:
    """The options set by the innermost :func:`user_data_options` block (defaults outside any)."""
    return _OPTIONS.get()
