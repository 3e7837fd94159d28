"""Alignment: weight, activation, learned (straight-through), one-sided and dual matching; the method registry."""

from .activation import ActivationMatchingConfig, activation_matching
from .dual import DualAlignment, DualMatchingConfig, dual_matching, one_sided_matching
from .lap import solve_lap
from .learned import LearnedMatchingConfig, learned_matching
from .methods import ALIGNMENT_METHODS, AlignmentMethod
from .parametrize import PARAMETERIZATIONS, GroupTransform, make_transform
from .reference import ReferenceMatchingConfig, reference_weight_matching
from .result import Alignment
from .weight import WeightMatchingConfig, weight_matching

__all__ = ["Alignment", "activation_matching", "learned_matching", "solve_lap", "weight_matching"]
__all__ += ["PARAMETERIZATIONS", "DualAlignment", "GroupTransform", "dual_matching", "make_transform", "one_sided_matching"]
__all__ += ["ALIGNMENT_METHODS", "ActivationMatchingConfig", "AlignmentMethod", "DualMatchingConfig",
            "LearnedMatchingConfig", "ReferenceMatchingConfig", "WeightMatchingConfig", "reference_weight_matching"]
