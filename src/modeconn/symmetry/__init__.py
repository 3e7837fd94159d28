"""Parameter symmetries: spaces, groups, specs (hand-written or traced) and their action on weights."""

from .groups import GROUPS, Group, PermutationGroup, get_group
from .spec import AxisBinding, Element, Probe, Space, SymmetrySpec
from .trace import symmetry_spec

__all__ = [
    "GROUPS", "Group", "PermutationGroup", "get_group", "AxisBinding", "Element", "Probe", "Space",
    "SymmetrySpec", "symmetry_spec",
]
