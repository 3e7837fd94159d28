"""A strict pydantic base for option sets (training, LLPF, AutoNEB, …).

Every option set of the library is a frozen :class:`StrictConfig`: unknown fields (typos) and bad values raise
:class:`~modeconn.errors.ConfigError` naming the field (with a "did you mean" hint), before any heavy work.
Functions that take one accept ``config=`` (an instance, a mapping or None) plus keyword overrides, merged by
:meth:`StrictConfig.from_any`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import ConfigError
from .models._validation import validation_error_to_config_error


class StrictConfig(BaseModel):
    """Frozen pydantic model whose validation failures are :class:`ConfigError` naming each bad field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise validation_error_to_config_error(err, type(self).__name__, type(self).model_fields,
                                                   noun="field") from None

    @classmethod
    def from_any(cls, config: Self | Mapping[str, Any] | None = None, **overrides: Any) -> Self:
        """``config`` (an instance, a mapping of fields, or None for the defaults) with ``overrides`` applied.

        Raises:
            ConfigError: unknown field (named, with the valid fields) or invalid value; a config of another type.
        """
        if config is None:
            base: dict[str, Any] = {}
        elif isinstance(config, cls):
            if not overrides:
                return config
            base = config.model_dump(exclude_unset=True)
        elif isinstance(config, Mapping):
            base = dict(config)
        else:
            raise ConfigError(f"expected a {cls.__name__} or a dict, got {type(config).__name__}")
        return cls(**{**base, **overrides})
