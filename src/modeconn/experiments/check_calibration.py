"""``modeconn experiment check-calibration``: how well ``modeconn check`` predicts measured barriers (docs/methods.md §1,
"Prediction").

A population of model pairs in families (:data:`FAMILIES`): MNIST MLPs, standard and W-asymmetric over the σ_F grid;
fine-tunes of one MNIST MLP base; synthetic subspace mixtures over the intrinsic dimension k (σ_F = 1) and over the
coherence ν(U) (mask only, F = 0); standard and W-asymmetric BatchNorm ResNet20 on Fashion-MNIST; standard ViTs on
Fashion-MNIST. Per pair the measured unaligned, weight-matched and activation-matched test-loss ``barrier_mean``
(:func:`~modeconn.experiments.identifiability.pair_metrics`) and the diagnostics of
:func:`modeconn.diagnostics.check`. The predictor (:mod:`modeconn.diagnostics.predictor`) is fitted leaving one family
out at a time and scored on the family it did not see: Spearman ρ of predicted vs measured unaligned barrier and go /
no-go accuracy (barrier_mean < 0.1 nats), pooled over the held-out predictions; the same for the twin predictor (model
A alone) and for the predictions after weight and after activation matching, each fitted to its own measured barrier
(:data:`PREDICTORS`). The fit on every family is written as ``calibration`` (the coefficients
:mod:`modeconn.diagnostics.calibration` ships). The cost of ``check`` is timed against ``modeconn barrier`` (naive,
weight and activation matching, 25 λ) on the first pair.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..data import load_dataset, subspace_mixture
from ..diagnostics.check import check
from ..errors import ConfigError
from ..diagnostics.predictor import GO_THRESHOLD, fit_loglinear
from ..train import TrainConfig, fit
from .identifiability import ADAMW, pair_metrics, train_pair
from .output import output_directory, write_results
from .training import train_models
from .registry import EXPERIMENTS, Experiment, register_experiment, size_label  # noqa: F401

Log = Callable[[str], None]


@dataclass(frozen=True)
class Size:
    """Everything that differs between ``--quick`` (CI) and the full run."""

    pairs: int
    epochs: int
    width: int
    limit_train: int
    limit_test: int
    lambdas: int
    families: tuple[str, ...]
    sigmas: tuple[float | None, ...]
    ks: tuple[int, ...]
    coherences: tuple[float, ...]
    resnet_width: float = 0.5


@dataclass(frozen=True)
class Family:
    """A family of pairs: ``settings(size)`` → ``[(label, setting)]``; ``train(size, setting, pair, data)`` →
    ``(model_a, model_b, bundle)``."""

    name: str
    doc: str
    settings: Callable[[Size], Sequence[tuple[str, Any]]]
    train: Callable[..., tuple]


def _asym(sigma: float | None, pair: int, density: float = 0.125) -> dict:
    return {} if sigma is None else {"asymmetric": {"sigma_f": sigma, "density": density, "mask_seed": 1000 + pair}}


def _mnist(size: Size, data):
    return load_dataset("mnist", data, limit_train=size.limit_train, limit_test=size.limit_test)


def _mlp(size: Size, sigma, pair: int, data):
    bundle = _mnist(size, data)
    kwargs = dict(depth=3, width=size.width, norm="layernorm", activation="gelu", **_asym(sigma, pair))
    return (*train_pair("mlp", kwargs, bundle, size.epochs, pair), bundle)


def _finetunes(size: Size, _setting, pair: int, data):
    """Two fine-tunes (seeds 2p+1, 2p+2; one epoch at a tenth of the learning rate) of one base (seed 2p)."""
    bundle = _mnist(size, data)
    kwargs = dict(depth=3, width=size.width, norm="layernorm", activation="gelu")
    (base,) = train_pair("mlp", kwargs, bundle, size.epochs, pair)[:1]
    tunes = []
    for seed in (2 * pair + 1, 2 * pair + 2):
        m = copy.deepcopy(base).train()
        fit(m, bundle.train, TrainConfig(**{**ADAMW, "lr": ADAMW["lr"] / 10, "epochs": 1, "seed": seed}), progress=False)
        tunes.append(m.eval())
    return (*tunes, bundle)


def _mixture(size: Size, pair: int, k: int, coherence: float = 0.0):
    return subspace_mixture(size.limit_train, size.limit_test, 64, k, 10, coherence=coherence, seed=100 + pair)[0]


def _synthetic_k(size: Size, k: int, pair: int, data):
    bundle = _mixture(size, pair, k)
    return (*train_pair("mlp", dict(depth=2, width=size.width, **_asym(1.0, pair)), bundle, 2 * size.epochs, pair), bundle)


def _synthetic_coherence(size: Size, c: float, pair: int, data):
    bundle = _mixture(size, pair, 8, c)
    kwargs = dict(depth=2, width=size.width, **_asym(0.0, pair, density=0.5))
    return (*train_pair("mlp", kwargs, bundle, 2 * size.epochs, pair), bundle)


def _resnet(size: Size, sigma, pair: int, data):
    bundle = load_dataset("fashion-mnist", data, limit_train=size.limit_train, limit_test=size.limit_test)
    kwargs = dict(width=float(size.resnet_width), **_asym(sigma, pair))
    sgd = dict(optimizer="sgd", lr=0.05, batch_size=128)
    return (*train_pair("resnet20", kwargs, bundle, size.epochs, pair, sgd), bundle)


def _vit(size: Size, _setting, pair: int, data):
    """Two standard pre-LN ViTs (``vit-tiny``: 64 wide, 2 layers, 4 heads, 7 × 7 patches) as in ``lmc-dm-vit``."""
    bundle = load_dataset("fashion-mnist", data, limit_train=size.limit_train, limit_test=size.limit_test)
    train = dict(epochs=size.epochs, lr=3e-3, optimizer="adamw", weight_decay=0.05, batch_size=128,
                 warmup_epochs=0.05 * size.epochs, grad_clip=1.0)
    models = train_models("vit-tiny", bundle, (2 * pair, 2 * pair + 1), train, patch_size=7, hidden_size=64,
                          num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    return (*models, bundle)


def _sigma_label(s):
    return "standard" if s is None else f"σ_F={s}"


FAMILIES = {f.name: f for f in (
    Family("mlp-mnist", "MLPs (3 × width, LayerNorm, GELU) on MNIST, standard and W-asymmetric over σ_F",
           lambda s: [(_sigma_label(x), x) for x in s.sigmas], _mlp),
    Family("finetune-mnist", "two fine-tunes of one MNIST MLP base", lambda s: [("fine-tunes", None)], _finetunes),
    Family("synthetic-k", "W-asymmetric MLPs (σ_F = 1) on subspace mixtures over k (d = 64)",
           lambda s: [(f"k={k}", k) for k in s.ks], _synthetic_k),
    Family("synthetic-coherence", "mask-only MLPs (F = 0) on subspace mixtures (k = 8) over the coherence knob",
           lambda s: [(f"coherence={c}", c) for c in s.coherences], _synthetic_coherence),
    Family("resnet20-fmnist", "BatchNorm ResNet20, standard and W-asymmetric (σ_F = 1), on Fashion-MNIST",
           lambda s: [(_sigma_label(x), x) for x in (None, 1.0)], _resnet),
    Family("vit-fmnist", "standard pre-LN ViTs (vit-tiny) on Fashion-MNIST", lambda s: [("standard", None)], _vit),
)}
"""The population's families, by name."""


