"""Checkpoint kinds: one :func:`open_checkpoint` recognises every checkpoint directory modeconn reads.

Kinds (:data:`CHECKPOINT_KINDS`, tried in order on the directory's ``config.json``), one module each:
:mod:`.absorbed`, :mod:`.huggingface`, :mod:`.modeconn`. The seam itself (kind, opened checkpoint, registry) is
:mod:`.base`.
"""

from . import absorbed, huggingface, modeconn  # noqa: F401  (registration, in detection order)
from .base import (
    CHECKPOINT_KINDS, CONFIG_NAME, Checkpoint, CheckpointKind, kinds_supporting, open_checkpoint, open_checkpoints,
    register_kind,
)

__all__ = ["CHECKPOINT_KINDS", "CONFIG_NAME", "Checkpoint", "CheckpointKind", "kinds_supporting", "open_checkpoint",
           "open_checkpoints", "register_kind"]
