"""`modeconn experiment symmetry-breaking`: which symmetry-breaking methods give unaligned LMC (docs/methods.md §1).

The neuron-identifiability paper's remaining parts: its baselines, its k-sweep (b) and its ViT results (d).

Three parts, one report:

- **methods** (:data:`VARIANTS`): MLPs on MNIST (3 hidden layers, LayerNorm, AdamW as ``identifiability-sigma``),
  standard; W-asymmetric (σ_F = 1, 12.5 % of each row fixed); sparse-mask (the same mask, σ_F = 0); σ-asymmetric
  (FiGLU ``x ⊙ sigmoid(Cx)`` with a fixed random C, Lim et al. 2024); syre (a fixed random anchor θ₀ on every
  weight, ``W_eff = θ₀ + W``, with weight decay on W: Ziyin et al.'s ``L(θ + θ₀) + γ‖θ‖²``). Per pair of
  independently trained networks (init seeds 2p, 2p + 1; the fixed structure shared, seeded 1000 + p): the
  unaligned test-loss barrier, and, where the *function* keeps a permutation symmetry, the barrier after weight
  matching the folded effective weights (:func:`~modeconn.models.fold_fixed_structure`; none for FiGLU, whose
  gate matrix no permutation of the hidden units commutes with).
- **vit**: ``vit-tiny`` on Fashion-MNIST, standard vs W-asymmetric linears (``asymmetric`` option of the ViT).
- **k**: the intrinsic-dimension sweep of ``identifiability-k`` (W-asymmetric MLPs, σ_F = 1, on a k-dimensional
  Gaussian mixture) at settings closer to the seed paper's (more classes, weaker separation, higher ambient
  dimension), next to the paper's unaligned accuracy drops (:data:`PAPER_K_DROPS`).

Barriers: ``barrier_mean`` of the test cross-entropy (nats) along the linear path; accuracy drops relative, in %.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from ..data import DatasetBundle, load_dataset, make_loader
from ..match import weight_matching
from ..models import fold_fixed_structure
from ..path import evaluate_model, evaluate_path
from ..report import markdown_table
from ..report.stats import format_mean_std, mean_std
from ..symmetry import symmetry_spec
from . import identifiability
from .output import output_directory, write_results
from .registry import Experiment, register_experiment, size_label
from .training import train_models

Log = Callable[[str], None]

PAPER_K_DROPS = {2: 46.4, 8: 15.7, 32: 6.1}
"""Unaligned accuracy drop (%, relative) of W-asymmetric MLPs at σ_F = 1 on the seed paper's k-sweep."""


@dataclass(frozen=True)
class Variant:
    """One symmetry-breaking method: model kwargs for pair ``p`` (``kwargs(p)``), training overrides, and whether
    the folded function keeps the permutation symmetry (then the weight-matched barrier is measured)."""

    name: str
    doc: str
    kwargs: Callable[[int], dict[str, Any]]
    train: Mapping[str, Any] = field(default_factory=dict)
    aligned: bool = True


def _asym(pair: int, **cfg: Any) -> dict[str, Any]:
    return {"activation": "gelu", "asymmetric": {"mask_seed": 1000 + pair, **cfg}}


SYRE_SIGMAS = (0.01, 0.05)
"""Standard deviations of syre's anchor θ₀ (absolute): below and above the scale of the default initialisation of W
at width 256 (about 0.02–0.04), where the anchor, shared by the two runs of a pair, is most of their initial W_eff."""
SYRE_WEIGHT_DECAY = 0.1
"""syre's γ: AdamW's decoupled weight decay on W (ten times the reference optimiser's 0.01 of the other variants)."""


