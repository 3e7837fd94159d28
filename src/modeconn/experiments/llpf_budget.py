"""`modeconn experiment llpf-budget`: peak train loss against gradient evaluations for LLPF, Bezier and AutoNEB (docs/methods.md §2).

Does LLPF find low-loss paths where the other methods do not, once it is given a budget at which it can work? On
the reduced-width reference architectures of ``llpf-zoo`` (Fashion-MNIST; endpoints trained with weight decay 5e-4
and a cosine schedule from two seeds), every method is run at every budget of the size (gradient evaluations: one
minibatch backward each, the unit every method is capped in) with every repeat seed:

- LLPF model-to-model with its schedule scaled to the budget the way the paper scales it — more ticks and a longer
  refinement per tick (:meth:`~modeconn.path.LLPFConfig.for_budget`: ≈ 2·√budget ticks, the fair share of
  refinement steps per tick ≈ √budget / 2, step 6/ticks) — and Follow-Data-Flow unlock per stage (the stage
  groups of ``llpf-zoo``, unlocked in data-flow order over the first third of the run);
- a quadratic Bezier curve trained for ``budget`` steps, and AutoNEB with its NEB steps per cycle sized to the
  budget.

The cross-sphere case (A with weight decay 5e-4, C trained without) is run the same way on one architecture:
LLPF cross-sphere (M2O to C's variance sphere, then M2M) against Bezier and AutoNEB. At the largest budget the LLPF
ablations (every layer at once; no variance correction; the source's variance as the target) show which decision
of the implementation matters.

Every path is evaluated like ``modeconn path`` (BatchNorm recomputed per point, continuity sub-points): *complete*
= reaches B and every segment passes the continuity check; *low-loss* = complete and its dense peak train loss
within 0.1 nats of the higher endpoint's. Outputs: ``results.json`` (one row per path), ``report.md`` (per pair and
method: dense peak mean ± std over repeats and complete / low-loss counts at every budget, and the first budget at
which a method is complete and low-loss in a majority of repeats) and ``peaks.png`` (dense peak over the
endpoints against the budget, one panel per pair). With ``time_limit_s`` no path is started after that many
seconds; the paths not run are listed in the report.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path as FsPath
from typing import Any

import numpy as np
import torch.nn as nn

from ..data import DatasetBundle, load_dataset
from ..path import LLPFConfig
from ..path.llpf import THRESHOLD_MARGIN
from ..path.methods import evaluate_found_path, find_path, path_row
from ..path.pathobj import LOW_LOSS_MARGIN
from ..report import markdown_table
from ..report.figures import plot_peak_vs_budget
from ..report.stats import format_mean_std, mean_std
from ..train import TrainConfig, fit
from .llpf_experiment import TRAIN
from .llpf_zoo import ARCHS, PAIRS, require_packages, seeded, train_pair, unlock_groups
from .output import output_directory, write_results
from .registry import Experiment, register_experiment, size_label

Log = Callable[[str], None]
METHODS = ("llpf", "bezier", "autoneb")
ABLATIONS = {"all-at-once": {"order": "all"}, "no variance correction": {"variance_correction": "none"},
             "source variance": {"variance_target": "source"}, "every tensor corrected": {"variance_correction": "all"},
             "target at the endpoints": {"threshold_margin": 0.0}, "whole budget": {"threshold": -1.0},
             "every tick stored": {"record_every": 1},
             "whole budget and every tick stored": {"threshold": -1.0, "record_every": 1}}
"""LLPF variants run at the ablation budget (first repeat seed): the setting each changes (``whole budget``: a target
no cross-entropy reaches, so every tick refines for its whole fair share of the budget; ``every tick stored``: the
continuity check sees every tick instead of every ``record_every``-th)."""
CROSS_WEIGHT_DECAY = 0.0
"""Weight decay of the cross-sphere case's second endpoint C (A: the ``wd`` pair's 5e-4)."""


@dataclass(frozen=True)
class BudgetSize:
    """Everything that differs between sizes: the architectures (``llpf-zoo`` names), the budgets (gradient
    evaluations per path), the repeat seeds, the cross-sphere architecture (None: no cross-sphere case), the
    endpoints' training (examples, epochs), the evaluation (examples per split, BatchNorm batches, continuity
    sub-points, points of the Bezier curve and of the linear path), LLPF's refinement (lr, ``margin`` above the higher
    endpoint at which a tick stops — None: LLPF's relative default, :data:`~modeconn.path.llpf.THRESHOLD_MARGIN` —,
    ``min_steps``, also the window of minibatch losses whose mean must reach the target: at 5,000 evaluations LLPF's
    default 20 refines each point so far off the schedule that the closing segment to B rises, docs/results), its
    stored points (``max_points``), its unlock groups
    (``max_groups`` stage groups), its verification minibatches and closing ticks (``verify_batches``,
    ``closing_ticks``: :class:`~modeconn.path.LLPFConfig`; 0: none), the ablations run and their budget (None: the
    largest), ``baseline_repeats`` (Bezier
    and AutoNEB run with the first that many repeat seeds only; None: every one) and ``time_limit_s`` (no path
    started after that many seconds of the sweep; None: none)."""

    archs: tuple[str, ...]
    budgets: tuple[int, ...]
    seeds: tuple[int, ...]
    cross_arch: str | None
    limit_train: int
    epochs: int
    eval_limit: int
    bn_batches: int = 2
    sub_points: int = 1
    curve_points: int = 9
    linear_points: int = 13
    lr: float = 0.05
    margin: float | None = None
    min_steps: int = 3
    max_points: int = 24
    max_groups: int = 6
    verify_batches: int = 0
    closing_ticks: int = 0
    ablations: tuple[str, ...] = tuple(ABLATIONS)
    ablation_budget: int | None = None
    baseline_repeats: int | None = None
    time_limit_s: float | None = None


@dataclass(frozen=True)
class Cell:
    """One path to find: on ``pair`` (``"<arch>/wd"`` or ``"<arch>/cross"``), ``label`` (method or ablation) at
    ``budget`` with repeat ``seed``."""

    pair: str
    label: str
    budget: int
    seed: int


class Pair:
    """The endpoints of one pair (trained on first use; the ``wd`` pair's A is shared with the architecture's
    cross-sphere pair through ``trained``), the linear path's row and the LLPF unlock groups."""

    def __init__(self, name: str, bundle: DatasetBundle, size: BudgetSize, log: Log,
                 trained: dict[str, list[nn.Module]]) -> None:
        self.name, self.bundle, self.size, self.log, self.trained = name, bundle, size, log, trained
        self.arch = ARCHS.get(name.split("/")[0])
        self.cross = name.endswith("/cross")
        self.model: nn.Module | None = None

    def _endpoints(self) -> tuple[nn.Module, nn.Module]:
        if self.arch.name not in self.trained:
            self.trained[self.arch.name] = train_pair(self.arch, self.bundle, self.size, PAIRS["wd"], self.log)
        a, b = self.trained[self.arch.name]
        if self.cross:
            b = seeded(self.arch, 2)
            fit(b, self.bundle.train, TrainConfig(seed=2, epochs=self.size.epochs, **TRAIN,
                                                  weight_decay=CROSS_WEIGHT_DECAY), progress=False)
            b = b.eval()
            self.log(f"{self.arch.name}: trained seed 2 (no weight decay: the cross-sphere endpoint)")
        return a, b

    def ready(self) -> Pair:
        if self.model is None:
            a, b = self._endpoints()
            self.model, self.sd_a, self.sd_b = a, a.state_dict(), b.state_dict()
            self.groups = unlock_groups(a, self.arch.fdf_level, self.size.max_groups)
            self.linear = self.row("linear", "linear", {"n": self.size.linear_points}, None)
            self.ends = self.linear["endpoint_train_loss"]
        return self

    def row(self, label: str, method: str, options: dict[str, Any], budget: int | None) -> dict[str, Any]:
        """Find and evaluate one path; its row (``path_row`` fields, plus LLPF's ticks and reach)."""
        path = find_path(method, self.model, self.sd_a, self.sd_b, self.bundle.train, options, budget=budget)
        curve = evaluate_found_path(path, self.model, self.bundle, eval_limit=self.size.eval_limit,
                                    bn_batches=self.size.bn_batches, sub_points=self.size.sub_points)
        loss = curve.values("train", "loss")
        ends = [float(loss[0]), float(loss[-1])]
        row = path_row(label, curve, path, max(ends), reached_b=path.info.get("reached_b") is not False)
        row["endpoint_train_loss"] = ends
        row["low_loss"] = bool(row["complete"] and row["dense_peak_train_loss"] <= max(ends) + LOW_LOSS_MARGIN)
        if "ticks_done" in path.info:
            row.update(ticks=path.info["ticks_done"], unreached_ticks=len(path.info.get("unreached_ticks", [])),
                       final_gap=path.info.get("final_gap"), threshold=path.info["threshold"]["value"],
                       verify_forwards=path.info.get("verify_forwards"))
        return row


