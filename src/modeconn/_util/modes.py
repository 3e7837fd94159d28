"""Running a user's model in eval mode without leaving it changed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block; every submodule's ``training`` flag restored after it."""
    with train_mode(model, training=False):
        yield model


@contextmanager
def train_mode(model: nn.Module, training: bool = True) -> Iterator[nn.Module]:
    """``model`` in train mode (``training=False``: eval mode) inside the block; every submodule's ``training`` flag
    restored after it."""
    flags = {m: m.training for m in model.modules()}
    try:
        model.train(training)
        yield model
    finally:
        for m, flag in flags.items():
            m.training = flag
