"""What a ``--dataset`` value means: a registered name, or a path to the user's own data.

Every command resolves its ``--dataset`` through :func:`user_data_path` (and :func:`~modeconn.data.load_dataset`
through it too), so the rule is one rule everywhere:

1. a registered name (``digits``, ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``, ``austen``) stays a
   registered name;
2. an existing file or directory is the user's data;
3. a value that looks like a path — it holds a path separator, ends in a file suffix (``corpus.jsonl``), or
   starts with ``.`` or ``~`` — but does not exist is a :class:`~modeconn.errors.DataError` naming it. It never
   falls back to a registered name;
4. anything else is a (mistyped) name, refused later with the list of valid names.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DataError


def registered_names() -> tuple[str, ...]:
    """The registered dataset names (images and text)."""
    from .datasets import DATASETS
    from .text import TEXT_DATASETS

    return tuple(DATASETS.names()) + tuple(TEXT_DATASETS.names())


def looks_like_path(value: str) -> bool:
    """True if ``value`` reads as a file-system path rather than a dataset name (see the module docstring)."""
    seps = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return any(s in value for s in seps) or value.startswith((".", "~")) or bool(Path(value).suffix)


def user_data_path(value: str | os.PathLike | None) -> Path | None:
    """The path of the user's data named by ``value``, or None when ``value`` is None or a dataset name.

    Raises:
        DataError: ``value`` looks like a path but nothing exists there (the path is named, resolved).
    """
    if value is None:
        return None
    text = os.fspath(value)
    if text in registered_names():
        return None
    path = Path(text).expanduser()
    if path.exists():
        return path
    if looks_like_path(text):
        raise DataError(f"--dataset {text!r}: no such file or directory ({path.resolve()}); a path is read as your "
                        f"own data, never as a dataset name (registered names: {', '.join(registered_names())})")
    return None
