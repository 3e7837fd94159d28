"""Paths between models: interpolation, BatchNorm policies, REPAIR, barriers, merging (models of different widths
too), and low-loss path finding (LLPF, Bezier/polygonal-chain curves) with a common :class:`Path` object."""

from .autoneb import AutoNEBConfig, autoneb
from .batchnorm import BN_POLICIES, reset_bn_stats
from .curve import Curve
from .curves import CurveConfig, CurveModule, bezier_curve, train_curve
from .evaluate import evaluate_model, evaluate_path, lambda_grid, merge
from .interpolate import interpolate, weighted_average
from .llpf import LLPFConfig, fdf_groups, llpf_cross_sphere, llpf_m2m, llpf_m2o, scale_to_variance
from .pathobj import Path, PathCurve, linear_path
from .repair import channel_stats, repair_model
from .width import merge_widths

__all__ = [
    "BN_POLICIES", "AutoNEBConfig", "Curve", "CurveConfig", "CurveModule", "LLPFConfig", "Path", "PathCurve", "autoneb",
    "bezier_curve", "channel_stats", "evaluate_model", "evaluate_path", "fdf_groups", "interpolate", "lambda_grid",
    "linear_path", "llpf_cross_sphere", "llpf_m2m", "llpf_m2o", "merge", "merge_widths", "repair_model", "reset_bn_stats",
    "scale_to_variance", "train_curve", "weighted_average",
]