def _syre(sigma: float, decay: float) -> Variant:
    name = f"syre (θ₀ σ {sigma})" if decay else f"anchor only (θ₀ σ {sigma}, no decay)"
    doc = (f"W_eff = θ₀ + W, θ₀ ~ N(0, {sigma}²) on every weight, AdamW weight decay {decay} on W"
           + ("" if decay else " (ablation: the shared anchor without syre's regulariser)"))
    return Variant(name, doc, lambda p: _asym(p, sigma_f=sigma, density=0.0, offsets="dense"),
                   train={"weight_decay": decay})


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("standard", "stock linears, GELU", lambda p: {"activation": "gelu"}),
    Variant("W-asymmetric", "W_eff = F + D ⊙ W, σ_F = 1, 12.5 % of each row fixed",
            lambda p: _asym(p, sigma_f=1.0, density=0.125)),
    Variant("sparse-mask", "the same mask D, F = 0 (σ_F = 0)", lambda p: _asym(p, sigma_f=0.0, density=0.125)),
    Variant("σ-asymmetric (FiGLU)", "stock linears, FiGLU x ⊙ sigmoid(Cx) with a fixed C ~ N(0, 1) per layer",
            lambda p: {"sigma_asymmetric": {"gate_seed": 1000 + p}}, aligned=False),
    *(_syre(sigma, SYRE_WEIGHT_DECAY) for sigma in SYRE_SIGMAS),
    _syre(SYRE_SIGMAS[-1], 0.0),
)}
"""The methods compared, by name (the table's rows, in order)."""

VIT_VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("standard", "Hugging Face's stock linears", lambda p: {}),
    Variant("W-asymmetric", "every linear and the patch projection W-asymmetric, σ_F = 1, 12.5 % fixed",
            lambda p: {"asymmetric": {"sigma_f": 1.0, "density": 0.125, "mask_seed": 1000 + p}}),
)}
"""The ViT pair of settings."""

VIT_ARCH = dict(patch_size=7, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
"""``vit-tiny`` as in ``check-calibration``'s ViT family (16 patches of 7 × 7 + CLS)."""


@dataclass(frozen=True)
class Size:
    """Everything that differs between ``--quick`` (CI) and the full run."""

    pairs: int
    epochs: int
    width: int
    limit_train: int | None
    limit_test: int | None
    lambdas: int
    vit_epochs: int
    vit_limit_train: int
    k: identifiability.Size
    k_dims: tuple[int, int, float] = (128, 32, 2.5)  # ambient d, classes, class separation


SIZES = {
    "quick": Size(pairs=2, epochs=2, width=64, limit_train=3000, limit_test=1000, lambdas=5, vit_epochs=2,
                  vit_limit_train=2000, k=identifiability.Size(pairs=1, epochs=6, width=64, limit_train=3000,
                                                               lambdas=5, settings=(2, 32))),
    "full": Size(pairs=2, epochs=5, width=256, limit_train=20000, limit_test=None, lambdas=11, vit_epochs=4,
                 vit_limit_train=8000, k=identifiability.Size(pairs=2, epochs=15, width=256, limit_train=20000,
                                                              lambdas=11, settings=(2, 8, 32))),
}


# ---------------------------------------------------------------------------------------------- measuring
def measure_pair(a: nn.Module, b: nn.Module, bundle: DatasetBundle, lambdas: int, aligned: bool) -> dict[str, Any]:
    """Endpoint test accuracies, the unaligned path and (``aligned``) the path after weight matching the folded
    effective weights of ``b`` to ``a``'s: barrier_mean / barrier_interp (nats) and relative accuracy drops (%)."""
    test = {"test": make_loader(bundle.test, 1000)}
    row: dict[str, Any] = {"test_acc": [evaluate_model(m, test["test"])["acc"] for m in (a, b)]}
    paths = {"unaligned": (a, a.state_dict(), b.state_dict())}
    if aligned:
        fa, fb = fold_fixed_structure(a), fold_fixed_structure(b)
        spec = symmetry_spec(fa, bundle.train.tensors[0][:2])
        sa, sb = fa.state_dict(), fb.state_dict()
        paths["aligned"] = (fa, sa, weight_matching(spec, sa, sb).apply(sb))
    for name, (model, sa, sb) in paths.items():
        curve = evaluate_path(model, sa, sb, test, lambdas=lambdas)
        row.update({f"{name}_barrier_mean": curve.barrier("mean", "test"),
                    f"{name}_barrier_interp": curve.barrier("interp", "test"),
                    f"{name}_acc_drop_pct": curve.accuracy_drop("test")})
    return row


KEYS = ["test_acc", "unaligned_barrier_mean", "unaligned_barrier_interp", "unaligned_acc_drop_pct",
        "aligned_barrier_mean", "aligned_barrier_interp", "aligned_acc_drop_pct"]


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict]:
    """mean ± sample std (ddof 1) and n over pairs of every key (a pair's two accuracies averaged)."""
    return {k: mean_std([float(np.mean(r[k])) for r in rows if r.get(k) is not None]) for k in KEYS}


