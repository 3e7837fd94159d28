"""`modeconn experiment lmc-dm`: dual learned matching (LMC-DM, docs/methods.md §3) for a pair of language models.

Two GPT-NeoX-configured causal LMs are trained on the Austen text from seeds 0 and 1 (the training of
``transformer-wm``: :func:`modeconn.experiments.transformer_wm.train_pair`), their normalizations are absorbed
(:func:`~modeconn.symmetry.absorb_normalization`), and the full symmetry group is bound on the absorbed
models: orthogonal residual rotation, head permutation, per-head invertible QK and OV transforms, FFN
permutation (:data:`GROUPS`). Weight matching (WM) is computed **once** and passed as ``weight_alignment`` to
every learned run of the full group (it fixes the discrete parts and the ``init="weight"`` start).

Barrier table (held-out test blocks, next-token cross-entropy in nats per token, ``barrier_mean`` and
``barrier_interp``): naive (the models as trained), naive in the absorbed coordinates, WM (permutations: weight
matching with only the residual, head and FFN permutations, :data:`PERMUTATION_GROUPS`, on the same absorbed
models), WM (the full group), one-sided learned matching (Theus et al. 2025; B's continuous transforms learned) and
dual matching (both endpoints' transforms learned; the literal dual path ``(1−λ)·π_A(θ_A) + λ·π_B(θ_B)``, whose
endpoints compute the trained models' functions). Dual matching runs at half the one-sided learning rate
(:data:`DUAL_LR_SCALE`: the same effective step on the relative element), and every learned run sees the same
batches in the same order. Ablations at the same step budget: dual at the one-sided learning rate, dual without the
QK transforms (``qk=None``), without the OV transforms (``vo=None``), without the residual rotation
(``residual="permutation"``), and the parameterisation (Cayley = the main run, unconstrained, matrix exponential).
An ablation whose spec is a restriction of the full spec reuses WM's element restricted to its spaces; one with
another group (residual permutation) runs its own WM (``results["ablations"][k]["wm"]`` says which).

Sizes: ``--quick`` (CI, about a minute on two shared cores: a 2-layer × 64 LM on 400 training blocks, 40 matching
steps, 24 test blocks), the full size (:data:`SIZES` ``"full"``: 2 layers × 128, every training block for 2 epochs,
300 matching steps, 200 test blocks; tens of minutes on a laptop CPU) and ``--size large`` (4 layers × 256, 8
heads, MLP 1024, every training block for 1 epoch, 100 matching steps of 16 blocks, 200 test blocks, and only the
QK / OV / residual-rotation ablations (:attr:`DMSize.ablations`); the bigger pair, about an hour and a half on one
CPU thread).

Writes ``results.json``, ``report.md`` and ``lm_dm_barrier.png`` (held-out loss and accuracy vs λ for the main
methods).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from ..data import load_dataset, make_loader
from ..errors import ConfigError
from ..path import Curve, evaluate_path
from ..report import markdown_table, plot_curves
from .output import output_directory, write_results
from .transformer_wm import SIZES as LM_SIZES
from .transformer_wm import LMSize, train_pair
from .registry import Experiment, register_experiment

Log = Callable[[str], None]
#: the full group bound on the absorbed GPT-NeoX models
GROUPS = {"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible", "vo": "head_invertible",
          "ffn": "permutation"}
#: the permutation subgroup of :data:`GROUPS` (the "WM (permutations)" row): residual, head and FFN permutations,
#: no QK/OV transforms
PERMUTATION_GROUPS = {"residual": "permutation", "heads": "permutation", "qk": None, "vo": None, "ffn": "permutation"}
#: Adam learning rate of dual matching relative to one-sided matching (``lr``). Both methods reach the same optimum
#: (the gauge argument in :mod:`modeconn.match.dual`: the path's loss depends only on the relative element
#: ``g_A⁻¹∘g_B``), but dual matching moves that element through two charts, each updated by Adam at about ``lr``
#: per step, so at equal ``lr`` its effective step is about twice as large. Halving it compares the two at the same
#: effective step size; the ablation "dual at the one-sided lr" shows the other choice.
DUAL_LR_SCALE = 0.5


class Ablation(NamedTuple):
    """One dual-matching ablation: ``groups`` (overrides of :data:`GROUPS`), ``parameterization`` and ``lr_scale``
    (dual lr = ``lr_scale`` × the one-sided ``lr``)."""

    groups: dict[str, Any]
    parameterization: str = "cayley"
    lr_scale: float = DUAL_LR_SCALE


#: ablation label → :class:`Ablation`; all at the main run's step budget
ABLATIONS: dict[str, Ablation] = {
    "dual (full, cayley)": Ablation({}),
    "dual at the one-sided lr": Ablation({}, lr_scale=1.0),
    "dual without QK": Ablation({"qk": None}),
    "dual without OV": Ablation({"vo": None}),
    "dual without residual rotation": Ablation({"residual": "permutation"}),
    "dual (unconstrained)": Ablation({}, "unconstrained"),
    "dual (matrix_exp)": Ablation({}, "matrix_exp"),
}
MAIN = ("naive", "naive (absorbed)", "WM (permutations)", "WM", "one-sided learned", "dual")


@dataclass(frozen=True)
class DMSize:
    """``lm``: the language models and their training (also the test blocks and λ points); ``steps`` … ``lambda_schedule``:
    the learned matching (Adam steps of one ``batch_size`` batch of training blocks, λ ~ U(0, 1) per step);
    ``ablations``: the labels of :data:`ABLATIONS` run at this size (default all)."""

    lm: LMSize
    steps: int
    lr: float = 0.02
    batch_size: int = 16
    lambda_schedule: str = "uniform"
    ablations: tuple[str, ...] = tuple(ABLATIONS)

    def __post_init__(self) -> None:
        unknown = [a for a in self.ablations if a not in ABLATIONS]
        if unknown:
            raise ConfigError(f"unknown lmc-dm ablation(s) {unknown}; valid: {list(ABLATIONS)}")


SIZES = {
    "quick": DMSize(lm=replace(LM_SIZES["quick"], epochs=3, eval_blocks=24, lambdas=5), steps=40),
    "full": DMSize(lm=LM_SIZES["full"], steps=300, lr=0.01, batch_size=32),
    # the bigger pair: 4 layers × 256 (8 heads of 32), one epoch of every training block (about half an hour per
    # model on one shared CPU thread); the learned rows at 100 steps of 16 blocks, only the QK / OV / residual ablations
    "large": DMSize(lm=replace(LM_SIZES["full"], hidden_size=256, layers=4, heads=8, intermediate=1024, epochs=1),
                    steps=100, lr=0.01, batch_size=16,
                    ablations=("dual (full, cayley)", "dual without QK", "dual without OV",
                               "dual without residual rotation")),
}


def learned_options(size: DMSize) -> dict[str, Any]:
    """The learned-matching options of every learned row; ``lr`` is one-sided matching's, dual matching runs at
    ``lr × lr_scale`` of its :class:`Ablation` (:data:`DUAL_LR_SCALE` for the main row)."""
    return {"steps": size.steps, "lr": size.lr, "lambda_schedule": size.lambda_schedule, "init": "weight"}


def _restricted(spec, wm) -> tuple[Any, str]:
    """WM's element restricted to ``spec``'s spaces if that is a valid element of ``spec``; else None."""
    from ..errors import SpecError

    g = {s: wm.element[s] for s in spec.spaces if s in wm.element}
    if len(g) != len(spec.spaces):
        return None, "recomputed"
    try:
        spec.check_element(g)
    except (SpecError, ConfigError, ValueError):
        return None, "recomputed"
    return g, "restricted from the full-group WM"


def barrier_row(c: Curve) -> dict[str, Any]:
    """One barrier-table row of a path's held-out (``"test"`` split) curve.

    Loss entries are in the curve's loss units (nats; per token for language models): ``barrier_mean`` and
    ``barrier_interp`` (:meth:`~modeconn.path.Curve.barrier`), ``excess_mean`` (mean over λ of the loss above
    the chord between the endpoints), ``endpoint_loss`` ``[λ=0, λ=1]`` and ``midpoint_loss`` (the middle λ
    point). Accuracy entries are fractions: ``acc_barrier_mean`` / ``acc_barrier_interp`` (the barriers of the
    error ``1 − acc``, i.e. the accuracy lost along the path), ``endpoint_acc``, ``midpoint_acc`` and
    ``min_acc`` (the lowest accuracy anywhere on the λ grid)."""
    loss = np.asarray(c.values("test", "loss"), dtype=float)
    acc = np.asarray(c.values("test", "acc"), dtype=float)
    lam = np.asarray(c.lambdas, dtype=float)
    excess = loss - ((1 - lam) * loss[0] + lam * loss[-1])
    mid = len(c.lambdas) // 2
    return {"excess_mean": float(excess.mean()), "barrier_mean": c.barrier("mean", "test"),
            "barrier_interp": c.barrier("interp", "test"), "endpoint_loss": [float(loss[0]), float(loss[-1])],
            "midpoint_loss": float(loss[mid]), "acc_barrier_mean": c.barrier("mean", "test", "error"),
            "acc_barrier_interp": c.barrier("interp", "test", "error"), "endpoint_acc": [float(acc[0]), float(acc[-1])],
            "midpoint_acc": float(acc[mid]), "min_acc": float(acc.min())}


def dm_barriers(models: list[nn.Module], evl: Mapping[str, Any], train_loader: Callable[[], Iterable], *, lambdas: int,
                opts: Mapping[str, Any], groups: Mapping[str, Any], ablations: Mapping[str, Ablation], log: Log,
                permutation_groups: Mapping[str, Any] = PERMUTATION_GROUPS
                ) -> tuple[dict[str, Curve], dict[str, Curve], dict[str, Any]]:
    """Barriers of the main methods (:data:`MAIN`) and of dual-matching ablations for a pair of HF-backed models.

    Args:
        models: ``[A, B]``, the same architecture wrapping a Hugging Face model that
            :func:`~modeconn.symmetry.absorb_normalization` supports (e.g. ``gpt-neox-tiny``, ``vit-tiny``).
        evl: the evaluation loaders of :func:`~modeconn.path.evaluate_path` (must hold ``"test"``).
        train_loader: makes the loader the learned transforms are fitted on; called once per learned run, so every
            run sees the same batches in the same order (a shared seeded loader would continue its shuffle).
        lambdas: λ points on each path.
        opts: :func:`learned_options` (``steps``, ``lr``, ``lambda_schedule``, ``init``).
        groups: the full group bound on the absorbed models (``hf_symmetry_spec(groups=...)``).
        ablations: label → :class:`Ablation` of extra dual-matching runs; ``Ablation({})`` is the main dual run
            (not rerun).
        permutation_groups: the permutation subgroup bound for the "WM (permutations)" row (its own weight
            matching on the same absorbed models).
    Returns: (main curves by label, ablation curves by label, stats: seconds/objectives per stage and, under
        ``"ablation_wm"``, where each ablation's weight-matching element came from).
    Raises: what absorption, the spec builder, weight matching and dual matching raise (see those).
    """
    from ..match import dual_matching, one_sided_matching, weight_matching
    from ..symmetry import absorb_normalization
    from ..symmetry.hf import hf_symmetry_spec

    a, b = models
    curves: dict[str, Curve] = {}
    stats: dict[str, Any] = {}
    steps = opts["steps"]

    curves["naive"] = evaluate_path(a, a.state_dict(), b.state_dict(), evl, lambdas=lambdas)
    abs_a, abs_b = absorb_normalization(a), absorb_normalization(b)
    sa, sb = abs_a.state_dict(), abs_b.state_dict()
    curves["naive (absorbed)"] = evaluate_path(abs_a, sa, sb, evl, lambdas=lambdas)
    _weight_matching_row("WM (permutations)", abs_a, sa, sb, permutation_groups, evl, lambdas, curves, stats, log)
    spec, wm = _weight_matching_row("WM", abs_a, sa, sb, groups, evl, lambdas, curves, stats, log)

    def learned(label: str, fn, sp, weight_alignment, **extra) -> Any:
        t = time.perf_counter()
        res = fn(sp, abs_a, sa, sb, train_loader(), weight_alignment=weight_alignment, **(dict(opts) | extra))
        seconds = time.perf_counter() - t
        if fn is one_sided_matching:
            c = evaluate_path(abs_a, sa, res.apply(sb), evl, lambdas=lambdas)
        else:  # the literal dual path: both endpoints transformed (each keeps its model's function)
            c = evaluate_path(abs_a, res.apply_a(sa), res.apply_b(sb), evl, lambdas=lambdas)
        stats[label] = {"seconds": seconds, "objective": res.objective, "steps": steps,
                        "first_loss": float(res.history[0][0]), "spaces": len(sp.spaces),
                        "max_output_change": [res.stats.get("max_output_change_a"), res.stats.get("max_output_change_b")]}
        log(f"{label}: {steps} steps in {seconds:.1f} s, objective {res.objective:.4f}")
        return c

    curves["one-sided learned"] = learned("one-sided learned", one_sided_matching, spec, wm)
    dual_lr = opts["lr"] * DUAL_LR_SCALE
    curves["dual"] = learned("dual", dual_matching, spec, wm, parameterization="cayley", lr=dual_lr)

    out: dict[str, Curve] = {}
    for label, (changes, par, lr_scale) in ablations.items():
        if not changes and par == "cayley" and lr_scale == DUAL_LR_SCALE:
            out[label] = curves["dual"]
            stats.setdefault("ablation_wm", {})[label] = "the full-group WM"
            continue
        sp = spec if not changes else hf_symmetry_spec(abs_a, groups=dict(groups) | changes)
        g, how = (wm, "the full-group WM") if sp is spec else _restricted(sp, wm)
        if g is None:
            g = weight_matching(sp, sa, sb)
        stats.setdefault("ablation_wm", {})[label] = how
        out[label] = learned(label, dual_matching, sp, g, parameterization=par, lr=opts["lr"] * lr_scale)
    return curves, out, stats


def _weight_matching_row(label: str, abs_a: nn.Module, sa: Mapping[str, torch.Tensor], sb: Mapping[str, torch.Tensor],
                         groups: Mapping[str, Any], evl: Mapping[str, Any], lambdas: int, curves: dict[str, Curve],
                         stats: dict[str, Any], log: Log) -> tuple[Any, Any]:
    """Weight matching of the absorbed pair under ``groups``: its curve and stats recorded under ``label``; returns
    ``(spec, alignment)``."""
    from ..match import weight_matching
    from ..symmetry.hf import hf_symmetry_spec

    t0 = time.perf_counter()
    spec = hf_symmetry_spec(abs_a, groups=dict(groups))
    wm = weight_matching(spec, sa, sb)
    stats[label] = {"seconds": time.perf_counter() - t0, "objective": wm.objective, "spaces": len(spec.spaces)}
    curves[label] = evaluate_path(abs_a, sa, wm.apply(sb), evl, lambdas=lambdas)
    log(f"{label.replace('WM', 'weight matching')} done ({len(spec.spaces)} spaces)")
    return spec, wm


def lm_dm_barriers(size: DMSize, bundle, models: list[nn.Module], log: Log
                   ) -> tuple[dict[str, Curve], dict[str, Curve], dict[str, Any]]:
    """(main curves, ablation curves, stats) of the language-model pair: see the module docstring."""
    test = torch.utils.data.Subset(bundle.test, range(min(size.lm.eval_blocks, len(bundle.test))))
    evl = {"test": make_loader(test, 16)}
    def train_loader():
        return make_loader(bundle.train, size.batch_size, shuffle=True, seed=0)

    return dm_barriers(models, evl, train_loader, lambdas=size.lm.lambdas, opts=learned_options(size), groups=GROUPS,
                       ablations={k: ABLATIONS[k] for k in size.ablations}, log=log)


def dm_results(curves: Mapping[str, Curve], ablations: Mapping[str, Curve], stats: Mapping[str, Any]) -> dict[str, Any]:
    """The results.json entries shared by the LMC-DM experiments: ``barriers`` / ``ablations`` (label →
    :func:`barrier_row`; ablations also name their WM source), ``stats``, ``curves`` / ``ablation_curves``
    (:meth:`~modeconn.path.Curve.to_json`)."""
    return {
        "barriers": {k: barrier_row(c) for k, c in curves.items()},
        "ablations": {k: barrier_row(c) | {"wm": stats.get("ablation_wm", {}).get(k)} for k, c in ablations.items()},
        "stats": {k: v for k, v in stats.items() if k != "ablation_wm"},
        "curves": {k: c.to_json() for k, c in curves.items()},
        "ablation_curves": {k: c.to_json() for k, c in ablations.items()},
    }


def run_lmc_dm(out: str | Path, *, quick: bool = False, data: str | Path | None = None, overwrite: bool = False,
               size: DMSize | None = None, log: Log = print) -> dict[str, Any]:
    """Run the experiment (module docstring) and write its outputs into ``out`` (atomically)."""
    size = size or SIZES["quick" if quick else "full"]
    start = time.perf_counter()
    with output_directory(out, overwrite) as tmp:
        lm = size.lm
        bundle = load_dataset("austen", data, vocab_size=lm.vocab_size, context_length=lm.context,
                              limit_train=lm.limit_train)
        t0 = time.perf_counter()
        models = train_pair(lm, bundle, log)
        train_seconds = time.perf_counter() - t0
        curves, ablations, stats = lm_dm_barriers(size, bundle, models, log)
        plot_curves(curves, tmp / "lm_dm_barrier.png", title="GPT-NeoX pair on Austen: held-out loss vs λ")
        results = {
            "task": "dual learned matching for language models (LMC-DM, docs/methods.md §3)",
            "size": asdict(size),
            "groups": GROUPS,
            "learned_options": learned_options(size),
            "data": {"train_blocks": len(bundle.train), "train_tokens": int(bundle.train.tensors[0].numel()),
                     "test_blocks": min(lm.eval_blocks, len(bundle.test))},
            "training": {"seconds": train_seconds, "epochs": lm.epochs, "optimizer": "adamw", "lr": lm.lr,
                         "batch_size": lm.batch_size},
        } | dm_results(curves, ablations, stats)
        write_results(tmp, results, report, start)
    return results


def report(r: dict[str, Any]) -> str:
    lm = r["size"]["lm"]
    return "\n".join([
        f"# {r['task']}",
        "",
        (f"GPT-NeoX pair ({lm['layers']} layers × {lm['hidden_size']}, {lm['heads']} heads, MLP {lm['intermediate']}, "
        f"vocab {lm['vocab_size']}, context {lm['context']}), seeds 0 and 1. **Training budget:** {lm['epochs']} "
        f"epoch(s) of AdamW (lr {lm['lr']}, batch {lm['batch_size']}) over {r['data']['train_blocks']} blocks "
        f"({r['data']['train_tokens']:,} tokens) of the Austen text, {r['training']['seconds']:.0f} s for both. "
        f"Losses are next-token cross-entropy (nats per token) on {r['data']['test_blocks']} held-out blocks, "
        f"{lm['lambdas']} points on each path."),
        "",
        *dm_report_sections(r, "training blocks"),
        "![loss vs λ](lm_dm_barrier.png)",
        "",
    ])


def dm_report_sections(r: Mapping[str, Any], batch_unit: str, accuracy: bool = False) -> list[str]:
    """report.md lines shared by the LMC-DM experiments: the group and learned-matching budget, the barrier
    table of the main methods, the ablation table and the seconds per stage. ``r``: results with the
    :func:`dm_results` entries, ``groups``, ``learned_options``, ``size.batch_size`` and ``seconds``;
    ``batch_unit``: what one batch element is (e.g. "training blocks"); ``accuracy``: add the accuracy
    columns of :func:`barrier_row`."""
    o = r["learned_options"]

    def rows(d: Mapping[str, Any]) -> list[list]:
        out = []
        for k, v in d.items():
            row = [k, v["barrier_mean"], v["barrier_interp"], v["excess_mean"], v["midpoint_loss"],
                   " / ".join(f"{x:.4f}" for x in v["endpoint_loss"])]
            if accuracy:
                row += [v["acc_barrier_mean"], v["min_acc"], " / ".join(f"{x:.4f}" for x in v["endpoint_acc"])]
            out.append(row)
        return out

    header = ["method", "barrier_mean (test loss)", "barrier_interp (test loss)", "mean excess over the chord",
              "midpoint loss", "endpoint losses"]
    if accuracy:
        header += ["accuracy barrier_mean (error)", "min accuracy on the path", "endpoint accuracies"]
    seconds = {k: v.get("seconds") for k, v in r["stats"].items()}
    return [
        (f"Group (absorbed models): {r['groups']}. WM computed once and used as every learned run's discrete part "
         f"and start. **Learned-matching budget:** {o['steps']} Adam steps (one-sided lr {o['lr']}, dual lr "
         f"{o['lr'] * DUAL_LR_SCALE:g} = {DUAL_LR_SCALE:g} × it: the same effective step on the relative element "
         f"g_A⁻¹∘g_B, see DUAL_LR_SCALE; batch {r['size']['batch_size']} {batch_unit}, λ {o['lambda_schedule']}, the "
         "same batches in the same order) for each learned row, ablations included."),
        "",
        "## Barriers",
        "",
        markdown_table(header, rows(r["barriers"])),
        "",
        "## Ablations (dual matching, same step budget)",
        "",
        markdown_table(header + ["WM"], [row + [r["ablations"][row[0]]["wm"]] for row in rows(r["ablations"])]),
        "",
        "Seconds per stage: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items() if v is not None)
        + f"; total {r['seconds']:.0f} s.",
        "",
    ]


register_experiment(Experiment("lmc-dm", __doc__, SIZES, run_lmc_dm, report,
                               ("report.md", "results.json", "lm_dm_barrier.png"),
                               {"epochs": "lm.epochs", "width": "lm.hidden_size", "limit_train": "lm.limit_train"},
                               why_not="one pair of language models"))
