"""Neuron-identifiability experiments (docs/methods.md §1): when does *unaligned* LMC appear?

- ``identifiability-sigma``: W-asymmetric MLPs on MNIST for σ_F ∈ {0, 0.25, 0.5, 1, 2} and a standard MLP;
  unaligned vs weight-matched barrier, identity/optimal activation-matching ratio, test accuracy.
- ``identifiability-k``: synthetic Gaussian mixtures on a k-dimensional subspace at σ_F = 1; first-layer
  swap costs (realization costs of the other neurons' features) and the unaligned accuracy drop vs k.
- ``identifiability-coherence``: mask-only networks (σ_F = 0) on synthetic data of rising subspace
  coherence ν(U); unaligned barrier vs ν(U).
- ``identifiability-resnet``: W-asymmetric vs standard ResNet20 on Fashion-MNIST (BatchNorm reset).

Each trains ``pairs`` model pairs per setting (two init seeds, one shared mask seed) and writes
``results.json`` (per pair and mean ± std), ``report.md`` and figures. Barriers are ``barrier_mean`` and
``barrier_interp`` of the *test loss* (cross-entropy, nats); accuracy drops are relative, in percent.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

from ..data import DatasetBundle, load_dataset, make_loader, subspace_mixture
from ..identifiability import center_separation, realization_cost, subspace_coherence, swap_costs
from ..match import activation_matching, weight_matching
from ..path import evaluate_model, evaluate_path
from ..report import markdown_table
from ..report.stats import format_mean_std
from ..symmetry import symmetry_spec
from .output import output_directory, write_json
from .training import train_models
from .registry import Experiment, register_experiment, size_label

Log = Callable[[str], None]


@dataclass(frozen=True)
class Size:
    """Everything that differs between ``--quick`` (CI) and the full run."""

    pairs: int
    epochs: int
    width: float
    limit_train: int | None
    lambdas: int
    settings: tuple
    limit_test: int | None = None


ADAMW = dict(optimizer="adamw", lr=1e-3, weight_decay=0.01, schedule="cosine", batch_size=128)  # reference optimiser


# ---------------------------------------------------------------------------------------------- shared steps
def train_pair(arch: str, kwargs: dict, bundle: DatasetBundle, epochs: int, pair: int, train: dict = ADAMW) -> list[nn.Module]:
    """Two models of one architecture from init seeds ``2·pair`` and ``2·pair+1`` (the mask seed, if any,
    is part of ``kwargs`` and shared)."""
    return train_models(arch, bundle, (2 * pair, 2 * pair + 1), {"epochs": epochs, **train}, **kwargs)


def _end_loss(curve) -> float:
    """The test loss at λ = 1 (model B as the path sees it: aligned, where the path is)."""
    return float(curve.finite_values("test", "loss")[-1])


def pair_metrics(a: nn.Module, b: nn.Module, bundle: DatasetBundle, lambdas: int, *,
                 activation_barrier: bool = False) -> dict[str, Any]:
    """Unaligned and weight-matched barriers on test loss, accuracy drops, identity/optimal AM ratio, the endpoints'
    test loss (``endpoint_loss`` [A, B]; ``aligned_endpoint_loss``: weight-matched B); with ``activation_barrier``
    also the barrier after activation matching (``activation_barrier_mean`` / ``_interp``,
    ``activation_endpoint_loss``)."""
    x0 = bundle.train.tensors[0][:2]
    spec = symmetry_spec(a, x0)
    test = {"test": make_loader(bundle.test, 1000)}
    bn_loader = make_loader(bundle.train, 256, shuffle=True, seed=0)
    sa, sb = a.state_dict(), b.state_dict()
    path = lambda sd: evaluate_path(a, sa, sd, test, lambdas=lambdas, bn_loader=bn_loader, bn_batches=10)  # noqa: E731
    naive = path(sb)
    aligned = path(weight_matching(spec, sa, sb).apply(sb))
    am = activation_matching(spec, a, b, make_loader(bundle.train, 1000), max_batches=5)
    ratios = [r for r in am.stats["identity_ratio"].values() if r is not None]
    extra = {}
    if activation_barrier:
        activation = path(am.apply(sb))
        extra = {"activation_barrier_mean": activation.barrier("mean", "test"),
                 "activation_barrier_interp": activation.barrier("interp", "test"),
                 "activation_endpoint_loss": _end_loss(activation)}
    return {**extra,
        "test_acc": [evaluate_model(m, test["test"])["acc"] for m in (a, b)],
        "unaligned_barrier_mean": naive.barrier("mean", "test"),
        "unaligned_barrier_interp": naive.barrier("interp", "test"),
        "aligned_barrier_mean": aligned.barrier("mean", "test"),
        "aligned_barrier_interp": aligned.barrier("interp", "test"),
        "endpoint_loss": [float(naive.finite_values("test", "loss")[0]), _end_loss(naive)],
        "aligned_endpoint_loss": _end_loss(aligned),
        "unaligned_acc_drop_pct": naive.accuracy_drop("test"),
        "aligned_acc_drop_pct": aligned.accuracy_drop("test"),
        "identity_ratio": float(np.mean(ratios)) if ratios else None,
        "identity_ratio_per_space": am.stats["identity_ratio"],
        "unaligned_curve": naive.to_json()["metrics"]["test"],
    }


def first_layer_swap_costs(model: nn.Module, U: torch.Tensor) -> dict[str, float]:
    """Swap-cost statistics of the first W-asymmetric layer on inputs in span(U).

    C[i, j] = c_i(a_j): the realization cost for neuron i of neuron j's learned feature a_j = Uᵀ w_eff,j
    (docs/methods.md §1); Δ for every transposition of the identity assignment (positive = the swap is costlier).
    """
    layer = next(m for m in model.modules() if hasattr(m, "fixed_offsets"))
    w_eff = layer.fixed_offsets + layer.fixed_mask * layer.weight.detach()
    U = U.to(torch.float64)
    a = w_eff.to(torch.float64) @ U
    C = realization_cost(U, layer.fixed_offsets, layer.fixed_mask, a)
    delta = swap_costs(C)
    off = delta[~torch.eye(len(delta), dtype=torch.bool)]
    off = off[torch.isfinite(off)]
    sep = center_separation(U, layer.fixed_offsets)
    return {
        "swap_cost_median": float(off.median()),
        "swap_cost_mean": float(off.mean()),
        "swap_positive_fraction": float((off > 0).double().mean()),
        "self_cost_median": float(C.diagonal().median()),
        "center_nn_ratio": float(sep["nn_mean_ratio"]) if "nn_mean_ratio" in sep else None,
    }


def aggregate(rows: list[dict], keys: list[str]) -> dict[str, dict[str, float]]:
    """mean ± std (population, ddof 0) and n over pairs of each numeric key."""
    out = {}
    for k in keys:
        vals = np.array([np.mean(r[k]) if isinstance(r[k], list) else r[k] for r in rows if r.get(k) is not None], float)
        out[k] = {"mean": float(vals.mean()) if len(vals) else None, "std": float(vals.std()) if len(vals) else None,
                  "n": len(vals)}
    return out


def _pm(agg: dict, key: str, scale: float = 1.0, digits: int = 3) -> str:
    """"mean ± std", or the mean alone for a single pair (no spread to show)."""
    return format_mean_std(agg[key], scale, digits)


# ---------------------------------------------------------------------------------------------- experiments
SIGMA_SIZES = {
    "quick": Size(pairs=1, epochs=2, width=64, limit_train=4000, lambdas=5, settings=(None, 0.0, 1.0)),
    "full": Size(pairs=3, epochs=8, width=512, limit_train=None, lambdas=11, settings=(None, 0.0, 0.25, 0.5, 1.0, 2.0)),
}
METRIC_KEYS = ["test_acc", "unaligned_barrier_mean", "unaligned_barrier_interp", "aligned_barrier_mean",
               "aligned_barrier_interp", "unaligned_acc_drop_pct", "aligned_acc_drop_pct", "identity_ratio"]


def sigma_sweep(size: Size, log: Log, data: Path | None = None) -> dict:
    """(a) σ_F sweep of W-MLPs on MNIST (LayerNorm, GELU, AdamW as the reference), plus the standard MLP."""
    bundle = load_dataset("mnist", data, limit_train=size.limit_train)
    settings = []
    for sigma in size.settings:
        rows = []
        for pair in range(size.pairs):
            kwargs = dict(depth=3, width=size.width, norm="layernorm", activation="gelu")
            if sigma is not None:
                kwargs["asymmetric"] = {"sigma_f": sigma, "density": 0.125, "mask_seed": 1000 + pair}
            label = "standard" if sigma is None else f"σ_F={sigma}"
            log(f"{label}: training pair {pair + 1}/{size.pairs}")
            rows.append(pair_metrics(*train_pair("mlp", kwargs, bundle, size.epochs, pair), bundle, size.lambdas))
        settings.append({"sigma_f": sigma, "label": "standard" if sigma is None else f"σ_F={sigma}",
                         "pairs": rows, "summary": aggregate(rows, METRIC_KEYS)})
    return {"experiment": "identifiability-sigma", "dataset": "mnist", "settings": settings}


K_SIZES = {
    "quick": Size(pairs=1, epochs=6, width=64, limit_train=3000, lambdas=5, settings=(2, 16)),
    "full": Size(pairs=3, epochs=15, width=256, limit_train=20000, lambdas=11, settings=(2, 4, 8, 16, 32)),
}


def k_sweep(size: Size, log: Log, data: Path | None = None, d: int = 64, num_classes: int = 10,
            class_sep: float = 3.0) -> dict:
    """(b) intrinsic dimension k at σ_F = 1 on synthetic Gaussian mixtures in R^d (``num_classes`` classes whose
    closest means are ``class_sep`` within-class standard deviations apart, :func:`~modeconn.data.subspace_mixture`)."""
    settings = []
    for k in size.settings:
        rows = []
        for pair in range(size.pairs):
            bundle, U = subspace_mixture(size.limit_train, max(1000, size.limit_train // 5), d, k, num_classes,
                                         class_sep=class_sep, seed=100 + pair)
            kwargs = dict(depth=2, width=size.width, asymmetric={"sigma_f": 1.0, "density": 0.125, "mask_seed": 1000 + pair})
            log(f"k={k}: training pair {pair + 1}/{size.pairs}")
            a, b = train_pair("mlp", kwargs, bundle, size.epochs, pair)
            row = pair_metrics(a, b, bundle, size.lambdas)
            row.update(first_layer_swap_costs(a, U))
            rows.append(row)
        keys = METRIC_KEYS + ["swap_cost_median", "swap_positive_fraction", "self_cost_median"]
        settings.append({"k": k, "label": f"k={k}", "pairs": rows, "summary": aggregate(rows, keys)})
    return {"experiment": "identifiability-k",
            "dataset": f"synthetic subspace mixture, d={d}, {num_classes} classes, class_sep={class_sep}, σ_F=1",
            "settings": settings}


COHERENCE_SIZES = {
    "quick": Size(pairs=1, epochs=6, width=64, limit_train=3000, lambdas=5, settings=(0.0, 1.0)),
    "full": Size(pairs=3, epochs=15, width=256, limit_train=20000, lambdas=11, settings=(0.0, 0.5, 0.8, 0.95, 1.0)),
}


def coherence_sweep(size: Size, log: Log, data: Path | None = None, d: int = 64, k: int = 8) -> dict:
    """(c) mask-only networks (F = 0, σ_F = 0) on data of rising subspace coherence ν(U)."""
    settings = []
    for c in size.settings:
        rows = []
        nu = None
        for pair in range(size.pairs):
            bundle, U = subspace_mixture(size.limit_train, max(1000, size.limit_train // 5), d, k, 10, coherence=c,
                                         seed=100 + pair)
            nu = subspace_coherence(U)
            kwargs = dict(depth=2, width=size.width, asymmetric={"sigma_f": 0.0, "density": 0.5, "mask_seed": 1000 + pair})
            log(f"coherence knob {c} (ν={nu:.2f}): training pair {pair + 1}/{size.pairs}")
            rows.append(pair_metrics(*train_pair("mlp", kwargs, bundle, size.epochs, pair), bundle, size.lambdas))
        settings.append({"coherence": c, "nu": nu, "label": f"ν={nu:.2f}", "pairs": rows,
                         "summary": aggregate(rows, METRIC_KEYS)})
    return {"experiment": "identifiability-coherence", "dataset": f"synthetic subspace mixture, d={d}, k={k}, F=0 (mask density 0.5)",
            "settings": settings}


RESNET_SIZES = {
    "quick": Size(pairs=1, epochs=1, width=0.5, limit_train=1000, lambdas=3, settings=(None, 1.0), limit_test=500),
    "full": Size(pairs=2, epochs=3, width=1, limit_train=12000, lambdas=7, settings=(None, 1.0), limit_test=2000),
}


def resnet_sweep(size: Size, log: Log, data: Path | None = None) -> dict:
    """(d) W-asymmetric vs standard BatchNorm ResNet20 on Fashion-MNIST."""
    bundle = load_dataset("fashion-mnist", data, limit_train=size.limit_train, limit_test=size.limit_test)
    settings = []
    for sigma in size.settings:
        rows = []
        for pair in range(size.pairs):
            kwargs = dict(width=float(size.width))
            if sigma is not None:
                kwargs["asymmetric"] = {"sigma_f": sigma, "density": 0.125, "mask_seed": 1000 + pair}
            log(f"resnet20 {'standard' if sigma is None else f'σ_F={sigma}'}: pair {pair + 1}/{size.pairs}")
            rows.append(pair_metrics(*train_pair("resnet20", kwargs, bundle, size.epochs, pair,
                                                 dict(optimizer="sgd", lr=0.05, batch_size=128)), bundle, size.lambdas))
        settings.append({"sigma_f": sigma, "label": "standard" if sigma is None else f"σ_F={sigma}", "pairs": rows,
                         "summary": aggregate(rows, METRIC_KEYS)})
    return {"experiment": "identifiability-resnet", "dataset": "fashion-mnist", "settings": settings}


EXPERIMENTS = {
    "identifiability-sigma": (sigma_sweep, SIGMA_SIZES),
    "identifiability-k": (k_sweep, K_SIZES),
    "identifiability-coherence": (coherence_sweep, COHERENCE_SIZES),
    "identifiability-resnet": (resnet_sweep, RESNET_SIZES),
}


# ---------------------------------------------------------------------------------------------- reporting
def report(results: dict) -> str:
    """Markdown table: one row per setting, mean ± std over pairs."""
    header = ["setting", "test acc %", "unaligned barrier_mean", "unaligned barrier_interp", "WM-aligned barrier_mean",
              "unaligned acc drop %", "identity/optimal AM"]
    rows = []
    for s in results["settings"]:
        a = s["summary"]
        rows.append([s["label"], _pm(a, "test_acc", 100, 2), _pm(a, "unaligned_barrier_mean"),
                     _pm(a, "unaligned_barrier_interp"), _pm(a, "aligned_barrier_mean"),
                     _pm(a, "unaligned_acc_drop_pct", 1, 2), _pm(a, "identity_ratio")])
    lines = [f"# {results['experiment']}", "", f"Data: {results['dataset']}; size: {results['size']}; "
             f"{results['pairs']} pair(s) per setting, mean ± std over pairs (population std; one pair: its value "
             "alone). Barriers on test loss (cross-entropy, nats): `barrier_mean` = max_λ L − ½(L_A+L_B), "
             "`barrier_interp` = max_λ [L − chord]; acc drop % = 100 · (max(acc_A, acc_B) − min_λ acc) / "
             "max(acc_A, acc_B).",
             "", markdown_table(header, rows), ""]
    if "swap_cost_median" in results["settings"][0]["summary"]:
        lines += ["## First-layer swap costs (realization costs, docs/methods.md §1)", "",
                  markdown_table(["setting", "median swap cost Δ", "fraction Δ > 0", "median self cost"],
                                 [[s["label"], _pm(s["summary"], "swap_cost_median"),
                                   _pm(s["summary"], "swap_positive_fraction"), _pm(s["summary"], "self_cost_median")]
                                  for s in results["settings"]]), ""]
    lines += ["![summary](summary.png)", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    from ..report.figures import pyplot

    plt = pyplot()

    labels = [s["label"] for s in results["settings"]]
    x = np.arange(len(labels))
    panels = [("unaligned_barrier_mean", "aligned_barrier_mean", "barrier_mean (test loss)"),
              ("identity_ratio", None, "identity / optimal AM objective"),
              ("test_acc", None, "test accuracy"),
              ("unaligned_acc_drop_pct", "aligned_acc_drop_pct", "relative accuracy drop (%)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (k1, k2, title) in zip(axes, panels, strict=False):
        for key, name in ((k1, "unaligned"), (k2, "weight-matched")):
            if key is None:
                continue
            agg = [s["summary"][key] for s in results["settings"]]
            m = [np.nan if a["mean"] is None else a["mean"] for a in agg]
            e = [0 if a["std"] is None else a["std"] for a in agg]
            ax.errorbar(x, m, yerr=e, marker="o", capsize=3, label=name)
        ax.set_xticks(x, labels, rotation=30)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if k2:
            ax.legend()
    fig.suptitle(results["experiment"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_identifiability(name: str, out: Path, *, quick: bool = False, pairs: int | None = None, epochs: int | None = None,
                        width: int | None = None, limit_train: int | None = None, data: Path | None = None,
                        overwrite: bool = False, log: Log = print) -> dict:
    """Run one identifiability experiment and write results.json, report.md and summary.png into ``out``.

    Raises ConfigError for an unknown ``name`` (with the valid names) before any work."""
    from ..errors import ConfigError

    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; valid: {', '.join(EXPERIMENTS)}")
    exp = _ENTRIES[name]
    size = exp.size(quick, pairs=pairs, epochs=epochs, width=width, limit_train=limit_train)
    return run_sweep(name, out, size=size, data=data, overwrite=overwrite, log=log)


def run_sweep(name: str, out: Path, *, size: Size, data: Path | None = None, overwrite: bool = False,
              log: Log = print) -> dict:
    """Run the identifiability experiment ``name`` at ``size``; writes results.json, report.md, summary.png."""
    fn, sizes = EXPERIMENTS[name]
    start = time.perf_counter()
    with output_directory(out, overwrite, command=f"experiment {name}") as tmp:
        results = fn(size, log, data)
        results.update(size=size_label(sizes, size), pairs=size.pairs, epochs=size.epochs, width=size.width,
                       limit_train=size.limit_train, seconds=time.perf_counter() - start)
        write_json(tmp / "results.json", results)
        plot(results, tmp / "summary.png")
        (tmp / "report.md").write_text(report(results))
    return results


_SUMMARIES = {  # docs/methods.md §1
    "identifiability-sigma": "W-asymmetric MLPs on MNIST over σ_F and a standard MLP: unaligned vs weight-matched "
                             "barrier, identity/optimal activation-matching ratio, accuracy",
    "identifiability-k": "synthetic Gaussian mixtures on a k-dimensional subspace: first-layer swap costs and "
                         "the unaligned accuracy drop vs k",
    "identifiability-coherence": "mask-only networks on data of rising subspace coherence ν(U): unaligned "
                                 "barrier vs ν(U)",
    "identifiability-resnet": "W-asymmetric vs standard BatchNorm ResNet20 on Fashion-MNIST",
}
_ENTRIES = {
    name: register_experiment(Experiment(
        name=name, doc=_SUMMARIES[name], sizes=sizes,
        run=functools.partial(run_sweep, name), report=report, outputs=("report.md", "results.json", "summary.png"),
        overrides={o: o for o in ("pairs", "epochs", "width", "limit_train")}))
    for name, (_, sizes) in EXPERIMENTS.items()
}
