"""Parameter symmetries: spaces, groups, specs (hand-written or traced) and their action on weights."""

from .absorb import AbsorptionError, absorb_normalization, load_absorbed, save_absorbed  # noqa: E402
from .groups import GROUPS, Group, PermutationGroup, get_group
from .hf import HFSymmetrySpec, check_same_config, hf_symmetry_spec  # noqa: E402  (after trace: no cycle)
from .spec import AxisBinding, Element, Probe, Space, SymmetrySpec
from .trace import register_rule, symmetry_spec

__all__ = [
    "GROUPS", "Group", "PermutationGroup", "get_group", "AxisBinding", "Element", "Probe", "Space",
    "SymmetrySpec", "register_rule", "symmetry_spec",
    "HFSymmetrySpec", "check_same_config", "hf_symmetry_spec",
    "AbsorptionError", "absorb_normalization", "load_absorbed", "save_absorbed",
]