def llpf_options(size: BudgetSize, pair: Pair, seed: int, budget: int, **change: Any) -> dict[str, Any]:
    """LLPF's settings for one path: the schedule left to the budget (:meth:`LLPFConfig.for_budget`), stage-wise FDF
    unlock groups, refinement until LLPF's relative target (the higher endpoint's loss as the run measures it +
    ``margin``), at most ``max_points`` stored points."""
    cross = pair.cross
    cfg = LLPFConfig(budget=budget).for_budget(cross=cross)
    ticks = cfg.ticks + (cfg.m2o_max_ticks if cross else 0)
    margin = {} if size.margin is None else {"threshold_margin": size.margin}
    return {"lr": size.lr, **margin, "min_steps": size.min_steps, "verify_batches": size.verify_batches,
            "closing_ticks": size.closing_ticks,
            "batch_size": 64, "seed": seed, "order": pair.groups,
            "record_every": max(1, math.ceil(ticks / size.max_points)), **change}


def method_call(size: BudgetSize, pair: Pair, cell: Cell) -> tuple[str, dict[str, Any]]:
    """The path method and its options for ``cell``."""
    if cell.label == "bezier":
        return "bezier", {"lr": 0.05, "batch_size": 64, "seed": cell.seed, "n_points": size.curve_points}
    if cell.label == "autoneb":
        return "autoneb", {"lr": 0.05, "batch_size": 64, "seed": cell.seed, "insert_probe": 5, "eval_batches": 2}
    change = ABLATIONS.get(cell.label.removeprefix("llpf "), {})
    return ("cross-sphere" if pair.cross else "llpf"), llpf_options(size, pair, cell.seed, cell.budget, **change)


