"""Paths between models: interpolation, BatchNorm policies, REPAIR, barriers, merging."""

from .batchnorm import BN_POLICIES, reset_bn_stats
from .curve import Curve
from .evaluate import evaluate_model, evaluate_path, lambda_grid, merge
from .interpolate import interpolate, weighted_average
from .repair import channel_stats, repair_model

__all__ = [
    "BN_POLICIES", "Curve", "channel_stats", "evaluate_model", "evaluate_path", "interpolate",
    "lambda_grid", "merge", "repair_model", "reset_bn_stats", "weighted_average",
]