def measure_pair(family: str, label: str, pair: int, a, b, bundle, lambdas: int) -> dict[str, Any]:
    """Measured barriers (path evaluated) and ``check``'s diagnostics (path not evaluated) of one pair; ConfigError
    naming the pair when a diagnostic is undefined (its verdict "not applicable": nothing to fit)."""
    t0 = time.perf_counter()
    measured = pair_metrics(a, b, bundle, lambdas, activation_barrier=True)
    t1 = time.perf_counter()
    res = check(a, b, data=bundle, progress=False)
    t2 = time.perf_counter()
    why = res.prediction["not_applicable"] or res.prediction["twin"].get("not_applicable")
    if why:
        raise ConfigError(f"{family} {label}, pair {pair}: check's diagnostics are undefined, so the pair cannot "
                          f"calibrate the predictor: {why}")
    f = res.pair["features"]
    loss = float(np.mean([e["test_loss"] for e in res.endpoints]))
    return {
        "family": family, "setting": label, "pair": pair, "test_acc": measured["test_acc"], "test_loss": loss,
        "unaligned_barrier_mean": measured["unaligned_barrier_mean"], "aligned_barrier_mean": measured["aligned_barrier_mean"],
        "activation_barrier_mean": measured["activation_barrier_mean"],
        "x_identity": 1.0 - f["q_identity"], "x_weight": 1.0 - f["q_weight"], "x_optimal": 1.0 - f["q_optimal"],
        "x_identity_worst": 1.0 - min(s["q_identity"] for s in res.pair["spaces"].values()),
        "twin_feature": res.prediction["twin_feature"],
        "identity_ratio": f["identity_ratio"], "cka": f["cka"], "permutation_share": f["permutation_share"],
        "weight_cosine_identity": f["weight_cosine_identity"], "relationship": res.pair["relationship"]["name"],
        "k": next(iter(res.layers.values()))["k"], "coherence": next(iter(res.layers.values()))["coherence"],
        "check_seconds": t2 - t1, "measure_seconds": t1 - t0,
    }