def _compare(variants: Mapping[str, Variant], train_one: Callable[[Variant, int], tuple], size: Size,
             log: Log, what: str) -> list[dict[str, Any]]:
    settings = []
    for v in variants.values():
        rows = []
        for pair in range(size.pairs):
            log(f"{what} {v.name}: pair {pair + 1}/{size.pairs}")
            a, b, bundle = train_one(v, pair)
            rows.append(measure_pair(a, b, bundle, size.lambdas, v.aligned))
        settings.append({"label": v.name, "doc": v.doc, "pairs": rows, "summary": summarise(rows)})
    return settings


def methods(size: Size, log: Log, data: Path | None) -> list[dict[str, Any]]:
    """The MNIST MLP table over :data:`VARIANTS`."""
    bundle = load_dataset("mnist", data, limit_train=size.limit_train, limit_test=size.limit_test)

    def train_one(v: Variant, pair: int):
        kwargs = dict(depth=3, width=size.width, norm="layernorm", **v.kwargs(pair))
        train = {**identifiability.ADAMW, **v.train}
        return (*identifiability.train_pair("mlp", kwargs, bundle, size.epochs, pair, train), bundle)

    return _compare(VARIANTS, train_one, size, log, "MNIST MLP")


def vit(size: Size, log: Log, data: Path | None) -> list[dict[str, Any]]:
    """Standard vs W-asymmetric ``vit-tiny`` on Fashion-MNIST (AdamW as ``lmc-dm-vit``)."""
    bundle = load_dataset("fashion-mnist", data, limit_train=size.vit_limit_train, limit_test=size.limit_test)
    train = dict(epochs=size.vit_epochs, lr=3e-3, optimizer="adamw", weight_decay=0.05, batch_size=128,
                 warmup_epochs=0.05 * size.vit_epochs, grad_clip=1.0)

    def train_one(v: Variant, pair: int):
        models = train_models("vit-tiny", bundle, (2 * pair, 2 * pair + 1), train, **VIT_ARCH, **v.kwargs(pair))
        return (*models, bundle)

    return _compare(VIT_VARIANTS, train_one, size, log, "Fashion-MNIST vit-tiny")


def k_sweep(size: Size, log: Log, data: Path | None) -> dict[str, Any]:
    """``identifiability-k`` at the paper-like setting ``size.k_dims`` with the paper's drops alongside."""
    d, classes, sep = size.k_dims
    res = identifiability.k_sweep(size.k, log, data, d=d, num_classes=classes, class_sep=sep)
    for s in res["settings"]:
        s["paper_unaligned_acc_drop_pct"] = PAPER_K_DROPS.get(s["k"])
    return res


def run(out: Path, *, size: Size, data: Path | None = None, overwrite: bool = False, log: Log = print) -> dict:
    """All three parts at ``size``; writes results.json, report.md and summary.png into ``out`` atomically."""
    start = time.perf_counter()
    with output_directory(out, overwrite, command="experiment symmetry-breaking") as tmp:
        results = {"experiment": "symmetry-breaking", "size": size_label(SIZES, size), "pairs": size.pairs,
                   "methods": methods(size, log, data), "vit": vit(size, log, data), "k": k_sweep(size, log, data)}
        plot(results, tmp / "summary.png")
        write_results(tmp, results, report, start)
    return results


# ---------------------------------------------------------------------------------------------- reporting
def _pm(stat: dict, scale: float = 1.0, digits: int = 3) -> str:
    return format_mean_std(stat, scale, digits) if stat.get("n") else "—"


def _table(settings: list[dict[str, Any]]) -> str:
    header = ["setting", "n", "test acc % (A, B mean)", "unaligned barrier_mean", "unaligned acc drop %",
              "aligned barrier_mean (WM, folded)", "aligned acc drop %"]
    rows = [[s["label"], s["summary"]["unaligned_barrier_mean"]["n"], _pm(s["summary"]["test_acc"], 100, 2),
             _pm(s["summary"]["unaligned_barrier_mean"]), _pm(s["summary"]["unaligned_acc_drop_pct"], 1, 2),
             _pm(s["summary"]["aligned_barrier_mean"]), _pm(s["summary"]["aligned_acc_drop_pct"], 1, 2)]
            for s in settings]
    return markdown_table(header, rows)


