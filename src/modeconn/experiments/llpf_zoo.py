"""`modeconn experiment llpf-zoo`: LLPF on the paper's architectures vs linear, Bezier, AutoNEB at a matched budget (docs/methods.md §2).

The architectures of the LLPF paper, from their reference definitions at reduced width, on Fashion-MNIST:
MobileNetV2 (torchvision ``MobileNetV2``), ShuffleNetV2 (torchvision ``ShuffleNetV2``), EfficientNet-B0
(torchvision ``EfficientNet`` from its B0 config builder), RegNet (torchvision ``RegNet`` with small
``BlockParams``), DLA-34 (timm ``DLA`` with dla34's levels and ``DlaBasic`` blocks) and modeconn's CCT. Inputs
are Fashion-MNIST's 1-channel 28×28 images: the stem convolution is built with one input channel (same kernel,
stride, padding and width as the reference stem); DLA, whose tree of stride-2 stages needs sides divisible by 32,
gets its input zero-padded 28 → 32 by a ``ZeroPad2d`` in front of the network. 10 classes. Dropout and stochastic
depth are off (they make the train-mode refinement loss differ from the evaluated loss LLPF's threshold is set
from).

For every architecture two pairs of endpoints are trained (SGD, momentum 0.9, different seeds):

- ``wd``: weight decay 5e-4, cosine learning-rate schedule (the ordinary case);
- ``sharp``: no weight decay, constant learning rate — the paper's sharp-minima case.

Between the two models of each pair: the linear path; LLPF model-to-model with Follow-Data-Flow unlock order
(``fdf_groups`` at the architecture's stage level, merged into at most ``max_groups`` consecutive groups), once
per refinement seed (the reproducibility claim: the spread of the peaks over repeats); a quadratic Bezier curve
and AutoNEB, each given the mean gradient evaluations of the LLPF repeats. Every path is evaluated with
BatchNorm statistics recomputed at every point, on train and test, with the continuity check (linear
sub-points between consecutive points: the *dense* peak) and completeness
(:meth:`~modeconn.path.pathobj.PathCurve.completeness`).

Peaks are compared on the dense peak train loss (the path's highest loss including the continuity sub-points);
"LLPF lower than Bezier" means every LLPF repeat's dense peak is below Bezier's, "higher" every one above, and
"mixed" otherwise. Outputs: ``results.json``, ``report.md`` (the table), ``peaks.png`` (peak over the endpoints per
architecture and method) and ``paths_<arch>_<pair>.png`` (loss/accuracy along every path of a pair).
Needs torchvision and timm (ConfigError naming what to install, before any work, when either is missing).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path as FsPath
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ..data import DatasetBundle, load_dataset
from ..errors import ConfigError
from ..models import build_model
from ..path.llpf import fdf_groups
from ..registry import Registry
from ..report import markdown_table
from ..report.figures import plot_path_losses, plot_peak_bars
from ..report.stats import format_mean_std, mean_std
from ..train import TrainConfig, fit
from .llpf_experiment import TRAIN, PathSet, SearchSize, m2m_config
from .output import output_directory, write_results
from ..path.methods import path_row
from ..report.path_rows import rows_table
from .registry import Experiment, register_experiment, size_label

Log = Callable[[str], None]
REQUIRED = {"torchvision": "torchvision", "timm": "timm"}
"""Import name → package to install, for the reference architecture definitions."""


@dataclass(frozen=True)
class ZooSize(SearchSize):
    """Everything that differs between ``--quick`` (CI) and the full run: the shared LLPF settings
    (:class:`~modeconn.experiments.llpf_experiment.SearchSize`), the architectures, the LLPF refinement seeds (one
    repeat each), at most ``max_groups`` FDF unlock groups, and the evaluation (BatchNorm batches, continuity
    sub-points per segment, points sampled on the Bezier curve and on the linear path)."""

    archs: tuple[str, ...]
    seeds: tuple[int, ...]
    max_groups: int = 6
    bn_batches: int = 3
    sub_points: int = 1
    curve_points: int = 9
    linear_points: int = 13


@dataclass(frozen=True)
class Recipe:
    """How one pair of endpoints is trained: weight decay, learning-rate schedule, the two init/data seeds."""

    weight_decay: float
    schedule: str
    seeds: tuple[int, int]
    what: str


PAIRS = {
    "wd": Recipe(5e-4, "cosine", (0, 1), "weight decay 5e-4, cosine schedule"),
    "sharp": Recipe(0.0, "constant", (2, 3), "no weight decay, constant learning rate (sharp minima)"),
}


@dataclass(frozen=True)
class ZooArch:
    """One architecture: ``build()`` → a fresh 1-channel, 10-class model (random init from the global CPU
    generator, seeded by :func:`seeded`), and the module-name depth of its stages for :func:`fdf_groups`."""

    name: str
    source: str
    build: Callable[[], nn.Module]
    fdf_level: int


ARCHS: Registry[ZooArch] = Registry("llpf-zoo architecture")
PAPER_ORDER = ("mobilenetv2", "shufflenetv2", "efficientnet-b0", "regnet", "dla34", "cct")


def _zoo_arch(name: str, source: str, fdf_level: int) -> Callable[[Callable[[], nn.Module]], Callable]:
    def deco(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
        ARCHS.register(name)(ZooArch(name, source, build, fdf_level))
        return build
    return deco


def one_channel(conv: nn.Conv2d) -> nn.Conv2d:
    """A fresh conv like ``conv`` (kernel, stride, padding, output channels, bias) reading one input channel."""
    return nn.Conv2d(1, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, bias=conv.bias is not None)


@_zoo_arch("mobilenetv2", "torchvision MobileNetV2, width_mult 0.25, one block per stage (stages of 2–4 blocks: 2)", 2)
def _mobilenetv2() -> nn.Module:
    from torchvision.models import MobileNetV2

    setting = [[1, 16, 1, 1], [6, 24, 1, 2], [6, 32, 2, 2], [6, 64, 2, 2], [6, 96, 1, 1], [6, 160, 1, 2],
               [6, 320, 1, 1]]
    m = MobileNetV2(num_classes=10, width_mult=0.25, inverted_residual_setting=setting, dropout=0.0)
    m.features[0][0] = one_channel(m.features[0][0])
    return m


@_zoo_arch("shufflenetv2", "torchvision ShuffleNetV2, stages_out_channels (8, 16, 32, 64, 256), repeats (2, 4, 2)", 1)
def _shufflenetv2() -> nn.Module:
    from torchvision.models import ShuffleNetV2

    m = ShuffleNetV2([2, 4, 2], [8, 16, 32, 64, 256], num_classes=10)
    m.conv1[0] = one_channel(m.conv1[0])
    return m


@_zoo_arch("efficientnet-b0", "torchvision EfficientNet, B0 config at width_mult 0.25, depth_mult 0.5", 2)
def _efficientnet_b0() -> nn.Module:
    from torchvision.models import EfficientNet
    from torchvision.models.efficientnet import _efficientnet_conf

    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.5)
    m = EfficientNet(setting, dropout=0.0, stochastic_depth_prob=0.0, num_classes=10, last_channel=last)
    m.features[0][0] = one_channel(m.features[0][0])
    return m


@_zoo_arch("regnet", "torchvision RegNet (X-style), BlockParams depth 6, w_0 16, w_a 8, w_m 2, group width 8, "
                     "stem width 16", 2)
def _regnet() -> nn.Module:
    from torchvision.models import RegNet
    from torchvision.models.regnet import BlockParams

    params = BlockParams.from_init_params(depth=6, w_0=16, w_a=8.0, w_m=2.0, group_width=8)
    m = RegNet(params, num_classes=10, stem_width=16)
    m.stem[0] = one_channel(m.stem[0])
    return m


@_zoo_arch("dla34", "timm DLA with dla34's levels (1, 1, 1, 2, 2, 1) and DlaBasic blocks, channels "
                    "(4, 8, 16, 32, 64, 128) (dla34: 16 … 512); input zero-padded 28 → 32", 2)
def _dla34() -> nn.Module:
    from timm.models.dla import DLA, DlaBasic

    dla = DLA(levels=(1, 1, 1, 2, 2, 1), channels=(4, 8, 16, 32, 64, 128), num_classes=10, in_chans=1,
              block=DlaBasic)
    return nn.Sequential(nn.ZeroPad2d(2), dla)


@_zoo_arch("cct", "modeconn CCT (models/cct.py): D 32, 2 blocks, 2 heads, 2 tokenizer convs of 16 channels", 2)
def _cct() -> nn.Module:
    return build_model("cct", in_shape=(1, 28, 28), num_classes=10, dim=32, depth=2, num_heads=2, conv_channels=16)


def require_packages() -> None:
    """ConfigError naming the missing packages (``pip install torchvision timm``) when the reference
    architecture definitions cannot be imported."""
    missing = [pkg for mod, pkg in REQUIRED.items() if importlib.util.find_spec(mod) is None]
    if missing:
        raise ConfigError(f"experiment llpf-zoo needs {' and '.join(missing)} (the reference MobileNetV2, "
                          f"ShuffleNetV2, EfficientNet, RegNet and DLA definitions): pip install {' '.join(missing)}")


def seeded(arch: ZooArch, seed: int) -> nn.Module:
    """``arch.build()`` with the CPU generator seeded to ``seed`` inside (the global RNG state is restored)."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return arch.build()


