"""The checkpoint-kind seam: a :class:`CheckpointKind` says how to detect and load a directory and which command
operations it supports; :func:`open_checkpoint` tries the registered kinds (:data:`CHECKPOINT_KINDS`) in order.

Commands never branch on a kind: a recipe asks the opened checkpoint's kind for its operation
(:meth:`CheckpointKind.operation`) and refuses, by name, a kind that has none. The built-in kinds' operations are
attached by the recipes that implement them (:meth:`CheckpointKind.supports`); a new kind is one module that registers
its kind (:func:`register_kind`) with its own operations.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import CheckpointError, ConfigError

CONFIG_NAME = "config.json"


@dataclass(frozen=True)
class CheckpointKind:
    """One kind of checkpoint directory: ``name`` (registry key), ``label`` (for messages), ``detect(config)`` on the
    parsed ``config.json``, ``load(path) -> nn.Module``, whether it can be read tensor by tensor (``streams``),
    ``check_config(config, file)`` run when it is opened, and ``operations``: command operation name (``"align"``,
    ``"merge"``, ``"merge_scope"`` — the merge options it uses —, ``"check"``, ``"pair"`` — the two endpoints and data
    of barrier / path) → its implementation."""

    name: str
    label: str
    detect: Callable[[dict[str, Any]], bool]
    load: Callable[[Path], nn.Module]
    streams: bool = False
    check_config: Callable[[dict[str, Any], Path], None] | None = None
    operations: dict[str, Callable[..., Any]] = field(default_factory=dict, compare=False, repr=False)

    def supports(self, operation: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Attach ``fn`` as this kind's ``operation``; returns ``fn``. ConfigError if one is attached already."""
        if operation in self.operations:
            raise ConfigError(f"checkpoint kind {self.name!r} already has a {operation!r} operation")
        self.operations[operation] = fn
        _SUPPORT_ORDER.setdefault(operation, []).append(self.name)
        return fn

    def operation(self, operation: str) -> Callable[..., Any] | None:
        """This kind's implementation of ``operation``, or None where it has none."""
        return self.operations.get(operation)


_SUPPORT_ORDER: dict[str, list[str]] = {}

CHECKPOINT_KINDS: dict[str, CheckpointKind] = {}
"""Every registered checkpoint kind by name, in detection order (the first whose ``detect`` accepts a config wins)."""


def register_kind(kind: CheckpointKind) -> CheckpointKind:
    """Add ``kind`` after the kinds registered so far; ConfigError if its name is taken."""
    if kind.name in CHECKPOINT_KINDS:
        raise ConfigError(f"checkpoint kind {kind.name!r} is already registered")
    CHECKPOINT_KINDS[kind.name] = kind
    return kind


def kinds_supporting(operation: str) -> list[str]:
    """The names of the registered kinds that support ``operation``, in the order their operations were attached."""
    return [n for n in _SUPPORT_ORDER.get(operation, []) if n in CHECKPOINT_KINDS
            and CHECKPOINT_KINDS[n].operation(operation) is not None]


@dataclass(frozen=True)
class Checkpoint:
    """An opened checkpoint directory: its ``path``, ``kind`` and parsed ``config`` (nothing else is read yet)."""

    path: Path
    kind: CheckpointKind
    config: dict[str, Any] = field(repr=False)

    def load(self) -> nn.Module:
        """The model, in memory (eval mode for Hugging Face kinds). Raises CheckpointError / ConfigError;
        NonFiniteError naming the weights file and tensor where a floating parameter or buffer holds NaN/Inf."""
        return self.kind.load(self.path)

    def lazy(self):
        """A :class:`~modeconn.io.lazy.LazyCheckpoint` over the weights (read one tensor at a time)."""
        from ..io.lazy import LazyCheckpoint

        return LazyCheckpoint(self.path)

    @property
    def dataset(self) -> str | None:
        """The dataset recorded at training time (modeconn checkpoints), else None."""
        name = self.config.get("dataset")
        return name if isinstance(name, str) else None

    def describe(self) -> str:
        return f"{self.path} ({self.kind.label})"


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Recognise the checkpoint directory ``path`` by its ``config.json`` (reads nothing else).

    Raises:
        CheckpointError: ``path`` is not a directory; ``config.json`` missing, unreadable, symlinked out of the
            directory, or of no known kind (the message says what each kind needs).
        ConfigError: a modeconn ``format_version`` newer than this version reads.
    """
    from ..io import check_in_checkpoint, read_json_object

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory (it {'is a file' if path.exists() else 'does not exist'})")
    cfg_path = path / CONFIG_NAME
    if cfg_path.is_file():
        check_in_checkpoint(cfg_path, path)
    cfg = read_json_object(cfg_path, "config file")
    for kind in CHECKPOINT_KINDS.values():
        if kind.detect(cfg):
            if kind.check_config is not None:
                kind.check_config(cfg, cfg_path)
            return Checkpoint(path, kind, cfg)
    raise CheckpointError(f"{cfg_path}: of no known checkpoint kind: a modeconn checkpoint has 'architecture' and "
                          "'kwargs', a Hugging Face one 'model_type'")


def open_checkpoints(paths: Sequence[str | os.PathLike]) -> list[Checkpoint]:
    """:func:`open_checkpoint` on each path; CheckpointError naming every path and its kind if they differ; ConfigError
    naming the first differing token when their tokenizers number tokens differently, or the one without tokenizer
    files (:func:`~modeconn.io.vocabulary.check_vocabularies`: every command combining models combines embedding rows)."""
    from ..io.vocabulary import check_vocabularies

    ckpts = [open_checkpoint(p) for p in paths]
    if len({c.kind.name for c in ckpts}) > 1:
        kinds = ", ".join(c.describe() for c in ckpts)
        raise CheckpointError(f"mixed checkpoint kinds: {kinds}; all inputs must be of one kind")
    if len(ckpts) > 1:
        check_vocabularies([c.path for c in ckpts])
    return ckpts
