"""Recipes: configs → runs → reports (the only layer that knows about files and plots)."""

from .compare import METHODS, Comparison, compare_alignments
from .demo import run_demo

__all__ = ["METHODS", "Comparison", "compare_alignments", "run_demo"]
