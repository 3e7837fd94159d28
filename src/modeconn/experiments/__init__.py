"""The registered experiments: each a size, a run and a report (:mod:`.registry`); command back-ends live in
:mod:`modeconn.recipes`, which this package never imports.

Importing this package registers every named experiment in :data:`EXPERIMENTS` (one name each in the import below).
"""

from . import (  # noqa: F401  (registration)
    check_calibration, heterogeneous, identifiability, llpf_budget, llpf_experiment, llpf_zoo, lmc_dm, lmc_dm_vit, merge_rules,
    symmetry_breaking, transformer_wm, widths, zoo,
)
from .registry import EXPERIMENTS, Experiment, register_experiment

__all__ = ["EXPERIMENTS", "Experiment", "register_experiment"]