def pair_names(size: BudgetSize) -> list[str]:
    return [f"{a}/wd" for a in size.archs] + ([f"{size.cross_arch}/cross"] if size.cross_arch else [])


def cells(size: BudgetSize) -> Iterator[Cell]:
    """Every path of the size, in the order run: repeat by repeat (so a time limit leaves whole sweeps of the first
    repeats), budgets ascending, every pair and method; the ablations (first seed, on the ``wd`` pairs) after the
    first repeat's sweep; Bezier and AutoNEB with the first ``baseline_repeats`` seeds only."""
    for i, seed in enumerate(size.seeds):
        methods = METHODS if size.baseline_repeats is None or i < size.baseline_repeats else METHODS[:1]
        for budget in sorted(size.budgets):
            for pair in pair_names(size):
                for method in methods:
                    yield Cell(pair, method, budget, seed)
        if i == 0:
            for name in size.ablations:
                for pair in pair_names(size)[:len(size.archs)]:
                    yield Cell(pair, f"llpf {name}", size.ablation_budget or max(size.budgets), seed)


def run_cells(size: BudgetSize, bundle: DatasetBundle, log: Log) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """Run every cell within the time limit: ``(rows, cells not run, the pairs' endpoints and linear rows)``."""
    trained: dict[str, list[nn.Module]] = {}
    pairs = {name: Pair(name, bundle, size, log, trained) for name in pair_names(size)}
    rows, skipped, start = [], [], time.perf_counter()
    for cell in cells(size):
        if size.time_limit_s is not None and time.perf_counter() - start > size.time_limit_s:
            skipped.append(asdict(cell))
            continue
        pair = pairs[cell.pair].ready()
        method, options = method_call(size, pair, cell)
        row = {**asdict(cell), **pair.row(cell.label, method, options, cell.budget)}
        rows.append(row)
        log(f"{cell.pair} {cell.label} budget {cell.budget} seed {cell.seed}: dense peak "
            f"{row['dense_peak_train_loss']:.4f} (endpoints ≤ {max(pair.ends):.4f}), complete {row['complete']}, "
            f"{row['grad_evals']} grad evals, {row['wall_time_s']:.0f} s")
    linear = {name: {"endpoint_train_loss": p.ends, "linear": p.linear, "fdf_groups": len(p.groups)}
              for name, p in pairs.items() if p.model is not None}
    return rows, skipped, linear


