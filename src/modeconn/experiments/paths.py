"""Finding and evaluating one low-loss path between two trained models (`modeconn path`).

Every method returns the same :class:`~modeconn.path.Path`; :func:`find_path` dispatches on the method name
with its options validated *before* any work (a typo fails at once, naming the option), and
:func:`evaluate_found_path` measures train/test loss and accuracy at every point with BatchNorm statistics
recomputed per point, plus the continuity check between consecutive points.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

import torch
import torch.nn as nn

from ..data import DatasetBundle, make_loader
from ..errors import CheckpointError, ConfigError
from ..models._validation import unknown_names_error
from ..path import LLPFConfig, Path, PathCurve, bezier_curve, linear_path, llpf_cross_sphere, llpf_m2m
from ..path.autoneb import AutoNEBConfig, autoneb
from ..path.curves import CurveConfig
from ..path.pathobj import MANIFEST, atomic_write_text
from ..report import markdown_table
from ..report.figures import plot_path_losses
from .output import write_json

StateDict = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class PathMethod:
    """One path-finding method: ``run(model, sd_a, sd_b, train, options, budget, out_dir, resume, progress)``.

    ``options``: the method's own settings (validated by ``check``); ``budget``: gradient evaluations to match
    (None: the method's own setting). ``checkpoints``: the method writes into ``out_dir`` as it runs and can
    resume a killed run.
    """

    name: str
    summary: str
    run: Callable[..., Path]
    check: Callable[[dict[str, Any]], None]
    checkpoints: bool = False


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


def _run_linear(model, a, b, train, options, budget, out_dir, resume, progress) -> Path:
    return linear_path(a, b, **options)


def _run_llpf(model, a, b, train, options, budget, out_dir, resume, progress) -> Path:
    return llpf_m2m(model, a, b, train, options, out_dir=out_dir, resume=resume, progress=progress)


def _run_cross(model, a, b, train, options, budget, out_dir, resume, progress) -> Path:
    return llpf_cross_sphere(model, a, b, train, options, out_dir=out_dir, resume=resume, progress=progress)


def _curve_runner(kind: str) -> Callable[..., Path]:
    def run(model, a, b, train, options, budget, out_dir, resume, progress) -> Path:
        opts = dict(options)
        if budget is not None:
            opts["steps"] = budget  # one minibatch backward per step
        return bezier_curve(model, a, b, train, opts, kind=kind, progress=progress)
    return run


def _run_autoneb(model, a, b, train, options, budget, out_dir, resume, progress) -> Path:
    opts = dict(options) if budget is None else {**options, "budget": budget}
    return autoneb(model, a, b, train, opts, progress=progress)


PATH_METHODS: dict[str, PathMethod] = {
    m.name: m for m in (
        PathMethod("linear", "the straight line θ(λ) = (1−λ)θ_A + λθ_B", _run_linear, _check_names("linear", {"n"})),
        PathMethod("llpf", "LLPF model-to-model, Follow-Data-Flow unlock order (METHODS.md §2)", _run_llpf, _check_config(LLPFConfig),
                   checkpoints=True),
        PathMethod("cross-sphere", "LLPF across variance spheres (M2O to B's sphere, then M2M)", _run_cross, _check_config(LLPFConfig),
                   checkpoints=True),
        PathMethod("bezier", "quadratic/higher Bezier curve trained on E_t L(φ(t)) (Garipov et al. 2018)",
                   _curve_runner("bezier"), _check_config(CurveConfig, fixed={"kind"})),
        PathMethod("polychain", "polygonal chain trained on E_t L(φ(t)) (Garipov et al. 2018)",
                   _curve_runner("polychain"), _check_config(CurveConfig, fixed={"kind"})),
        PathMethod("autoneb", "AutoNEB pivot chain (Draxler et al. 2018)", _run_autoneb, _check_config(AutoNEBConfig)),
    )
}


def get_path_method(name: str) -> PathMethod:
    """The method called ``name``; ConfigError listing the valid names otherwise."""
    if name not in PATH_METHODS:
        raise ConfigError(f"unknown path method {name!r}; valid: {', '.join(PATH_METHODS)}")
    return PATH_METHODS[name]


def check_path_options(method: str, options: Mapping[str, Any]) -> PathMethod:
    """Validate a method name and its options cheaply (before any checkpoint or data is loaded)."""
    m = get_path_method(method)
    m.check(dict(options))
    return m


def find_path(method: str, model: nn.Module, sd_a: StateDict, sd_b: StateDict, train: Any,
              options: Mapping[str, Any] | None = None, *, budget: int | None = None,
              out_dir: str | FsPath | None = None, resume: bool = False,
              progress: Callable[[int, int], None] | None = None) -> Path:
    """A path from ``sd_a`` to ``sd_b`` by ``method`` (one of :data:`PATH_METHODS`).

    Args:
        train: the training Dataset (TensorDataset) the searching methods draw minibatches from.
        options: the method's settings (LLPF: :class:`~modeconn.path.LLPFConfig` fields; bezier/polychain:
            :class:`~modeconn.path.curves.CurveConfig` fields; autoneb: :class:`~modeconn.path.autoneb.AutoNEBConfig`
            fields; linear: ``n``).
        budget: gradient evaluations for the curve methods and AutoNEB (to match another method's spend);
            LLPF's spend is set by its own settings.
        out_dir, resume: for the checkpointing methods (LLPF): where points are written as the search runs,
            and whether to continue a killed run there.

    Raises: ConfigError (unknown method/option), and what the method raises.
    """
    options = dict(options or {})
    m = check_path_options(method, options)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ConfigError(f"budget must be a positive integer (gradient evaluations), got {budget!r}")
    return m.run(model, sd_a, sd_b, train, options, budget, out_dir if m.checkpoints else None, resume, progress)


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


def path_row(label: str, curve: PathCurve, path: Path, endpoint_train_max: float) -> dict[str, Any]:
    """The numbers of one path for results.json and the markdown table."""
    s = curve.summary()
    return {
        "method": label,
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


ROW_COLUMNS = [("method", "method"), ("grad_evals", "grad evals"), ("points", "points"),
               ("peak_train_loss", "peak train loss"), ("peak_over_endpoints", "peak − max endpoint"),
               ("dense_peak_train_loss", "dense peak (train)"), ("barrier_mean_train_loss", "barrier_mean (train)"),
               ("peak_test_loss", "peak test loss"), ("min_test_acc", "min test acc"), ("length", "path length")]


def rows_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`path_row` dicts (losses in nats, accuracies as fractions)."""
    return markdown_table([c for _, c in ROW_COLUMNS], [[r[k] for k, _ in ROW_COLUMNS] for r in rows])


def prepare_out(out: FsPath, *, resume: bool, overwrite: bool) -> None:
    """``out`` must be new or empty, unless ``resume`` (an interrupted run there) or ``overwrite``."""
    if out.exists() and any(out.iterdir()) and not (resume or overwrite):
        raise ConfigError(f"output directory {out} exists and is not empty; pass --resume to continue a killed "
                          "search there, --overwrite to replace it, or choose another --out")
    if overwrite and not resume and (out / "path" / MANIFEST).exists():
        import shutil

        shutil.rmtree(out / "path")
    out.mkdir(parents=True, exist_ok=True)


def run_path(out: str | FsPath, method: str, model_a: nn.Module, model_b: nn.Module, bundle: DatasetBundle,
             options: Mapping[str, Any] | None = None, *, budget: int | None = None, eval_limit: int | None = None,
             sub_points: int = 3, bn_batches: int = 20, seed: int = 0, resume: bool = False,
             overwrite: bool = False, names: tuple[str, str] = ("A", "B"), log: Callable[[str], None] = print,
             progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Find one path, save it to ``out/path`` (safetensors shards + path.json), evaluate it, and write
    ``results.json``, ``report.md`` and ``path_loss.png`` (each written atomically) into ``out``.

    Raises: ConfigError (bad method/option/out), CheckpointError (an existing path in ``out`` from another run).
    """
    out = FsPath(out)
    m = check_path_options(method, dict(options or {}))
    prepare_out(out, resume=resume, overwrite=overwrite)
    start = time.perf_counter()
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    log(f"finding the {method} path ({m.summary})")
    path = find_path(method, model_a, sd_a, sd_b, bundle.train, options, budget=budget, out_dir=out / "path",
                     resume=resume, progress=progress)
    if path.directory is None:
        if (out / "path" / MANIFEST).exists() and not overwrite:
            raise CheckpointError(f"{out / 'path'} already holds a path; pass --overwrite")
        path.save(out / "path", overwrite=True)
    log(f"evaluating {len(path)} points (+{sub_points} sub-points per segment)")
    curve = evaluate_found_path(path, model_a, bundle, eval_limit=eval_limit, bn_batches=bn_batches,
                                sub_points=sub_points, seed=seed, progress=progress)
    ends = [float(curve.values("train", "loss")[0]), float(curve.values("train", "loss")[-1])]
    row = path_row(method, curve, path, max(ends))
    results = {
        "task": f"{method} path between {names[0]} and {names[1]} on {bundle.name}",
        "models": list(names), "method": method, "options": dict(options or {}), "budget": budget,
        "dataset": {"name": bundle.name, "train": len(bundle.train), "test": len(bundle.test), "eval_limit": eval_limit},
        "endpoint_train_loss": ends, "summary": row, "curve": curve.to_json(), "path_info": path.info,
        "seconds": time.perf_counter() - start,
    }
    tmp_png = out / ".path_loss.png.tmp.png"
    plot_path_losses({method: curve}, tmp_png, title=results["task"])
    tmp_png.replace(out / "path_loss.png")
    write_json(out / ".results.json.tmp", results).replace(out / "results.json")
    atomic_write_text(out / "report.md", f"# {results['task']}\n\n{rows_table([row])}\n\n"
                      "Losses are cross-entropy (nats) with BatchNorm statistics recomputed at every point; "
                      "'dense peak' includes the linear sub-points between consecutive points (continuity "
                      "check).\n\n![loss along the path](path_loss.png)\n")
    return results
