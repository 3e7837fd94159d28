"""Which options apply to which path of a command: an option given a value is either used by the path the command
takes (checkpoint kind × method) or refused, naming the option, where it applies and the path taken — never silently
ignored.

A recipe's options are a frozen dataclass whose defaults mean "not given" (``None`` where the value depends on the
path). Each command has a table of scoped options (option → where it applies, for the message); every path names the
options it uses; :func:`check_scope` refuses the rest, before any work. Options outside the table (``overwrite``)
apply to every path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from ..errors import ConfigError

FLAGS = {"params": "--param", "align": "--align", "normalize": "--no-normalize", "eval_tasks": "--eval"}
"""Option fields whose command-line flag is not ``--`` + the field name with dashes."""


def flag(name: str) -> str:
    """The command-line flag of option field ``name``."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def given(opts: Any, name: str) -> bool:
    """True if option ``name`` of the dataclass ``opts`` holds a value other than its default."""
    default = {f.name: f for f in dataclasses.fields(opts)}[name].default
    return getattr(opts, name) != default


def check_scope(opts: Any, used: Collection[str], path: str, scopes: Mapping[str, str]) -> None:
    """ConfigError naming the first option of ``scopes`` that ``opts`` gives but ``path`` does not use: its flag,
    where it applies (``scopes[name]``) and the path taken (``path``, e.g. "weight matching of modeconn
    checkpoints")."""
    for name, where in scopes.items():
        if name not in used and given(opts, name):
            raise ConfigError(f"{flag(name)} does not apply to {path}: it applies to {where}; leave it out")


def method_options(config: type, opts: Any, names: Collection[str]) -> dict[str, Any]:
    """The options among ``names`` that ``opts`` gives and that are fields of the method's ``config`` class (a
    :class:`~modeconn.config.StrictConfig`): what reaches the method as keyword overrides."""
    return {n: getattr(opts, n) for n in names if n in config.model_fields and given(opts, n)}


IN_MEMORY_EXCLUDED = {"chunk": "it sizes the reads of streaming weight matching (Hugging Face checkpoint directories); "
                               "in memory nothing is read in chunks"}
"""Method config fields that an alignment of models held in memory does not use (field → why)."""


def method_config(entry: Any, flags: Mapping[str, Any], options: Mapping[str, Any], path: str, *,
                  defaults: Mapping[str, Any] | None = None, excluded: Mapping[str, str] | None = None) -> Any:
    """The alignment method ``entry``'s config object (its :class:`~modeconn.config.StrictConfig` class), built once:
    ``defaults`` (the path's own), then the dedicated flags given (``flags``: field → value, e.g. ``--restarts``),
    then the generic ``-o key=value`` ``options``. ConfigError before any work for an ``-o`` key that is not a field
    of the config (naming the key, the method and its fields), one that ``path`` does not use (``excluded``: field →
    why), one also given by its flag (given twice), and — from the config itself — a bad value, naming the field."""
    fields = entry.config.model_fields
    excluded = excluded or {}
    for key, value in options.items():
        if key not in fields:
            raise ConfigError(f"-o {key}: alignment method {entry.name!r} has no option {key!r}; its options "
                              f"({entry.config.__name__}): {', '.join(fields)}")
        if key in excluded:
            raise ConfigError(f"-o {key} does not apply to {path}: {excluded[key]}; leave it out")
        if key in flags:
            raise ConfigError(f"{key} given twice: by {flag(key)} {flags[key]} and by -o {key}={value}; give it once")
    return entry.config(**{**(defaults or {}), **flags, **options})
