"""Checkpoint kinds: one :func:`open_checkpoint` recognises every checkpoint directory modeconn reads.

Kinds (:data:`CHECKPOINT_KINDS`, tried in order on the directory's ``config.json``):

* ``absorbed`` — a Hugging Face model after normalization absorption (:func:`modeconn.symmetry.save_absorbed`;
  ``config.json`` has ``model_type`` ``modeconn-absorbed`` or carries ``modeconn_absorbed``). Marked so that stock
  transformers refuses it (:mod:`modeconn.symmetry.absorb`): load it with :meth:`Checkpoint.load`.
* ``huggingface`` — a ``save_pretrained`` directory (``config.json`` with ``model_type``; ``model.safetensors`` or
  shards with ``model.safetensors.index.json``). Read lazily, tensor by tensor (:meth:`Checkpoint.lazy`).
* ``modeconn`` — a modeconn checkpoint (``config.json`` with ``architecture`` and ``kwargs``, ``model.safetensors``).

Recipes dispatch on :attr:`Checkpoint.kind` through tables keyed by kind name, so the command line never branches on
kinds, and a new kind is one entry here plus its rows in the recipes' tables.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from .errors import CheckpointError

CONFIG_NAME = "config.json"


@dataclass(frozen=True)
class CheckpointKind:
    """One kind of checkpoint directory: ``name`` (registry key), ``label`` (for messages), ``detect(config)`` on the
    parsed ``config.json``, ``load(path) -> nn.Module`` and whether it can be read tensor by tensor (``streams``)."""

    name: str
    label: str
    detect: Callable[[dict[str, Any]], bool]
    load: Callable[[Path], nn.Module]
    streams: bool = False


def _load_modeconn(path: Path) -> nn.Module:
    from .io import load_checkpoint

    return load_checkpoint(path)[0]


def _load_hf(path: Path) -> nn.Module:
    from .io_stream import LazyCheckpoint
    from .symmetry.hf.directory import hf_config
    from .symmetry.hf.config_check import model_class

    cfg = hf_config(path)  # first: refuses a model type transformers does not implement (auto_map: never run)
    cls = model_class(cfg, path / CONFIG_NAME, required=True)  # transformers' own class for the model type only
    LazyCheckpoint(path).check_finite()  # transformers reads the weights, unchecked: NaN/Inf refused first
    return cls.from_pretrained(path, local_files_only=True, trust_remote_code=False).eval()


def _load_absorbed(path: Path) -> nn.Module:
    from .symmetry.absorb import load_absorbed

    return load_absorbed(path)


def _is_absorbed(cfg: dict[str, Any]) -> bool:
    from .symmetry.absorb import is_absorbed_config

    return is_absorbed_config(cfg)


CHECKPOINT_KINDS: tuple[CheckpointKind, ...] = (
    CheckpointKind("absorbed", "absorbed Hugging Face", _is_absorbed, _load_absorbed),
    CheckpointKind("huggingface", "Hugging Face", lambda c: isinstance(c.get("model_type"), str)
                   and "architecture" not in c, _load_hf, streams=True),
    CheckpointKind("modeconn", "modeconn", lambda c: isinstance(c.get("architecture"), str), _load_modeconn),
)
"""Every checkpoint kind, in detection order (the first whose ``detect`` accepts the config wins)."""


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
        """A :class:`~modeconn.io_stream.LazyCheckpoint` over the weights (read one tensor at a time)."""
        from .io_stream import LazyCheckpoint

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
    from .io import check_in_checkpoint, check_format_version, read_json_object

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory (it {'is a file' if path.exists() else 'does not exist'})")
    cfg_path = path / CONFIG_NAME
    if cfg_path.is_file():
        check_in_checkpoint(cfg_path, path)
    cfg = read_json_object(cfg_path, "config file")
    for kind in CHECKPOINT_KINDS:
        if kind.detect(cfg):
            if kind.name == "modeconn":
                check_format_version(cfg, cfg_path)
            return Checkpoint(path, kind, cfg)
    raise CheckpointError(f"{cfg_path}: of no known checkpoint kind: a modeconn checkpoint has 'architecture' and "
                          "'kwargs', a Hugging Face one 'model_type'")


def open_checkpoints(paths: Sequence[str | os.PathLike]) -> list[Checkpoint]:
    """:func:`open_checkpoint` on each path; CheckpointError naming every path and its kind if they differ; ConfigError
    naming the first differing token when their tokenizers number tokens differently, or the one without tokenizer
    files (:func:`~modeconn.vocabulary.check_vocabularies`: every command combining models combines embedding rows)."""
    from .vocabulary import check_vocabularies

    ckpts = [open_checkpoint(p) for p in paths]
    if len({c.kind.name for c in ckpts}) > 1:
        kinds = ", ".join(c.describe() for c in ckpts)
        raise CheckpointError(f"mixed checkpoint kinds: {kinds}; all inputs must be of one kind")
    if len(ckpts) > 1:
        check_vocabularies([c.path for c in ckpts])
    return ckpts
