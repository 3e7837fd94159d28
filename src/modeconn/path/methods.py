"""The path-method registry: every way of finding a low-loss path between two trained models, by name.

Every method returns the same :class:`~modeconn.path.Path`; :func:`find_path` dispatches on the method name
with its options validated *before* any work (a typo fails at once, naming the option), and
:func:`evaluate_found_path` measures train/test loss and accuracy at every point with BatchNorm statistics
recomputed per point, plus the continuity check between consecutive points. ``modeconn path``
(:mod:`modeconn.recipes.path`) and the LLPF experiments both run methods from here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

import torch
import torch.nn as nn

from ..data import DatasetBundle, make_loader
from ..errors import ConfigError
from ..models._validation import unknown_names_error
from ..registry import Registry
from .autoneb import AutoNEBConfig, autoneb
from .curves import CurveConfig, bezier_curve
from .llpf import LLPFConfig, llpf_cross_sphere, llpf_m2m
from .pathobj import CONTINUITY_TOL, Path, PathCurve, linear_path

StateDict = Mapping[str, torch.Tensor]
DEFAULT_BUDGET = 5000
"""Gradient evaluations ``modeconn path`` gives a searching method when no ``--budget`` is given (minutes on
small models; a few seconds per hundred on a CPU for a small CNN)."""


@dataclass(frozen=True)
class SearchContext:
    """What every path method is handed besides its own options.

    Attributes:
        budget: most gradient evaluations (None: the method's own setting). Every method honours it: LLPF caps
            each tick's refinement at its fair share, Bezier/polychain train ``budget`` steps, AutoNEB stops
            before a step that would exceed it; the linear path needs none.
        out_dir, resume: for the checkpointing methods: where the search writes as it runs, and whether to
            continue a killed search there.
        progress: ``progress(done, total)``.
        max_points: bound on the points a search stores (LLPF: ``record_every`` is sized to it unless given).
        data_info: what the training data is (name, split, limit) — part of a checkpointed search's fingerprint.
    """

    budget: int | None = None
    out_dir: FsPath | None = None
    resume: bool = False
    progress: Callable[[int, int], None] | None = None
    max_points: int | None = None
    data_info: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PathMethod:
    """One path-finding method: ``run(model, sd_a, sd_b, train, options, ctx: SearchContext)``.

    ``options``: the method's own settings (validated by ``check``). ``checkpoints``: the method writes into
    ``ctx.out_dir`` as it runs and can resume a killed run. ``default_budget``: the gradient evaluations
    ``modeconn path`` gives it when ``--budget`` is not given (its schedule scales to the budget; None: needs
    none). ``progress_unit``: what its ``progress(done, total)`` counts.
    """

    name: str
    summary: str
    run: Callable[..., Path]
    check: Callable[[dict[str, Any]], None]
    checkpoints: bool = False
    default_budget: int | None = DEFAULT_BUDGET
    progress_unit: str = "gradient evaluations"


def _check_names(method: str, allowed: set[str]) -> Callable[[dict[str, Any]], None]:
    def check(options: dict[str, Any]) -> None:
        unknown = set(options) - allowed
        if unknown:
            raise unknown_names_error(f"path method {method!r}", unknown, allowed, noun="option")
    return check


def _check_config(config_type, fixed: set[str] = frozenset()) -> Callable[[dict[str, Any]], None]:
    def check(options: dict[str, Any]) -> None:
        for name in fixed & set(options):
            raise ConfigError(f"option {name!r} is set by the path method's name; drop it")
        config_type.from_any(options)
    return check


def _with_budget(options: Mapping[str, Any], budget: int | None, key: str = "budget") -> dict[str, Any]:
    """``options`` with ``key = budget`` (ConfigError if the option already says something else)."""
    opts = dict(options)
    if budget is not None:
        if key in opts and opts[key] != budget:
            raise ConfigError(f"the budget is given twice: --budget {budget} (budget={budget}) and -o {key}={opts[key]}")
        opts[key] = budget
    return opts


def _run_linear(model, a, b, train, options, ctx: SearchContext) -> Path:
    return linear_path(a, b, **options)


def _llpf_runner(fn: Callable[..., Path], cross: bool) -> Callable[..., Path]:
    def run(model, a, b, train, options, ctx: SearchContext) -> Path:
        opts = _with_budget(options, ctx.budget)
        if ctx.max_points is not None and "record_every" not in opts:  # bounded storage and evaluation
            cfg = LLPFConfig.from_any(opts).for_budget(cross)
            ticks = cfg.ticks + (cfg.m2o_max_ticks if cross else 0)
            opts["record_every"] = max(1, math.ceil(ticks / ctx.max_points))
        return fn(model, a, b, train, opts, out_dir=ctx.out_dir, resume=ctx.resume, progress=ctx.progress,
                  data_info=ctx.data_info)
    return run


def _curve_runner(kind: str) -> Callable[..., Path]:
    def run(model, a, b, train, options, ctx: SearchContext) -> Path:
        opts = _with_budget(options, ctx.budget, "steps")  # one minibatch backward per step
        return bezier_curve(model, a, b, train, opts, kind=kind, progress=ctx.progress)
    return run


def _run_autoneb(model, a, b, train, options, ctx: SearchContext) -> Path:
    return autoneb(model, a, b, train, _with_budget(options, ctx.budget), progress=ctx.progress)


PATH_METHODS: Registry[PathMethod] = Registry("path method")
"""Every path-finding method by name; ``modeconn path --method`` and its help come from here. Adding a method is
its runner (and config check) plus one entry below."""
for _m in (
    PathMethod("linear", "the straight line θ(λ) = (1−λ)θ_A + λθ_B", _run_linear, _check_names("linear", {"n"}),
               default_budget=None, progress_unit="points"),
    PathMethod("llpf", "LLPF model-to-model, Follow-Data-Flow unlock order (docs/methods.md §2)",
               _llpf_runner(llpf_m2m, cross=False), _check_config(LLPFConfig), checkpoints=True,
               progress_unit="LLPF ticks"),
    PathMethod("cross-sphere", "LLPF across variance spheres (M2O to B's sphere, then M2M)",
               _llpf_runner(llpf_cross_sphere, cross=True), _check_config(LLPFConfig), checkpoints=True,
               progress_unit="LLPF ticks"),
    PathMethod("bezier", "quadratic/higher Bezier curve trained on E_t L(φ(t)) (Garipov et al. 2018)",
               _curve_runner("bezier"), _check_config(CurveConfig, fixed={"kind"})),
    PathMethod("polychain", "polygonal chain trained on E_t L(φ(t)) (Garipov et al. 2018)",
               _curve_runner("polychain"), _check_config(CurveConfig, fixed={"kind"})),
    PathMethod("autoneb", "AutoNEB pivot chain (Draxler et al. 2018)", _run_autoneb, _check_config(AutoNEBConfig),
               progress_unit="NEB steps"),
):
    PATH_METHODS.register(_m.name)(_m)


def get_path_method(name: str) -> PathMethod:
    """The method called ``name``; ConfigError listing the valid names (with a "did you mean") otherwise."""
    return PATH_METHODS.get(name)


def check_path_options(method: str, options: Mapping[str, Any]) -> PathMethod:
    """Validate a method name and its options cheaply (before any checkpoint or data is loaded)."""
    m = get_path_method(method)
    m.check(dict(options))
    return m


def check_budget(budget: int | None) -> None:
    """ConfigError unless ``budget`` is None or a positive int (gradient evaluations)."""
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ConfigError(f"budget must be a positive integer (gradient evaluations), got {budget!r}")


def find_path(method: str, model: nn.Module, sd_a: StateDict, sd_b: StateDict, train: Any,
              options: Mapping[str, Any] | None = None, *, budget: int | None = None,
              out_dir: str | FsPath | None = None, resume: bool = False,
              progress: Callable[[int, int], None] | None = None, max_points: int | None = None,
              data_info: Mapping[str, Any] | None = None) -> Path:
    """A path from ``sd_a`` to ``sd_b`` by ``method`` (one of :data:`PATH_METHODS`).

    Args:
        train: the training Dataset (TensorDataset) the searching methods draw minibatches from.
        options: the method's settings (LLPF: :class:`~modeconn.path.LLPFConfig` fields; bezier/polychain:
            :class:`~modeconn.path.curves.CurveConfig` fields; autoneb: :class:`~modeconn.path.autoneb.AutoNEBConfig`
            fields; linear: ``n``).
        budget: most gradient evaluations, honoured by every method (:class:`SearchContext`); None: the
            method's own settings decide.
        out_dir, resume: for the checkpointing methods (LLPF): where points are written as the search runs,
            and whether to continue a killed run there.
        max_points: bound on the stored points (LLPF sizes ``record_every`` to it unless it is given).
        data_info: identifies the training data in a checkpointed search's fingerprint.

    Raises: ConfigError (unknown method/option, bad budget), and what the method raises.
    """
    options = dict(options or {})
    m = check_path_options(method, options)
    check_budget(budget)
    ctx = SearchContext(budget, FsPath(out_dir) if (out_dir is not None and m.checkpoints) else None, resume,
                        progress, max_points, data_info)
    return m.run(model, sd_a, sd_b, train, options, ctx)


def eval_loaders(bundle: DatasetBundle, eval_limit: int | None, batch_size: int = 512) -> dict[str, Any]:
    """``{"train", "test"}`` loaders over the first ``eval_limit`` examples of each split (all when None)."""
    def head(ds):
        return ds if eval_limit is None else torch.utils.data.Subset(ds, range(min(eval_limit, len(ds))))
    return {"train": make_loader(head(bundle.train), batch_size), "test": make_loader(head(bundle.test), batch_size)}


def evaluate_found_path(path: Path, model: nn.Module, bundle: DatasetBundle, *, eval_limit: int | None = None,
                        bn_batches: int = 20, sub_points: int = 3, seed: int = 0,
                        progress: Callable[[int, int], None] | None = None) -> PathCurve:
    """Train/test loss and accuracy at every point (BatchNorm recomputed per point on ``bn_batches`` training
    batches), and ``sub_points`` linear sub-points per segment on the train split (continuity check)."""
    loaders = eval_loaders(bundle, eval_limit)
    bn_loader = make_loader(bundle.train, 128, shuffle=True, seed=seed)
    return path.evaluate(model, loaders, bn="reset", bn_loader=bn_loader, bn_batches=bn_batches,
                         sub_points=sub_points, progress=progress)


def evaluation_size(curve: PathCurve, bundle: DatasetBundle, eval_limit: int | None) -> dict[str, Any]:
    """How much was evaluated: points, sub-points per segment, models evaluated, examples per split."""
    n, k = len(curve.lambdas), curve.sub_points
    limit = (lambda m: m) if eval_limit is None else (lambda m: min(eval_limit, m))
    return {"points": n, "sub_points_per_segment": k, "models_evaluated": n + (n - 1) * k,
            "examples": {"train": limit(len(bundle.train)), "test": limit(len(bundle.test))},
            "continuity_split": curve.continuity_split, "eval_limit": eval_limit,
            "bn_batches": curve.info.get("bn_batches", 0), "has_batchnorm": bool(curve.info.get("has_batchnorm"))}


def path_row(label: str, curve: PathCurve, path: Path, endpoint_train_max: float, *,
             continuity_tol: float = CONTINUITY_TOL, reached_b: bool | None = None) -> dict[str, Any]:
    """The numbers of one path for results.json and the markdown table (``complete``: :meth:`PathCurve.completeness`)."""
    s = curve.summary()
    return {
        "method": label,
        "complete": curve.completeness(continuity_tol, reached_b=reached_b)["complete"],
        "points": len(path),
        "grad_evals": int(path.compute.get("grad_evals", 0)),
        "wall_time_s": float(path.compute.get("wall_time_s", 0.0)),
        "peak_train_loss": curve.peak("train"),
        "peak_over_endpoints": curve.peak("train") - endpoint_train_max,
        "dense_peak_train_loss": curve.dense_peak("train"),
        "barrier_mean_train_loss": s["train"]["barrier_mean_loss"],
        "peak_test_loss": curve.peak("test"),
        "min_test_acc": float(curve.values("test", "acc").min()),
        "length": curve.length,
    }