def unlock_groups(net: nn.Module, level: int, max_groups: int) -> list[list[str]]:
    """FDF groups at stage ``level`` (:func:`fdf_groups`), in data-flow order, merged into at most ``max_groups``
    consecutive groups of as equal a number of FDF groups as possible (every parameter exactly once)."""
    groups = fdf_groups(net, level)
    bounds = np.linspace(0, len(groups), min(max_groups, len(groups)) + 1).round().astype(int)
    return [[k for g in groups[a:b] for k in g] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def train_pair(arch: ZooArch, bundle: DatasetBundle, size: ZooSize, recipe: Recipe, log: Log) -> list[nn.Module]:
    """The two endpoints of one pair, trained by ``recipe`` (each seed seeds the init and the data order)."""
    models = []
    for seed in recipe.seeds:
        m = seeded(arch, seed)
        fit(m, bundle.train, TrainConfig(seed=seed, epochs=size.epochs, **{**TRAIN, "schedule": recipe.schedule},
                                         weight_decay=recipe.weight_decay), progress=False)
        models.append(m.eval())
        log(f"{arch.name}: trained seed {seed} ({recipe.what})")
    return models


def compare(llpf: list[float], other: float) -> str:
    """"lower" (every LLPF repeat below ``other``), "higher" (every one at or above) or "mixed (k of n lower)"."""
    below = sum(p < other for p in llpf)
    return "lower" if below == len(llpf) else "higher" if below == 0 else f"mixed ({below} of {len(llpf)} lower)"


def run_pair(arch: ZooArch, bundle: DatasetBundle, size: ZooSize, pair: str, log: Log) -> tuple[dict, dict]:
    """Train one pair, find and evaluate its paths; returns (the pair's results, its curves by label)."""
    a, b = train_pair(arch, bundle, size, PAIRS[pair], log)
    ps = PathSet(a, {"A": a.state_dict(), "B": b.state_dict()}, bundle, size.eval_limit, size.bn_batches,
                 size.sub_points, log=lambda msg: log(f"{arch.name}/{pair} {msg}"))
    ps.add("linear", "linear", {"n": size.linear_points})
    ends = ps.endpoint_losses("linear")
    threshold = max(ends) + size.margin
    log(f"{arch.name}/{pair}: endpoint train losses {ends[0]:.4f} / {ends[1]:.4f}, LLPF threshold {threshold:.4f}")
    groups = unlock_groups(a, arch.fdf_level, size.max_groups)
    llpf = [f"llpf (seed {s})" for s in size.seeds]
    for label, s in zip(llpf, size.seeds, strict=True):
        ps.add(label, "llpf", m2m_config(size, threshold, s, order=groups))
    budget = round(float(np.mean([ps.paths[k].compute["grad_evals"] for k in llpf])))
    ps.add_matched_baselines(size.seeds[0], budget, size.curve_points)
    rows = [path_row(label, c, ps.paths[label], max(ends)) for label, c in ps.curves.items()]
    by = {r["method"]: r for r in rows}
    dense = [by[k]["dense_peak_train_loss"] for k in llpf]
    result = {
        "recipe": asdict(PAIRS[pair]), "endpoint_train_loss": ends, "threshold": threshold,
        "fdf_groups": len(groups), "matched_budget_grad_evals": budget, "rows": rows,
        "llpf_peaks": [by[k]["peak_train_loss"] for k in llpf], "llpf_dense_peaks": dense,
        "llpf_dense_peak": mean_std(dense), "llpf_peak": mean_std([by[k]["peak_train_loss"] for k in llpf]),
        "llpf_complete": sum(by[k]["complete"] for k in llpf),
        "llpf_reached_b": all(ps.paths[k].info.get("reached_b") for k in llpf),
        "llpf_unreached_ticks": [len(ps.paths[k].info.get("unreached_ticks", [])) for k in llpf],
        "vs": {m: compare(dense, by[m]["dense_peak_train_loss"]) for m in ("linear", "bezier", "autoneb")},
    }
    return result, ps.curves


def run_llpf_zoo(out: str | FsPath, *, quick: bool = False, data: str | FsPath | None = None,
                 overwrite: bool = False, size: ZooSize | None = None, log: Log = print) -> dict[str, Any]:
    """Run the experiment (module docstring) and write its outputs into ``out`` (atomically).

    Returns the results dict (also ``results.json``): per architecture and pair the path rows (peak and dense peak
    train loss, barrier_mean, test loss/accuracy, completeness, gradient evaluations), the LLPF repeats' peaks with
    mean ± std, and whether LLPF's dense peaks were lower than linear's, Bezier's and AutoNEB's.

    Raises: ConfigError (torchvision or timm missing — before any work; an unknown architecture name in the size).
    """
    require_packages()
    size = size or SIZES["quick" if quick else "full"]
    archs = [ARCHS.get(name) for name in size.archs]
    start = time.perf_counter()
    with output_directory(out, overwrite) as tmp:
        bundle = load_dataset("fashion-mnist", data, limit_train=size.limit_train)
        results: dict[str, Any] = {
            "task": "LLPF on the paper's architectures vs linear, Bezier and AutoNEB (Fashion-MNIST, docs/methods.md §2)",
            "size": asdict(size), "size_label": size_label(SIZES, size),
            "dataset": {"name": bundle.name, "train": len(bundle.train), "test": len(bundle.test)},
            "archs": {},
        }
        for arch in archs:
            entry = {"source": arch.source, "params": sum(p.numel() for p in seeded(arch, 0).parameters()),
                     "pairs": {}}
            for pair in PAIRS:
                t0 = time.perf_counter()
                entry["pairs"][pair], curves = run_pair(arch, bundle, size, pair, log)
                entry["pairs"][pair]["seconds"] = time.perf_counter() - t0
                plot_path_losses(curves, tmp / f"paths_{arch.name}_{pair}.png",
                                 title=f"{arch.name}, {PAIRS[pair].what}", note="BatchNorm recomputed per point")
            results["archs"][arch.name] = entry
        plot_peak_bars(peak_bars(results), tmp / "peaks.png", ylabel="dense peak train loss − max endpoint (nats)",
                       title="Path peaks over the endpoints (LLPF: mean ± std over repeats)")
        write_results(tmp, results, report, start)
    return results


METHOD_BARS = ("linear", "llpf", "bezier", "autoneb")


def peak_bars(results: dict[str, Any]) -> dict[str, dict[str, tuple[float, float]]]:
    """``{"arch/pair": {method: (dense peak − max endpoint, std)}}`` (LLPF: mean and std over its repeats)."""
    bars = {}
    for name, entry in results["archs"].items():
        for pair, r in entry["pairs"].items():
            top = max(r["endpoint_train_loss"])
            by = {row["method"]: row["dense_peak_train_loss"] - top for row in r["rows"]}
            llpf = r["llpf_dense_peak"]
            bars[f"{name}/{pair}"] = {"linear": (by["linear"], 0.0), "llpf": (llpf["mean"] - top, llpf["std"] or 0.0),
                                      "bezier": (by["bezier"], 0.0), "autoneb": (by["autoneb"], 0.0)}
    return bars


def _row_of(r: dict[str, Any], method: str) -> dict[str, Any]:
    return next(row for row in r["rows"] if row["method"] == method)


def summary_rows(results: dict[str, Any]) -> list[list[Any]]:
    """One table row per architecture and pair (dense peaks; LLPF as mean ± std over its repeats)."""
    rows = []
    for name, entry in results["archs"].items():
        for pair, r in entry["pairs"].items():
            n = r["llpf_dense_peak"]["n"]
            rows.append([name, pair, max(r["endpoint_train_loss"]), _row_of(r, "linear")["dense_peak_train_loss"],
                         format_mean_std(r["llpf_dense_peak"], digits=4), _row_of(r, "bezier")["dense_peak_train_loss"],
                         _row_of(r, "autoneb")["dense_peak_train_loss"], r["matched_budget_grad_evals"],
                         f"{r['llpf_complete']}/{n}", r["vs"]["bezier"], r["vs"]["autoneb"]])
    return rows


SUMMARY_HEADER = ["arch", "pair", "max endpoint", "linear", "LLPF (mean ± std)", "Bezier", "AutoNEB",
                  "budget (grad evals)", "LLPF complete", "LLPF vs Bezier", "LLPF vs AutoNEB"]


NAMES = {"linear": "linear", "bezier": "Bezier", "autoneb": "AutoNEB"}


def verdict(name: str, entry: dict[str, Any]) -> str:
    """One sentence per architecture: in how many repeats LLPF's dense peak was below linear's, Bezier's and
    AutoNEB's, per pair."""
    parts = []
    for pair, r in entry["pairs"].items():
        dense = r["llpf_dense_peaks"]
        peaks = {m: _row_of(r, m)["dense_peak_train_loss"] for m in NAMES}
        below = ", ".join(f"{NAMES[m]}'s {p:.4f} in {sum(x < p for x in dense)} of {len(dense)}" for m, p in peaks.items())
        parts.append(f"{pair}: LLPF {format_mean_std(r['llpf_dense_peak'], digits=4)} (endpoints ≤ "
                     f"{max(r['endpoint_train_loss']):.4f}) is below {below} repeats")
    return f"- **{name}** — " + "; ".join(parts) + "."


def report(results: dict[str, Any]) -> str:
    size = results["size"]
    lines = [
        f"# {results['task']}",
        "",
        f"Size: {results['size_label']} — {results['dataset']['train']} training examples, {size['epochs']} epochs per "
        f"endpoint, LLPF {size['ticks']} ticks (step {size['step']}, refinement {size['min_steps']}–{size['max_steps']} "
        f"SGD steps at lr {size['lr']}, threshold = max endpoint train loss + {size['margin']}), "
        f"{len(size['seeds'])} LLPF repeats (refinement seeds {', '.join(map(str, size['seeds']))}); Bezier and "
        f"AutoNEB get the repeats' mean gradient evaluations. Evaluated on {size['eval_limit']} examples per split, "
        f"BatchNorm recomputed at every point from {size['bn_batches']} training batches, {size['sub_points']} "
        "continuity sub-point(s) per segment.",
        "",
        "Inputs: the stem convolution of each reference definition is built with one input channel (same kernel, "
        "stride, padding, width) for Fashion-MNIST's 1-channel 28×28 images — no channel repetition; DLA's input is "
        "zero-padded to 32×32 (its stride-2 tree needs sides divisible by 32). Dropout and stochastic depth are off.",
        "",
        "Losses are train cross-entropy (nats); every peak is the *dense* peak (points and continuity sub-points). "
        "'lower' = every LLPF repeat's dense peak is below the baseline's; 'higher' = every one is at or above it. "
        "'LLPF complete' counts the repeats whose path reaches B with every segment passing the continuity check. "
        f"LLPF stores every {size['record_every']}th tick as a point, so one segment spans that many ticks: the "
        "continuity check and the dense peak charge LLPF for the ticks between stored points. LLPF refines with plain "
        "SGD (no momentum, the method's definition); Bezier and AutoNEB train with momentum 0.9 at lr 0.05.",
        "",
        markdown_table(SUMMARY_HEADER, summary_rows(results)),
        "",
        *[verdict(name, entry) for name, entry in results["archs"].items()],
        "",
        "![peaks](peaks.png)",
        "",
        "## Architectures",
        "",
        *[f"- {name} ({entry['params']:,} parameters): {entry['source']}" for name, entry in results["archs"].items()],
        "",
        "## All paths",
        "",
    ]
    for name, entry in results["archs"].items():
        for pair, r in entry["pairs"].items():
            lines += [f"### {name}, {pair} ({r['recipe']['what']})", "",
                      f"Endpoint train losses {r['endpoint_train_loss'][0]:.4f} / {r['endpoint_train_loss'][1]:.4f}; "
                      f"{r['fdf_groups']} FDF groups; LLPF peaks at the points "
                      f"{', '.join(f'{p:.4f}' for p in r['llpf_peaks'])}; LLPF ticks that ended above the threshold "
                      f"(refinement stopped at max_steps): {', '.join(map(str, r['llpf_unreached_ticks']))} of "
                      f"{size['ticks']}; {r['seconds']:.0f} s.", "",
                      rows_table(r["rows"]), "", f"![{name} {pair}](paths_{name}_{pair}.png)", ""]
    return "\n".join(lines)


SIZES = {
    "quick": ZooSize(archs=PAPER_ORDER, limit_train=256, epochs=1, eval_limit=64, ticks=4, step=0.5,
                     min_steps=1, max_steps=2, record_every=2, lr=0.02, margin=0.02, seeds=(0, 1), max_groups=3,
                     bn_batches=1, curve_points=3, linear_points=3),
    "full": ZooSize(archs=PAPER_ORDER, limit_train=3000, epochs=6, eval_limit=300, ticks=20, step=0.15,
                    min_steps=3, max_steps=15, record_every=4, lr=0.05, margin=0.03, seeds=(0, 1, 2, 3, 4),
                    bn_batches=2),
}

register_experiment(Experiment("llpf-zoo", __doc__, SIZES, run_llpf_zoo, report,
                               ("report.md", "results.json", "peaks.png", "paths_<arch>_<pair>.png"),
                               {"epochs": "epochs", "limit_train": "limit_train"},
                               why_not="every architecture has its own reduced width"))
