"""JSON text and files, written once: one cleaning of tensors / numpy / paths, one policy for NaN and Inf.

Strict by default: a non-finite float is refused with an error naming the file and the entry (``allow_nan=False``;
Python's own ``NaN`` literal is not JSON). A file that records measured values which may legitimately be non-finite
(a diverged loss in ``results.json`` or ``metrics.json``) asks for ``nan="null"`` and gets ``null`` there instead.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from ..errors import ConfigError, NonFiniteError
from .atomic import atomic_write_text

NanPolicy = Literal["error", "null"]


def _clean(x: Any, nan: NanPolicy, what: str, where: str) -> Any:
    """``x`` with 1-element tensors as numbers, numpy arrays and scalars as lists / numbers, paths as strings, keys
    as strings and non-finite floats as ``None`` (``nan="null"``) or refused (``nan="error"``)."""
    if isinstance(x, float) and not math.isfinite(x):
        if nan == "null":
            return None
        raise NonFiniteError(f"{what}: {where or 'the value'} is {x}, which JSON cannot hold; nothing was written")
    if isinstance(x, Mapping):
        return {str(k): _clean(v, nan, what, f"{where}.{k}" if where else str(k)) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v, nan, what, f"{where}[{i}]") for i, v in enumerate(x)]
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return _clean(x.item(), nan, what, where)
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist") and not isinstance(x, torch.Tensor):  # numpy arrays and scalars
        return _clean(x.tolist(), nan, what, where)
    return x


def to_json(obj: Any, what: str, *, nan: NanPolicy = "error", sort_keys: bool = False,
            default: Callable[[Any], Any] | None = None) -> str:
    """JSON text of ``obj`` (indent 2, a final newline); ``what`` (the file, or what the text is for) names it in
    errors. ``default`` converts objects JSON has no form for (e.g. ``str``); without it they are refused.

    Raises: NonFiniteError naming the entry for a NaN/Inf float (``nan="error"``); ConfigError for a value that is
    not JSON-serialisable.
    """
    try:
        return json.dumps(_clean(obj, nan, what, ""), indent=2, sort_keys=sort_keys, allow_nan=False,
                          default=default) + "\n"
    except (TypeError, ValueError) as err:
        if isinstance(err, NonFiniteError):
            raise
        raise ConfigError(f"{what} is not JSON-serialisable: {err}") from None


def write_json(path: str | os.PathLike, obj: Any, *, nan: NanPolicy = "error", sort_keys: bool = False,
               default: Callable[[Any], Any] | None = None) -> Path:
    """Write :func:`to_json` of ``obj`` to ``path`` atomically (:func:`~modeconn._util.atomic.atomic_write_text`);
    the text is made in full before the file is touched. Returns ``path``."""
    return atomic_write_text(path, to_json(obj, str(path), nan=nan, sort_keys=sort_keys, default=default))
