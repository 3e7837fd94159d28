"""Small torch helpers shared across layers (no modeconn imports)."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn

_BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


@contextmanager
def eval_mode(*models: nn.Module):
    """Put models in eval mode and restore every submodule's previous training flag afterwards."""
    flags = [{m: m.training for m in model.modules()} for model in models]
    for model in models:
        model.eval()
    try:
        yield
    finally:
        for f in flags:
            for m, flag in f.items():
                m.training = flag


def batch_inputs(batch) -> torch.Tensor:
    """The model input of a loader batch: ``x`` of ``(x, y, ...)`` or the batch itself."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter (CPU for a parameter-free model)."""
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def batchnorm_modules(model: nn.Module) -> list[nn.Module]:
    """BatchNorm layers that track running statistics (found by type, never by name)."""
    return [m for m in model.modules() if isinstance(m, _BN_TYPES) and m.track_running_stats]


IGNORE_INDEX = -100
"""The label of a position that is not scored (``torch.nn.functional.cross_entropy``'s default ignore index)."""


def flatten_sequence_logits(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence outputs as per-token predictions: logits ``(B, T, V)`` and labels ``(B, T)`` become
    ``(B·T, V)`` and ``(B·T,)`` (views where possible), so a classification loss on them is a per-token loss
    (language models: next-token cross-entropy). Positions labelled :data:`IGNORE_INDEX` (``-100``, Hugging Face's
    convention: the unmasked tokens of a masked-LM block) are left out, so losses, accuracies and token counts are
    over the scored tokens only. Any other shapes (e.g. ``(B, K)`` with ``(B,)``) are returned unchanged."""
    if logits.ndim == 3 and y.ndim == 2 and tuple(logits.shape[:2]) == tuple(y.shape):
        logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        scored = y != IGNORE_INDEX
        if not bool(scored.all()):
            logits, y = logits[scored], y[scored]
    return logits, y


def mean_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of class logits ``(B, K)`` with ``(B,)`` labels, or per token of sequence
    logits ``(B, T, V)`` with ``(B, T)`` labels (:func:`flatten_sequence_logits`): the default training loss
    of every path-finding and matching method."""
    return torch.nn.functional.cross_entropy(*flatten_sequence_logits(logits, y))
