"""Alignment: weight, activation and learned (straight-through) matching."""

from .activation import activation_matching
from .dual import DualAlignment, dual_matching, one_sided_matching
from .lap import solve_lap
from .learned import learned_matching
from .parametrize import PARAMETERIZATIONS, GroupTransform, make_transform
from .result import Alignment
from .weight import weight_matching

__all__ = ["Alignment", "activation_matching", "learned_matching", "solve_lap", "weight_matching"]
__all__ += ["PARAMETERIZATIONS", "DualAlignment", "GroupTransform", "dual_matching", "make_transform", "one_sided_matching"]
