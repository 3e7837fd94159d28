"""Checkpoint kinds: one :func:`open_checkpoint` recognises every checkpoint directory modeconn reads.

Kinds (:data:`CHECKPOINT_KINDS`, tried in order on the directory's ``config.json``), one module each:
:mod:`.absorbed`, :mod:`.huggingface`, :mod:`.timm`, :mod:`.torchvision`, :mod:`.modeconn` (:mod:`.library`: what
the timm and torchvision kinds share). The seam itself (kind, opened checkpoint, registry) is
:mod:`.base`.
"""

from . import absorbed, huggingface, timm, torchvision, modeconn  # noqa: F401  (registration, in detection order)
from .base import (
    CHECKPOINT_KINDS, CONFIG_NAME, IN_MEMORY_OPERATIONS, Checkpoint, CheckpointKind, in_memory_kinds, kinds_supporting,
    load_same_architecture, named_dataset, open_checkpoint, open_checkpoints, refuse_kind, register_in_memory,
    register_kind,
)

__all__ = [
    "CHECKPOINT_KINDS", "CONFIG_NAME", "IN_MEMORY_OPERATIONS", "Checkpoint", "CheckpointKind", "in_memory_kinds",
    "kinds_supporting", "load_same_architecture", "named_dataset", "open_checkpoint", "open_checkpoints",
    "refuse_kind", "register_in_memory", "register_kind",
]