@dataclass(frozen=True)
class Predictor:
    """One fitted line of ``check``: its diagnostic (row key ``x``, ``name``) and the measured barrier it predicts
    (row key ``target``, described by ``measured``)."""

    x: str
    name: str
    target: str
    measured: str


PREDICTORS = {
    "pair": Predictor("x_identity", "1 - mean unit correlation", "unaligned_barrier_mean", "unaligned"),
    "twin": Predictor("twin_feature", "min relative swap cost", "unaligned_barrier_mean", "unaligned (a twin)"),
    "weight_matched": Predictor("x_weight", "1 - mean unit correlation under weight matching's permutation",
                                "aligned_barrier_mean", "after weight matching"),
    "activation_matched": Predictor("x_optimal", "1 - mean unit correlation under activation matching's permutation",
                                    "activation_barrier_mean", "after activation matching"),
}
"""The predictors ``check`` ships (:mod:`modeconn.diagnostics.calibration`): each is fitted to its own measured
barrier — an aligned barrier is predicted by a line fitted to aligned barriers, not by the unaligned line."""


def _fit(rows: list[dict], which: str):
    p = PREDICTORS[which]
    return fit_loglinear(p.name, [r[p.x] for r in rows], [r[p.target] for r in rows])


def score(pred: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """Spearman ρ and go / no-go accuracy (both sides below :data:`GO_THRESHOLD` or both not) over the points."""
    from scipy.stats import spearmanr

    p, m = np.asarray(pred, float), np.asarray(measured, float)
    if len(p) == 0:
        return {"spearman": float("nan"), "go_accuracy": float("nan"), "n": 0}
    rho = float(spearmanr(p, m).statistic) if len(p) > 2 and np.ptp(p) > 0 and np.ptp(m) > 0 else float("nan")
    return {"spearman": rho, "go_accuracy": float(np.mean((p < GO_THRESHOLD) == (m < GO_THRESHOLD))), "n": len(p)}


TWIN_EXCLUDED = ("finetune-mnist",)
"""Families whose pairs are not independently trained twins: left out of the twin predictor's fit and scores."""


def held_out(rows: list[dict], which: str) -> dict[str, Any]:
    """Leave one family out: fit on the others, predict the held-out family's barriers (the predictor's own target);
    pooled and per-family scores."""
    p = PREDICTORS[which]
    if which == "twin":
        rows = [r for r in rows if r["family"] not in TWIN_EXCLUDED]
    rows = [r for r in rows if r.get(p.target) is not None]
    families = sorted({r["family"] for r in rows})
    preds: list[float] = []
    for r in rows:
        train = [q for q in rows if q["family"] != r["family"]]
        model = _fit(train, which) if len(train) >= 3 else None
        pred = float("nan") if model is None else model.predict(r[p.x])["barrier_mean"]
        r[f"heldout_{which}"] = pred
        preds.append(pred)
    ok = [i for i, v in enumerate(preds) if np.isfinite(v)]
    measured = [rows[i][p.target] for i in ok]
    out = {"pooled": score([preds[i] for i in ok], measured), "families": families,
           "per_family": {f: score([preds[i] for i in ok if rows[i]["family"] == f],
                                   [rows[i][p.target] for i in ok if rows[i]["family"] == f]) for f in families}}
    if p.target != PREDICTORS["pair"].target:  # the alternative: the unaligned pair line read at the aligned x
        pair_line = [_fit([q for q in rows if q["family"] != r["family"]], "pair").predict(r[p.x])["barrier_mean"]
                     for r in rows]
        out["pair_line"] = score(pair_line, [r[p.target] for r in rows])
    return out


def replicate_agreement(rows: list[dict]) -> dict[str, float]:
    """The noise ceiling of any predictor: Spearman ρ and go / no-go agreement of the measured unaligned barrier of
    pair 0 vs pair 1 across the settings that have both (two seeds of one setting)."""
    by = {}
    for r in rows:
        by.setdefault((r["family"], r["setting"]), {})[r["pair"]] = r["unaligned_barrier_mean"]
    both = [v for v in by.values() if 0 in v and 1 in v]
    if len(both) < 3:
        return {"spearman": float("nan"), "go_accuracy": float("nan"), "n": len(both)}
    return score([v[0] for v in both], [v[1] for v in both])


def time_cost(a, b, bundle, log: Log) -> dict[str, float]:
    """Wall seconds of ``check`` and of ``modeconn barrier``'s work (its comparison: naive, weight, activation;
    25 λ) on one pair."""
    from ..diagnostics.compare import compare_alignments

    t0 = time.perf_counter()
    check(a, b, data=bundle, progress=False)
    t1 = time.perf_counter()
    compare_alignments(a, a.state_dict(), b.state_dict(), bundle, ["naive", "weight", "activation"], progress=False)
    t2 = time.perf_counter()
    log(f"cost: check {t1 - t0:.1f} s, barrier {t2 - t1:.1f} s")
    return {"check_seconds": t1 - t0, "barrier_seconds": t2 - t1, "ratio": (t1 - t0) / (t2 - t1)}


def calibrate(size: Size, log: Log, data: Path | None = None) -> dict[str, Any]:
    """Train and measure the population, then fit and score the predictors."""
    rows, cost = [], None
    for name in size.families:
        fam = FAMILIES[name]
        for label, setting in fam.settings(size):
            for pair in range(size.pairs):
                log(f"{name} {label}: pair {pair + 1}/{size.pairs}")
                a, b, bundle = fam.train(size, setting, pair, data)
                if cost is None:
                    cost = time_cost(a, b, bundle, log)
                rows.append(measure_pair(name, label, pair, a, b, bundle, size.lambdas))
    results = {"experiment": "check-calibration", "rows": rows, "cost": cost, "replicates": replicate_agreement(rows),
               "families": {n: FAMILIES[n].doc for n in size.families}}
    for which in PREDICTORS:
        results[f"heldout_{which}"] = held_out(rows, which)
        used = [r for r in rows if which != "twin" or r["family"] not in TWIN_EXCLUDED]
        results[f"calibration_{which}"] = _fit(used, which).to_json()
    return results


def _f(x, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{digits}f}"


def _scores_table(results: dict[str, Any]):
    from ..report import markdown_table

    rows = []
    for which, p in PREDICTORS.items():
        held = results[f"heldout_{which}"]
        s = held["pooled"]
        rows.append([f"{which}: x = {p.name} (vs measured barrier {p.measured})", _f(s["spearman"]),
                     _f(s["go_accuracy"]), s["n"]])
        if "pair_line" in held:
            s = held["pair_line"]
            rows.append([f"{which}, read off the unaligned pair line instead (what `check` ships)", _f(s["spearman"]),
                         _f(s["go_accuracy"]), s["n"]])
    return markdown_table(["predictor", "Spearman ρ", "go/no-go accuracy", "pairs"], rows)


def report(results: dict[str, Any]) -> str:
    """Markdown: the held-out scores, the fitted predictors, the cost, and one row per pair."""
    from ..report import markdown_table

    cost = results["cost"]
    fits = [results[f"calibration_{w}"] for w in PREDICTORS]
    lines = [
        "# check-calibration", "",
        f"Size: {results['size']}; {len(results['rows'])} pairs in {len(results['families'])} families; "
        f"{results['seconds']:.0f} s. Barriers: test-loss `barrier_mean` (nats) of the linear path, measured "
        "unaligned, after weight matching and after activation matching; predictions from `modeconn check` (no path "
        "evaluated), each fitted without the pair's own family (leave one family out), each predictor to its own "
        f"measured barrier. Go / no-go: barrier_mean < {GO_THRESHOLD} nats.", "",
        "## Held-out scores (pooled over families)", "", _scores_table(results), "",
        "`check` ships the pair and twin lines; its aligned predictions read the pair line at the aligned x. Lines "
        "fitted to the aligned barriers themselves are scored above beside it: where they rank the held-out aligned "
        "barriers worse than the pair line read at the aligned x, the pair line stays.",
        "", f"Noise ceiling: two seeds of one setting agree with Spearman ρ {_f(results['replicates']['spearman'])} and "
        f"go / no-go {_f(results['replicates']['go_accuracy'])} ({results['replicates']['n']} settings with two pairs).",
        "", "## Fitted on every family (pair and twin: the shipped calibration)", "",
        "`log(max(B, 0.005)) = intercept + slope · log(max(x, 0.01))` (B: the predictor's measured test-loss "
        "barrier_mean, nats); interval: residual quantiles 10 % / 90 %.", "",
        markdown_table(["predictor", "x", "intercept", "slope", "residual q10", "residual q90", "points"],
                       [[w, c["feature"], _f(c["intercept"]), _f(c["slope"]), _f(c["lo"]), _f(c["hi"]), c["n"]]
                        for w, c in zip(PREDICTORS, fits, strict=True)]),
        "", "## Cost", "",
        f"`check` {cost['check_seconds']:.2f} s vs `modeconn barrier` (naive, weight, activation; 25 λ) "
        f"{cost['barrier_seconds']:.2f} s on the first pair: ratio {cost['ratio']:.3f}.", "",
        "## Population", "",
        markdown_table(["family", "setting", "pair", "test acc %", "unaligned B", "WM B", "AM B", "held-out pred (pair)",
                        "held-out pred (WM)", "held-out pred (AM)", "held-out pred (twin)", "x identity", "x WM",
                        "x AM", "twin x", "relationship"],
                       [[r["family"], r["setting"], r["pair"], _f(100 * float(np.mean(r["test_acc"])), 1),
                         _f(r["unaligned_barrier_mean"]), _f(r["aligned_barrier_mean"]),
                         _f(r.get("activation_barrier_mean")), _f(r.get("heldout_pair")),
                         _f(r.get("heldout_weight_matched")), _f(r.get("heldout_activation_matched")),
                         _f(r.get("heldout_twin", float("nan"))), _f(r["x_identity"]), _f(r["x_weight"]),
                         _f(r["x_optimal"]), _f(r["twin_feature"]), r["relationship"]] for r in results["rows"]]),
        "", "![predicted vs measured](calibration.png)", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    """Held-out predicted vs measured barrier_mean of every predictor, log-log, one panel each; one colour per family,
    the same in every panel, and one legend for the figure."""
    from ..report.figures import pyplot

    plt = pyplot()

    rows = results["rows"]
    families = sorted({r["family"] for r in rows})
    colour = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(families)}
    fig, axes = plt.subplots(2, 2, figsize=(10, 9))
    for ax, (which, p) in zip(axes.flat, PREDICTORS.items(), strict=True):
        for fam in families:
            pts = [(r[f"heldout_{which}"], r[p.target]) for r in rows if r["family"] == fam
                   and r.get(p.target) is not None and np.isfinite(r.get(f"heldout_{which}", float("nan")))]
            if pts:
                ax.scatter([max(v, 1e-3) for v, _ in pts], [max(m, 1e-3) for _, m in pts], color=colour[fam], s=28)
        ax.axhline(GO_THRESHOLD, color="grey", ls=":")
        ax.axvline(GO_THRESHOLD, color="grey", ls=":")
        ax.plot([1e-3, 10], [1e-3, 10], color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        s = results[f"heldout_{which}"]["pooled"]
        ax.set_title(f"{which}: held-out ρ={_f(s['spearman'], 2)}, go/no-go {_f(s['go_accuracy'], 2)}", fontsize=9)
        ax.set_xlabel(f"predicted barrier_mean, {p.measured} (nats)", fontsize=8)
        ax.set_ylabel(f"measured barrier_mean, {p.measured} (nats)", fontsize=8)
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", ls="", color=colour[f], label=f) for f in families]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(families)), fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


SIZES = {
    "quick": Size(pairs=1, epochs=4, width=64, limit_train=4000, limit_test=500, lambdas=5,
                  families=("mlp-mnist", "finetune-mnist", "synthetic-k"), sigmas=(None, 0.0, 1.0), ks=(2, 16),
                  coherences=(0.0, 1.0)),
    "full": Size(pairs=2, epochs=3, width=128, limit_train=10000, limit_test=2000, lambdas=11,
                 families=tuple(FAMILIES), sigmas=(None, 0.0, 0.25, 0.5, 1.0, 2.0), ks=(2, 8, 32),
                 coherences=(0.0, 0.5, 1.0)),
}


def run_calibration(out: Path, *, size: Size, data: Path | None = None, overwrite: bool = False,
                    log: Log = print) -> dict[str, Any]:
    """Run the population at ``size``; writes results.json, report.md and calibration.png into ``out`` atomically."""
    start = time.perf_counter()
    with output_directory(out, overwrite, command="experiment check-calibration") as tmp:
        results = calibrate(size, log, data)
        results.update(size=size_label(SIZES, size), pairs=size.pairs, epochs=size.epochs, width=size.width,
                       limit_train=size.limit_train)
        results["seconds"] = time.perf_counter() - start
        plot(results, tmp / "calibration.png")
        write_results(tmp, results, report, start)
    return results


register_experiment(Experiment(
    name="check-calibration", doc=__doc__.split(": ", 1)[1], sizes=SIZES, run=run_calibration,
    report=report, outputs=("report.md", "results.json", "calibration.png"),
    overrides={o: o for o in ("pairs", "epochs", "width", "limit_train")}))
