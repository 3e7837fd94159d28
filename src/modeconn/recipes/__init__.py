"""Recipes below the command line: one function per command (align, merge), dispatching on the checkpoint kind
(:func:`modeconn.checkpoints.open_checkpoints`) through a table, checking every output target and option before any
heavy work, and returning an :class:`Outcome` for the command line to print."""

from .align import AlignOptions, align
from .train import train
from .merge import MergeOptions, merge
from .outcome import Outcome

__all__ = ["AlignOptions", "MergeOptions", "Outcome", "align", "merge", "train"]
