"""Turn pydantic validation failures and unknown keyword arguments into :class:`ConfigError` messages.

Used for architecture kwargs (:func:`modeconn.models.build_model`) and for
:class:`modeconn.train.TrainConfig`, so every typo is reported the same way: the offending name, the
valid names and, where one is close, a "did you mean" hint.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from pydantic import ValidationError

from ..errors import ConfigError


def unknown_names_error(
    what: str, unknown: Iterable[str], valid: Iterable[str], noun: str = "argument"
) -> ConfigError:
    """A ConfigError naming the ``unknown`` keys of ``what`` and listing the ``valid`` ones."""
    valid = sorted(valid)
    unknown = sorted(unknown)
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1)
        if close:
            hints.append(f"{name!r} → did you mean {close[0]!r}?")
    msg = (
        f"unknown {noun}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for {what}; "
        f"valid {noun}s: {', '.join(valid)}"
    )
    if hints:
        msg += " (" + "; ".join(hints) + ")"
    return ConfigError(msg)


def validation_error_to_config_error(
    err: ValidationError, what: str, valid: Iterable[str] = (), noun: str = "argument"
) -> ConfigError:
    """A ConfigError listing every failing field of ``err`` with its message and the rejected value.

    Extra (unknown) fields are reported with the ``valid`` names and a close-match hint.
    """
    valid = list(valid)
    unknown = [str(e["loc"][0]) for e in err.errors() if e["type"] == "extra_forbidden" and e["loc"]]
    if unknown:
        return unknown_names_error(what, unknown, valid, noun)
    parts: list[str] = []
    seen: set[tuple[str, str]] = set()
    for e in err.errors():
        loc = list(e["loc"])
        if e["type"] == "missing" and len(loc) == 1:
            key, text = str(loc[0]), "missing required argument"
        else:
            # keep field names and indices; drop pydantic's union-branch tags such as "tuple[int, ...]"
            kept = [str(p) for i, p in enumerate(loc) if i == 0 or isinstance(p, int)]
            key = ".".join(kept) or "<root>"
            shown = e.get("input")
            text = f"{e['msg']} (got {shown!r})"
        if (key, text) not in seen:
            seen.add((key, text))
            parts.append(f"{key}: {text}")
    return ConfigError(f"invalid {what}: " + "; ".join(parts))
