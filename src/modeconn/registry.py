"""Name → object registries (architectures, datasets, matching methods).

Looking up an unknown name raises :class:`modeconn.errors.ConfigError` listing the valid names, so a typo
in a config or on the command line is caught before any heavy work.
"""

from __future__ import annotations

import difflib
from typing import Generic, TypeVar
from collections.abc import Callable, Iterator

from .errors import ConfigError

T = TypeVar("T")


def unknown_name(kind: str, name: object, choices) -> ConfigError:
    """The error for an unknown ``name`` of ``kind``: the valid ``choices``, and the closest one ("did you mean")."""
    choices = sorted(choices)
    close = difflib.get_close_matches(str(name), choices, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(choices)}.{hint}")


class Registry(Generic[T]):
    """A mapping from names to objects of one kind (``kind`` is used in error messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``; a duplicate name raises ConfigError."""

        def deco(obj: T) -> T:
            if name in self._items:
                raise ConfigError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """The object registered as ``name``; ConfigError naming the valid choices otherwise."""
        try:
            return self._items[name]
        except KeyError:
            raise unknown_name(self.kind, name, self._items) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def entries(self) -> list[T]:
        """Every entry, in registration order."""
        return list(self._items.values())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
