"""The checkpoint-kind seam: a :class:`CheckpointKind` says how to detect and load a directory and which command
operations it supports; :func:`open_checkpoint` tries the registered kinds (:data:`CHECKPOINT_KINDS`) in order.

Commands never branch on a kind: a recipe asks the opened checkpoint's kind for its operation
(:meth:`CheckpointKind.operation`) and refuses, by name, a kind that has none. The built-in kinds' operations are
attached by the recipes that implement them (:meth:`CheckpointKind.supports`); a new kind is one module that registers
its kind (:func:`register_kind`) with its own operations.

A kind that loads an ``nn.Module`` and gives the in-memory hooks — ``example_input(config)`` (the input a spec is
traced with), ``save(...)`` (an output of the same kind) and optionally ``dataset(...)`` (how it is fed; default: the
named dataset, :func:`named_dataset`) — gets every command's generic in-memory operation
(:func:`register_in_memory`, attached by the recipes) without any operation of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError

CONFIG_NAME = "config.json"


@dataclass(frozen=True)
class CheckpointKind:
    """One kind of checkpoint directory: ``name`` (registry key), ``label`` (for messages), ``detect(config)`` on the
    parsed ``config.json``, ``load(path) -> nn.Module``, whether it can be read tensor by tensor (``streams``),
    ``check_config(config, file)`` run when it is opened, and ``operations``: command operation name (``"align"``,
    ``"merge"``, ``"merge_scope"`` — the merge options it uses —, ``"check"``, ``"pair"`` — the two endpoints and data
    of barrier / path) → its implementation.

    In-memory hooks (all optional; with ``example_input`` and ``save`` the kind gets the generic in-memory operations,
    :attr:`in_memory`):

    * ``example_input(config) -> Tensor``: a batch of 2 inputs to trace the spec with when no data is read;
    * ``input_shape(config) -> tuple``: the example shape the model takes (``None`` on an axis of any size), checked
      against a dataset's before any work (default: ``example_input``'s shape);
    * ``dataset(checkpoint, name, data, limit_train, load) -> DatasetBundle``: how it is fed (default
      :func:`named_dataset`: the named dataset, refused without one);
    * ``save(out, model, source, *, config, keep_source, metrics, extra_json, overwrite, inputs, command) -> Path``:
      write ``model`` as a checkpoint of this kind, atomically, ``config`` recorded in it (``keep_source``: keep the
      source's own recorded entries too);
    * ``architecture(config)``: what must be equal between the inputs of one command (default: the whole config)."""

    name: str
    label: str
    detect: Callable[[dict[str, Any]], bool]
    load: Callable[[Path], nn.Module]
    streams: bool = False
    check_config: Callable[[dict[str, Any], Path], None] | None = None
    operations: dict[str, Callable[..., Any]] = field(default_factory=dict, compare=False, repr=False)
    example_input: Callable[[dict[str, Any]], torch.Tensor] | None = None
    input_shape: Callable[[dict[str, Any]], tuple] | None = None
    dataset: Callable[..., Any] | None = None
    save: Callable[..., Path] | None = None
    architecture: Callable[[dict[str, Any]], Any] | None = None

    @property
    def in_memory(self) -> bool:
        """Whether the kind gives the in-memory hooks (``example_input`` and ``save``)."""
        return self.example_input is not None and self.save is not None

    def supports(self, operation: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Attach ``fn`` as this kind's ``operation``; returns ``fn``. ConfigError if one is attached already."""
        if operation in self.operations:
            raise ConfigError(f"checkpoint kind {self.name!r} already has a {operation!r} operation")
        self.operations[operation] = fn
        _SUPPORT_ORDER.setdefault(operation, []).append(self.name)
        return fn

    def operation(self, operation: str) -> Callable[..., Any] | None:
        """This kind's implementation of ``operation`` — its own, else the generic in-memory one where the kind is
        :attr:`in_memory` — or None where it has none."""
        own = self.operations.get(operation)
        if own is None and self.in_memory:
            return IN_MEMORY_OPERATIONS.get(operation)
        return own


_SUPPORT_ORDER: dict[str, list[str]] = {}

IN_MEMORY_OPERATIONS: dict[str, Callable[..., Any]] = {}
"""Command operation name → its generic implementation for every :attr:`CheckpointKind.in_memory` kind."""


def register_in_memory(operation: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Make ``fn`` the generic ``operation`` of every in-memory kind; ConfigError if one is registered already."""
    if operation in IN_MEMORY_OPERATIONS:
        raise ConfigError(f"the in-memory {operation!r} operation is already registered")
    IN_MEMORY_OPERATIONS[operation] = fn
    return fn

CHECKPOINT_KINDS: dict[str, CheckpointKind] = {}
"""Every registered checkpoint kind by name, in detection order (the first whose ``detect`` accepts a config wins)."""


def register_kind(kind: CheckpointKind) -> CheckpointKind:
    """Add ``kind`` after the kinds registered so far; ConfigError if its name is taken."""
    if kind.name in CHECKPOINT_KINDS:
        raise ConfigError(f"checkpoint kind {kind.name!r} is already registered")
    CHECKPOINT_KINDS[kind.name] = kind
    return kind


def kinds_supporting(operation: str) -> list[str]:
    """The names of the registered kinds that support ``operation`` with an operation of their own, in the order their
    operations were attached (the in-memory kinds that get the generic one: :func:`in_memory_kinds`)."""
    return [n for n in _SUPPORT_ORDER.get(operation, []) if n in CHECKPOINT_KINDS
            and CHECKPOINT_KINDS[n].operation(operation) is not None]


def in_memory_kinds(operation: str) -> list[str]:
    """The registered in-memory kinds that get the generic ``operation`` (none of their own), in registration order."""
    if operation not in IN_MEMORY_OPERATIONS:
        return []
    return [n for n, k in CHECKPOINT_KINDS.items() if k.in_memory and operation not in k.operations]


def refuse_kind(command: str, operation: str, checkpoint: Checkpoint) -> ConfigError:
    """The ConfigError for ``command`` on a checkpoint whose kind has no ``operation``: the kinds it reads named."""
    also = in_memory_kinds(operation)
    more = f", and {', '.join(also)} checkpoints in memory" if also else ""
    return ConfigError(f"{command} reads {', '.join(kinds_supporting(operation))} checkpoints{more}; "
                       f"{checkpoint.describe()} is not one")


def named_dataset(ckpt: Checkpoint, name: str | None, data: Path | None, limit_train: int | None, load=None):
    """The default way a kind is fed: the dataset ``name`` (``load``: the loader, default
    :func:`modeconn.data.load_dataset`), or the user's data where ``name`` is a path
    (:func:`modeconn.data.user_data_for_checkpoint`: the checkpoint's own preprocessing and head), its example shape
    checked against the model's (:meth:`Checkpoint.check_input_shape`). ConfigError without a name."""
    from ..data import user_data_for_checkpoint, user_data_path

    if name is None:
        raise ConfigError(f"{ckpt.describe()} records no dataset; pass --dataset")
    if (path := user_data_path(name)) is not None:  # the user's data, with the checkpoint's own preprocessing
        bundle = user_data_for_checkpoint(ckpt.path, ckpt.config, path, limit_train=limit_train)
    else:
        if load is None:
            from ..data import load_dataset as load
        bundle = load(name, data, limit_train=limit_train)
    ckpt.check_input_shape(bundle.input_shape, f"dataset {name!r}")
    return bundle


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

    def example_input(self) -> torch.Tensor:
        """A batch of 2 inputs for tracing (the kind's ``example_input``); ConfigError for a kind without one."""
        if self.kind.example_input is None:
            raise ConfigError(f"{self.describe()}: this kind is not loaded in memory (no example input to trace)")
        return self.kind.example_input(self.config)

    def check_input_shape(self, got: Sequence[int], data: str) -> None:
        """ConfigError, before any work, when ``data`` gives examples of shape ``got`` (without the batch axis) that
        the model does not take (``None`` axes of the kind's ``input_shape`` take any size)."""
        hook = self.kind.input_shape
        expected = hook(self.config) if hook is not None else tuple(self.example_input().shape[1:])
        if len(expected) != len(got) or any(e is not None and e != g for e, g in zip(expected, got, strict=False)):
            shown = tuple("any" if e is None else e for e in expected)
            raise ConfigError(f"{data} gives inputs of shape {tuple(got)} but {self.describe()} takes inputs of "
                              f"shape {shown}: use a dataset the model fits")

    def feed(self, name: str | None, data: Path | None, limit_train: int | None, load=None):
        """The dataset this checkpoint is fed (the kind's ``dataset`` hook, default :func:`named_dataset`): ``name``
        as given (or None), ``data`` its directory, ``load`` the dataset loader (default
        :func:`modeconn.data.load_dataset`)."""
        return (self.kind.dataset or named_dataset)(self, name, data, limit_train, load)

    def save(self, out: Path, model: nn.Module, **kwargs) -> Path:
        """Write ``model`` to ``out`` as a checkpoint of this one's kind (the kind's ``save``; see
        :class:`CheckpointKind`)."""
        if self.kind.save is None:
            raise ConfigError(f"{self.describe()}: modeconn cannot write this kind of checkpoint")
        return self.kind.save(out, model, self, **kwargs)


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
                          "'kwargs', a Hugging Face one 'model_type', a timm one 'architecture' and 'pretrained_cfg', "
                          "a torchvision one 'torchvision_model'")


def open_checkpoints(paths: Sequence[str | os.PathLike], same_vocabulary: bool = True) -> list[Checkpoint]:
    """:func:`open_checkpoint` on each path; CheckpointError naming every path and its kind if they differ; ConfigError
    naming the first differing token when their tokenizers number tokens differently, or the one without tokenizer
    files (:func:`~modeconn.io.vocabulary.check_vocabularies`: every command combining models combines embedding rows;
    ``same_vocabulary=False``: not checked, for a merge that builds one vocabulary of theirs)."""
    from ..io.vocabulary import check_vocabularies

    ckpts = [open_checkpoint(p) for p in paths]
    if len({c.kind.name for c in ckpts}) > 1:
        kinds = ", ".join(c.describe() for c in ckpts)
        raise CheckpointError(f"mixed checkpoint kinds: {kinds}; all inputs must be of one kind")
    if len(ckpts) > 1 and same_vocabulary:
        check_vocabularies([c.path for c in ckpts])
    return ckpts


def load_same_architecture(ckpts: Sequence[Checkpoint]) -> list[nn.Module]:
    """Every checkpoint's model, after checking that they share one architecture (the kind's ``architecture`` of each
    config; ConfigError naming the checkpoints and the differing keys with both values, before any weights load)."""
    from ..io import describe_config_mismatch

    arch = ckpts[0].kind.architecture or (lambda config: config)
    first = arch(ckpts[0].config)
    for c in ckpts[1:]:
        if arch(c.config) != first:
            raise ConfigError(f"{describe_config_mismatch(ckpts[0].path, first, c.path, arch(c.config))}: alignment "
                              "and merging need models of one architecture")
    return [c.load() for c in ckpts]