def run_llpf_budget(out: str | FsPath, *, quick: bool = False, data: str | FsPath | None = None,
                    overwrite: bool = False, size: BudgetSize | None = None, log: Log = print) -> dict[str, Any]:
    """Run the sweep (module docstring) and write its outputs into ``out`` (atomically). Returns the results dict
    (also ``results.json``): ``rows`` (one per path), ``summary`` (per pair, method and budget), ``first_low``
    (per pair and method, the first budget complete and low-loss in a majority of repeats), ``not_run``.

    Raises: ConfigError (torchvision or timm missing — before any work; an unknown architecture name)."""
    require_packages()
    size = size or SIZES["quick" if quick else "full"]
    for name in (*size.archs, *([size.cross_arch] if size.cross_arch else [])):
        ARCHS.get(name)
    start = time.perf_counter()
    with output_directory(out, overwrite) as tmp:
        bundle = load_dataset("fashion-mnist", data, limit_train=size.limit_train)
        rows, skipped, pairs = run_cells(size, bundle, log)
        results = {
            "task": "Peak train loss against gradient evaluations: LLPF, Bezier and AutoNEB (Fashion-MNIST, "
                    "docs/methods.md §2)",
            "size": asdict(size), "size_label": size_label(SIZES, size),
            "dataset": {"name": bundle.name, "train": len(bundle.train), "test": len(bundle.test)},
            "low_loss_margin": LOW_LOSS_MARGIN, "pairs": pairs, "rows": rows, "not_run": skipped,
        }
        results["summary"] = summarize(rows)
        results["first_low"] = first_low(results["summary"])
        plot_peak_vs_budget(curves_by_pair(results), tmp / "peaks.png", margin=LOW_LOSS_MARGIN)
        write_results(tmp, results, report, start)
    return results


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pair, label and budget: the dense peak over the higher endpoint (mean ± std over repeats), how many
    repeats were complete and low-loss, and the grad evals spent."""
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["pair"], r["method"], r["budget"]), []).append(r)
    out = []
    for (pair, label, budget), rs in groups.items():
        over = [r["dense_peak_train_loss"] - max(r["endpoint_train_loss"]) for r in rs]
        out.append({"pair": pair, "method": label, "budget": budget, "n": len(rs),
                    "dense_peak": mean_std([r["dense_peak_train_loss"] for r in rs]), "over_endpoints": mean_std(over),
                    "complete": sum(r["complete"] for r in rs), "low_loss": sum(r["low_loss"] for r in rs),
                    "grad_evals": round(float(np.mean([r["grad_evals"] for r in rs])))})
    return out


def first_low(summary: list[dict[str, Any]]) -> dict[str, dict[str, int | None]]:
    """``{pair: {method: the smallest budget at which a majority of repeats is complete and low-loss, or None}}``."""
    out: dict[str, dict[str, int | None]] = {}
    for s in sorted(summary, key=lambda s: s["budget"]):
        best = out.setdefault(s["pair"], {}).setdefault(s["method"], None)
        if best is None and 2 * s["low_loss"] > s["n"]:
            out[s["pair"]][s["method"]] = s["budget"]
    return out


def curves_by_pair(results: dict[str, Any]) -> dict[str, dict[str, list[tuple[int, float, float]]]]:
    """``{pair: {method: [(budget, mean dense peak − max endpoint, std), …]}}`` of the methods (not the ablations)."""
    out: dict[str, dict[str, list]] = {}
    for s in sorted(results["summary"], key=lambda s: s["budget"]):
        if s["method"] in METHODS:
            o = s["over_endpoints"]
            out.setdefault(s["pair"], {}).setdefault(s["method"], []).append((s["budget"], o["mean"], o["std"] or 0.0))
    return out


def summary_rows(results: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for s in sorted(results["summary"], key=lambda s: (s["pair"], s["method"] not in METHODS, s["method"],
                                                        s["budget"])):
        ends = max(results["pairs"][s["pair"]]["endpoint_train_loss"])
        rows.append([s["pair"], s["method"], s["budget"], s["grad_evals"], ends,
                     format_mean_std(s["dense_peak"], digits=4), f"{s['complete']}/{s['n']}",
                     f"{s['low_loss']}/{s['n']}"])
    return rows


SUMMARY_HEADER = ["pair", "method", "budget", "grad evals (mean)", "max endpoint", "dense peak (mean ± std)",
                  "complete", "low-loss"]


def _first_low_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    for pair, by in results["first_low"].items():
        lin = results["pairs"][pair]["linear"]["dense_peak_train_loss"]
        text = ", ".join(f"{m} {'at ' + str(b) if b is not None else 'not within the budgets run'}"
                         for m, b in by.items() if m in METHODS)
        lines.append(f"- **{pair}** (linear path's dense peak {lin:.4f}): first complete and low-loss in a majority "
                     f"of repeats — {text}.")
    return lines


def _margin(size: dict[str, Any]) -> str:
    return f"{THRESHOLD_MARGIN:g} (LLPF's relative target)" if size["margin"] is None else f"{size['margin']:g}"


def _verify_and_close(size: dict[str, Any]) -> str:
    """The report's words for LLPF's verification and closing points (empty where the size uses neither)."""
    parts = []
    if size.get("verify_batches"):
        parts.append(f"each tick's point also verified in the evaluation's terms (BatchNorm recomputed, eval mode) on "
                     f"{size['verify_batches']} fixed minibatches against the endpoints measured the same way")
    if size.get("closing_ticks"):
        parts.append(f"{size['closing_ticks']} closing points on the straight segment to B")
    return "".join(f", {p}" for p in parts)


def report(results: dict[str, Any]) -> str:
    size, skipped = results["size"], results["not_run"]
    lines = [
        f"# {results['task']}", "",
        f"Size: {results['size_label']} — {results['dataset']['train']} training examples, {size['epochs']} epochs "
        f"per endpoint; budgets {', '.join(map(str, size['budgets']))} gradient evaluations; repeat seeds "
        f"{', '.join(map(str, size['seeds']))}. LLPF: ≈ 2·√budget ticks, step 6/ticks, refinement lr "
        f"{size['lr']} until the higher endpoint's train loss + {_margin(size)} (at least {size['min_steps']} "
        f"steps, the budget's fair share at most){_verify_and_close(size)}, stage-wise FDF groups (at most {size['max_groups']}), at most "
        f"{size['max_points']} stored points. Bezier and AutoNEB: momentum 0.9 at lr 0.05. Evaluated on "
        f"{size['eval_limit']} examples per split, BatchNorm recomputed per point from {size['bn_batches']} "
        f"batches, {size['sub_points']} continuity sub-point(s) per segment.", "",
        f"*Complete*: reaches B, every segment passes the continuity check. *Low-loss*: complete and dense peak train "
        f"loss ≤ higher endpoint + {results['low_loss_margin']} nats. Peaks are dense peaks (points and sub-points).",
        "", *_first_low_lines(results), "",
        markdown_table(SUMMARY_HEADER, summary_rows(results)), "",
        "![dense peak over the endpoints against the budget](peaks.png)", "",
    ]
    if skipped:
        why = (f"time limit of {size['time_limit_s']:.0f} s reached" if size["time_limit_s"] is not None
               else "the run was stopped before them")
        lines += [f"**Not run** ({why}): {len(skipped)} paths — "
                  + "; ".join(f"{c['pair']} {c['label']} @ {c['budget']} seed {c['seed']}" for c in skipped) + ".", ""]
    return "\n".join(lines)


SIZES = {
    "quick": BudgetSize(archs=("shufflenetv2",), budgets=(12, 30), seeds=(0, 1), cross_arch="shufflenetv2",
                        limit_train=256, epochs=1, eval_limit=64, bn_batches=1, curve_points=3, linear_points=3,
                        min_steps=1, max_points=6, max_groups=3, ablations=("all-at-once",)),
    "full": BudgetSize(archs=("shufflenetv2", "regnet", "cct"), budgets=(250, 1000, 2500, 7500), seeds=(0, 1, 2),
                       cross_arch="regnet", limit_train=3000, epochs=6, eval_limit=300),
    # what two shared cores finish in about an hour: paths run in the full size's order until the time limit
    "two-cores": BudgetSize(archs=("shufflenetv2", "regnet", "cct"), budgets=(250, 1000, 5000), seeds=(0, 1, 2),
                            cross_arch="regnet", limit_train=2000, epochs=4, eval_limit=200, ablation_budget=1000,
                            time_limit_s=3000.0),
    # the acceptance claim at the largest budget alone: LLPF in three repeats, Bezier and AutoNEB beside its first;
    # every tick a stored point, the target at the endpoints' own loss, each tick verified in the evaluation's terms
    # and closing ticks to B, every path evaluated on the whole training set (docs/results/llpf-budget: points land
    # above a train-mode stop statistic, refined points drift from B, and the peak of 280 models evaluated on 200
    # examples carries their sampling noise)
    "acceptance": BudgetSize(archs=("shufflenetv2", "regnet", "cct", "mobilenetv2", "dla34"), budgets=(5000,),
                             seeds=(0, 1, 2), cross_arch="regnet", limit_train=2000, epochs=4, eval_limit=2000,
                             margin=0.0, max_points=1000, ablations=(), baseline_repeats=1, verify_batches=8,
                             closing_ticks=8),
}

register_experiment(Experiment("llpf-budget", __doc__, SIZES, run_llpf_budget, report,
                               ("report.md", "results.json", "peaks.png"),
                               {"epochs": "epochs", "limit_train": "limit_train"},
                               why_not="every architecture has its own reduced width"))
