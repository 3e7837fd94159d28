"""Recipes: configs → runs → reports (the only layer that knows about files and plots).

Importing this package registers every named experiment in :data:`EXPERIMENTS` (one name each in the import below).
"""

from . import (  # noqa: F401  (registration)
    check_calibration, identifiability, llpf_experiment, llpf_zoo, lmc_dm, lmc_dm_vit, merge_rules, symmetry_breaking,
    transformer_wm, zoo,
)
from .compare import METHODS, Comparison, compare_alignments
from .demo import run_demo
from .registry import EXPERIMENTS, Experiment, register_experiment

__all__ = ["EXPERIMENTS", "METHODS", "Comparison", "Experiment", "compare_alignments", "register_experiment", "run_demo"]