def _k_table(res: dict[str, Any]) -> str:
    header = ["k", "n", "test acc %", "unaligned acc drop % (here)", "unaligned acc drop % (paper)",
              "unaligned barrier_mean", "median swap cost Δ", "fraction Δ > 0"]
    rows = []
    for s in res["settings"]:
        paper = s["paper_unaligned_acc_drop_pct"]
        stat = lambda key: mean_std([float(np.mean(r[key])) for r in s["pairs"]])  # noqa: E731
        rows.append([s["k"], len(s["pairs"]), _pm(stat("test_acc"), 100, 2), _pm(stat("unaligned_acc_drop_pct"), 1, 2),
                     "—" if paper is None else f"{paper:.1f}", _pm(stat("unaligned_barrier_mean")),
                     _pm(stat("swap_cost_median")), _pm(stat("swap_positive_fraction"))])
    return markdown_table(header, rows)


def report(results: dict[str, Any]) -> str:
    """Markdown: the methods table, the ViT pair, the k-sweep next to the paper's drops."""
    variants = "; ".join(f"**{s['label']}**: {s['doc']}" for s in results["methods"])
    return "\n".join([
        "# symmetry-breaking", "",
        f"Size: {results['size']}; {results['seconds']:.0f} s. Mean ± sample std over independently trained pairs "
        "(n pairs; one pair: its value alone). Barriers: test cross-entropy `barrier_mean` = max_λ L − ½(L_A + L_B) "
        "(nats) on the linear path; acc drop % = 100 · (max endpoint acc − min_λ acc) / max endpoint acc. "
        "Aligned: weight matching of the folded effective weights (the function's permutation symmetry); "
        "— where the function has none (FiGLU).", "",
        "## Symmetry-breaking methods: MLPs on MNIST", "", variants, "", _table(results["methods"]), "",
        "## vit-tiny on Fashion-MNIST: standard vs W-asymmetric linears", "", _table(results["vit"]), "",
        f"## Intrinsic dimension k ({results['k']['dataset']})", "",
        "Paper: W-asymmetric MLPs at σ_F = 1 on its synthetic mixtures (its exact mixture settings are not ours; "
        "see the findings in docs/results/index.md).", "",
        _k_table(results["k"]), "", "![summary](summary.png)", ""])


def plot(results: dict[str, Any], path: Path) -> None:
    """Unaligned vs aligned barrier per method and for the ViT pair; the k-sweep's drop next to the paper's."""
    from ..report.figures import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [3, 1.4, 1.6]})
    for ax, part in zip(axes[:2], ("methods", "vit"), strict=True):
        labels = [s["label"] for s in results[part]]
        x = np.arange(len(labels))
        for off, key in ((-0.2, "unaligned_barrier_mean"), (0.2, "aligned_barrier_mean")):
            stats = [s["summary"][key] for s in results[part]]
            ax.bar(x + off, [np.nan if s["mean"] is None else s["mean"] for s in stats], 0.4,
                   yerr=[0 if s["std"] is None else s["std"] for s in stats], capsize=3, label=key.split("_")[0])
        ax.set_xticks(x, labels, rotation=20, fontsize=8)
        ax.set_ylabel("test barrier_mean (nats)")
        ax.set_title("MNIST MLPs" if part == "methods" else "Fashion-MNIST vit-tiny")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    ks = [s["k"] for s in results["k"]["settings"]]
    here = [mean_std([r["unaligned_acc_drop_pct"] for r in s["pairs"]]) for s in results["k"]["settings"]]
    axes[2].errorbar(ks, [h["mean"] for h in here], yerr=[h["std"] or 0 for h in here], marker="o", label="here")
    axes[2].plot(list(PAPER_K_DROPS), list(PAPER_K_DROPS.values()), "s--", label="paper")
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("intrinsic dimension k")
    axes[2].set_ylabel("unaligned accuracy drop (%)")
    axes[2].set_title("k-sweep (W-asymmetric, σ_F = 1)")
    axes[2].legend(fontsize=8)
    axes[2].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


register_experiment(Experiment(
    name="symmetry-breaking", doc=__doc__, sizes=SIZES, run=run, report=report,
    outputs=("report.md", "results.json", "summary.png"),
    overrides={o: o for o in ("pairs", "epochs", "width", "limit_train")}))
