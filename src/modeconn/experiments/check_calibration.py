"""``modeconn experiment check-calibration``: how well ``modeconn check`` predicts measured barriers (docs/methods.md §1,
"Prediction").

A population of model pairs in families (:data:`FAMILIES`): MNIST MLPs, standard and W-asymmetric over the σ_F grid;
fine-tunes of one MNIST MLP base; synthetic subspace mixtures over the intrinsic dimension k (σ_F = 1) and over the
coherence ν(U) (mask only, F = 0); standard and W-asymmetric BatchNorm ResNet20 on Fashion-MNIST; ViTs on
Fashion-MNIST (independent and from one initialisation); default-recipe MLPs on the digits and on Fashion-MNIST over
width and epochs; GPT-NeoX and Llama causal LMs on Austen (independent, shared-init and fine-tuned pairs over width
and epochs). Per pair the measured unaligned, weight-matched and activation-matched test-loss ``barrier_mean``
(:func:`~modeconn.experiments.identifiability.pair_metrics`) and the diagnostics of
:func:`modeconn.diagnostics.check`. The predictor (:mod:`modeconn.diagnostics.predictor`) is fitted leaving one family
out at a time and scored on the family it did not see: Spearman ρ of predicted vs measured barrier, go / no-go
accuracy (barrier_mean < 0.1 nats) and the coverage of the stated interval, pooled over the held-out predictions,
for the unaligned pair predictor, the twin predictor (model A alone) and the predictions after weight and after
activation matching, each fitted to its own measured barrier (:data:`PREDICTORS`; every form of :data:`FORMS` is
scored too). The fit on every family is written as ``calibration`` (the coefficients
:mod:`modeconn.diagnostics.calibration` ships). The cost of ``check`` is timed against ``modeconn barrier`` (naive,
weight and activation matching, 25 λ) on the first pair.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data import load_dataset, subspace_mixture
from ..diagnostics.check import MIDPOINT_FEATURES, check
from ..errors import ConfigError
from ..diagnostics.predictor import B_FLOOR, GO_THRESHOLD, X_FLOOR, fit_loglinear
from ..models import build_model
from ..train import TrainConfig, fit
from .identifiability import ADAMW, pair_metrics, train_pair
from .output import output_directory, write_results
from .registry import EXPERIMENTS, Experiment, register_experiment, size_label  # noqa: F401

Log = Callable[[str], None]


@dataclass(frozen=True)
class LMSettings:
    """The language-model families' data and training: Austen blocks of ``context`` tokens (a ``vocab``-token BPE),
    ``blocks`` training and ``test_blocks`` test blocks; 2 layers, 4 heads, MLP 4 × width; the settings
    ``(label, width, epochs, how)`` with ``how`` one of :data:`LM_PAIRINGS`."""

    vocab: int
    context: int
    blocks: int
    test_blocks: int
    settings: tuple[tuple[str, int, int, str], ...]
    lr: float = 3e-3


@dataclass(frozen=True)
class Size:
    """Everything that differs between ``--quick`` (CI) and the full run (``terms``: the further features of every
    predictor, None: :data:`PREDICTORS`'; the quick population is too small to fit more than x)."""

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
    lm: LMSettings
    plain_settings: tuple[tuple[int, int], ...] = ((16, 5), (64, 5), (256, 2), (512, 2))
    terms: tuple[str, ...] | None = None
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


def _plain_mlp(name: str, limit: bool):
    """Pairs of the default MLP recipe (``build_model("mlp")``: ReLU, no normalization, depth 3; ``fit`` with its
    defaults, SGD) of a given width and epochs, seeds 2p and 2p + 1, on dataset ``name`` (``limit``: the size's
    example limits)."""
    def train(size: Size, setting, pair: int, data):
        width, epochs = setting
        lim = dict(limit_train=size.limit_train, limit_test=size.limit_test) if limit else {}
        bundle = load_dataset(name, data, **lim)
        models = []
        for seed in (2 * pair, 2 * pair + 1):
            m = build_model("mlp", in_shape=tuple(bundle.input_shape), num_classes=bundle.num_classes, seed=seed,
                            width=width)
            fit(m, bundle.train, TrainConfig(epochs=epochs, seed=seed), progress=False)
            models.append(m.eval())
        return (*models, bundle)

    return train


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


def _vit(size: Size, shared_init: bool, pair: int, data):
    """Two standard pre-LN ViTs (``vit-tiny``: 64 wide, 2 layers, 4 heads, 7 × 7 patches) as in ``lmc-dm-vit``,
    trained on data orders 2p and 2p + 1 from initialisations 2p and 2p + 1 (``shared_init``: both from 2p)."""
    bundle = load_dataset("fashion-mnist", data, limit_train=size.limit_train, limit_test=size.limit_test)
    train = TrainConfig(epochs=size.epochs, lr=3e-3, optimizer="adamw", weight_decay=0.05, batch_size=128,
                        warmup_epochs=0.05 * size.epochs, grad_clip=1.0)
    models = []
    for order in (2 * pair, 2 * pair + 1):
        m = build_model("vit-tiny", in_shape=tuple(bundle.input_shape), num_classes=bundle.num_classes,
                        seed=2 * pair if shared_init else order, patch_size=7, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128)
        fit(m, bundle.train, train.model_copy(update={"seed": order}), progress=False)
        models.append(m.eval())
    return (*models, bundle)


@functools.cache
def _austen(lm: LMSettings, data):
    return load_dataset("austen", data, vocab_size=lm.vocab, context_length=lm.context, limit_train=lm.blocks,
                        limit_test=lm.test_blocks)


def _neox(bundle, width: int, seed: int) -> nn.Module:
    return build_model("gpt-neox-tiny", in_shape=tuple(bundle.input_shape), num_classes=bundle.num_classes, seed=seed,
                       hidden_size=width, num_hidden_layers=2, num_attention_heads=4, intermediate_size=4 * width)


def _llama(bundle, width: int, seed: int) -> nn.Module:
    """A Hugging Face ``LlamaForCausalLM`` (RMSNorm, SwiGLU, rotary, grouped-query attention: 4 heads, 2 KV heads)
    wrapped as a :class:`~modeconn.models.causal_lm.CausalLM`; weights drawn from ``seed``."""
    import transformers as T

    from ..models.causal_lm import CausalLM

    cfg = T.LlamaConfig(vocab_size=bundle.num_classes, hidden_size=width, intermediate_size=2 * width,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=bundle.input_shape[0], pad_token_id=0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    return CausalLM.wrap(T.LlamaForCausalLM(cfg), bundle.input_shape[0])


def _lm_fit(model: nn.Module, bundle, epochs: int, lr: float, order: int) -> nn.Module:
    cfg = TrainConfig(optimizer="adamw", lr=lr, weight_decay=0.1, batch_size=32, epochs=epochs,
                      warmup_epochs=0.05 * epochs, grad_clip=1.0, seed=order)
    fit(model.train(), bundle.train, cfg, progress=False)
    return model.eval()


def _lm_independent(build, bundle, width, epochs, lr, pair):
    return [_lm_fit(build(bundle, width, s), bundle, epochs, lr, s) for s in (2 * pair, 2 * pair + 1)]


def _lm_shared_init(build, bundle, width, epochs, lr, pair):
    return [_lm_fit(build(bundle, width, 2 * pair), bundle, epochs, lr, s) for s in (2 * pair, 2 * pair + 1)]


def _lm_finetunes(build, bundle, width, epochs, lr, pair):
    base = _lm_fit(build(bundle, width, 2 * pair), bundle, epochs, lr, 2 * pair)
    return [_lm_fit(copy.deepcopy(base), bundle, 1, lr / 10, s) for s in (2 * pair + 1, 2 * pair + 2)]


LM_PAIRINGS = {"independent": _lm_independent, "shared init": _lm_shared_init, "fine-tunes": _lm_finetunes}
"""How an LM pair is made: independent initialisations and data orders; one initialisation (seed 2p) and two data
orders; two one-epoch fine-tunes (a tenth of the learning rate, two data orders) of one base."""


def _lm_family(build):
    def train(size: Size, setting, pair: int, data):
        _, width, epochs, how = setting
        bundle = _austen(size.lm, data)
        return (*LM_PAIRINGS[how](build, bundle, width, epochs, size.lm.lr, pair), bundle)

    return train


def _sigma_label(s):
    return "standard" if s is None else f"σ_F={s}"


FAMILIES = {f.name: f for f in (
    Family("mlp-mnist", "MLPs (3 × width, LayerNorm, GELU) on MNIST, standard and W-asymmetric over σ_F",
           lambda s: [(_sigma_label(x), x) for x in s.sigmas], _mlp),
    Family("mlp-digits", "default-recipe MLPs (3 × width, ReLU, SGD) on the 8 × 8 digits over width and epochs",
           lambda s: [(f"width={w}, {e} epochs", (w, e)) for w, e in s.plain_settings], _plain_mlp("digits", False)),
    Family("mlp-fmnist", "default-recipe MLPs (3 × width, ReLU, SGD) on Fashion-MNIST over width and epochs",
           lambda s: [(f"width={w}, {e} epochs", (w, e)) for w, e in s.plain_settings[-2:]],
           _plain_mlp("fashion-mnist", True)),
    Family("finetune-mnist", "two fine-tunes of one MNIST MLP base", lambda s: [("fine-tunes", None)], _finetunes),
    Family("synthetic-k", "W-asymmetric MLPs (σ_F = 1) on subspace mixtures over k (d = 64)",
           lambda s: [(f"k={k}", k) for k in s.ks], _synthetic_k),
    Family("synthetic-coherence", "mask-only MLPs (F = 0) on subspace mixtures (k = 8) over the coherence knob",
           lambda s: [(f"coherence={c}", c) for c in s.coherences], _synthetic_coherence),
    Family("resnet20-fmnist", "BatchNorm ResNet20, standard and W-asymmetric (σ_F = 1), on Fashion-MNIST",
           lambda s: [(_sigma_label(x), x) for x in (None, 1.0)], _resnet),
    Family("vit-fmnist", "standard pre-LN ViTs (vit-tiny) on Fashion-MNIST, independent and from one initialisation",
           lambda s: [("standard", False), ("shared init", True)], _vit),
    Family("lm-neox-austen", "GPT-NeoX causal LMs (2 layers, LayerNorm, parallel residual) on Austen: independent, "
           "shared-init and fine-tuned pairs over width and epochs", lambda s: [(x[0], x) for x in s.lm.settings],
           _lm_family(_neox)),
    Family("lm-llama-austen", "Llama causal LMs (2 layers, RMSNorm, SwiGLU, grouped-query attention) on Austen: "
           "independent, shared-init and fine-tuned pairs over width and epochs",
           lambda s: [(x[0], x) for x in s.lm.settings], _lm_family(_llama)),
)}
"""The population's families, by name."""


def measure_pair(family: str, label: str, pair: int, a, b, bundle, lambdas: int) -> dict[str, Any]:
    """Measured barriers (path evaluated) and ``check``'s diagnostics (:func:`check_features`) of one pair."""
    t0 = time.perf_counter()
    measured = pair_metrics(a, b, bundle, lambdas, activation_barrier=True)
    t1 = time.perf_counter()
    return {
        "family": family, "setting": label, "pair": pair, "test_acc": measured["test_acc"],
        "unaligned_barrier_mean": measured["unaligned_barrier_mean"], "aligned_barrier_mean": measured["aligned_barrier_mean"],
        "activation_barrier_mean": measured["activation_barrier_mean"],
        "num_classes": int(bundle.num_classes), "endpoint_loss": measured["endpoint_loss"],
        "aligned_endpoint_loss": measured["aligned_endpoint_loss"],
        "activation_endpoint_loss": measured["activation_endpoint_loss"], "measure_seconds": t1 - t0,
        **check_features(f"{family} {label}, pair {pair}", a, b, bundle),
    }


def check_features(name: str, a, b, bundle) -> dict[str, Any]:
    """``check``'s diagnostics of one pair (of each path only the endpoints and the midpoint evaluated);
    ConfigError naming the pair (``name``) when a diagnostic is undefined (its verdict "not applicable": nothing to
    fit)."""
    t1 = time.perf_counter()
    res = check(a, b, data=bundle, progress=False)
    t2 = time.perf_counter()
    why = res.prediction["not_applicable"] or res.prediction["twin"].get("not_applicable")
    if why:
        raise ConfigError(f"{name}: check's diagnostics are undefined, so the pair cannot calibrate the predictor: "
                          f"{why}")
    f = res.pair["features"]
    return {
        "test_loss": float(np.mean([e["test_loss"] for e in res.endpoints])),
        "x_identity": 1.0 - f["q_identity"], "x_weight": 1.0 - f["q_weight"], "x_optimal": 1.0 - f["q_optimal"],
        "x_identity_worst": 1.0 - min(s["q_identity"] for s in res.pair["spaces"].values()),
        "twin_feature": res.prediction["twin_feature"],
        "identity_ratio": f["identity_ratio"], "cka": f["cka"], "permutation_share": f["permutation_share"],
        "weight_cosine_identity": f["weight_cosine_identity"], "relationship": res.pair["relationship"]["name"],
        "k": next(iter(res.layers.values()))["k"], "coherence": next(iter(res.layers.values()))["coherence"],
        "label_entropy": res.prediction["endpoint_features"]["label_entropy"],
        "headroom": res.prediction["endpoint_features"]["headroom"],
        "moved_loss": res.prediction["endpoint_features"]["moved_loss"],
        **_midpoints(res),
        "fixed_structure": any(v.get("asymmetric") for v in res.layers.values()),
        "spaces": {s: {k: v[k] for k in ("n", "q_identity", "q_weight", "q_optimal")}
                   for s, v in res.pair["spaces"].items()},
        "check_seconds": t2 - t1,
    }


def _midpoints(res) -> dict[str, float | None]:
    """``check``'s barrier over λ ∈ {0, ½, 1} of the path as the models are (``x_mid_identity``), weight-matched
    (``x_mid_weight``) and activation-matched (``x_mid_optimal``), and their standard errors (``…_se``); None after
    an alignment of a model with fixed asymmetric structure."""
    ef = res.prediction["endpoint_features"]
    return {f"x_mid_{short}{suffix}": ef[key].get(name) for name, short in (("unaligned", "identity"),
                                                                          ("weight_matched", "weight"),
                                                                          ("activation_matched", "optimal"))
            for key, suffix in (("midpoint_barrier", ""), ("midpoint_se", "_se"))}


@dataclass(frozen=True)
class Predictor:
    """One fitted line of ``check``: its diagnostic (row key ``x``, ``name``), its further features (``terms``: row
    keys, named as ``check`` passes them), the measured barrier it predicts (row key ``target``, described by
    ``measured``) and the pairs it is fitted and scored on (``standard_only``: none with fixed asymmetric structure —
    there a permutation is not a symmetry and ``check`` predicts no aligned barrier)."""

    x: str
    name: str
    target: str
    measured: str
    terms: tuple[str, ...] = ("headroom", "test_loss", "label_entropy", "cka")
    fixed: tuple[tuple[str, float], ...] = ()
    standard_only: bool = False
    x_floor: float = X_FLOOR


PREDICTORS = {
    "pair": Predictor("x_mid_identity", MIDPOINT_FEATURES["unaligned"], "unaligned_barrier_mean", "unaligned", (),
                      x_floor=B_FLOOR),
    "twin": Predictor("twin_feature", "min relative swap cost", "unaligned_barrier_mean", "unaligned (a twin)",
                      ("headroom", "test_loss", "label_entropy")),
    "weight_matched": Predictor("x_mid_weight", MIDPOINT_FEATURES["weight_matched"], "aligned_barrier_mean",
                                "after weight matching", (), standard_only=True, x_floor=B_FLOOR),
    "activation_matched": Predictor("x_mid_optimal", MIDPOINT_FEATURES["activation_matched"],
                                    "activation_barrier_mean", "after activation matching", (), standard_only=True,
                                    x_floor=B_FLOOR),
}
"""The predictors ``check`` ships (:mod:`modeconn.diagnostics.calibration`): each is fitted to its own measured
barrier. The three pair predictors read their path's barrier over λ ∈ {0, ½, 1}, measured by ``check`` on its
evaluation examples (floored like a barrier), alone: it is a direct measurement of the quantity predicted, and no
further feature of :data:`FORMS` improves its held-out scores; the twin (no B, no path) reads the relative swap cost
with the endpoint features. The report shows every form's scores."""

FORMS = {"x alone": (), "headroom, label entropy": ("headroom", "label_entropy"),
         "test loss, label entropy": ("test_loss", "label_entropy"),
         "headroom, test loss, label entropy": ("headroom", "test_loss", "label_entropy"),
         "headroom, test loss, label entropy, CKA": ("headroom", "test_loss", "label_entropy", "cka")}
"""The further features compared for every predictor (CKA needs B: not for the twin)."""


@contextlib.contextmanager
def _terms(terms: Mapping[str, tuple[str, ...]]):
    """:data:`PREDICTORS` with the further features ``terms[name]`` while inside (restored after)."""
    shipped = dict(PREDICTORS)
    try:
        PREDICTORS.update({w: replace(p, terms=terms[w]) for w, p in shipped.items() if w in terms})
        yield
    finally:
        PREDICTORS.update(shipped)


def compare_forms(rows: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """``{predictor: {form: pooled held-out scores}}`` for every form of :data:`FORMS` (the shipped lines unchanged)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for which in PREDICTORS:
        for form, terms in FORMS.items():
            if which == "twin" and "cka" in terms:
                continue
            with _terms({which: terms}):
                out.setdefault(which, {})[form] = held_out([dict(r) for r in rows], which)["pooled"]
    return out


TWIN_EXCLUDED = ("finetune-mnist",)
"""Families whose pairs are not independently trained twins: left out of the twin predictor's fit and scores."""


def population(rows: list[dict], which: str) -> list[dict]:
    """The rows predictor ``which`` is fitted and scored on (its target measured, its diagnostic defined; no
    twin-excluded family for the twin; no fixed asymmetric structure for a ``standard_only`` one)."""
    p = PREDICTORS[which]
    return [r for r in rows if r.get(p.target) is not None and r.get(p.x) is not None
            and not (which == "twin" and r["family"] in TWIN_EXCLUDED) and not (p.standard_only and r["fixed_structure"])]


def _line(rows: list[dict], which: str):
    p = PREDICTORS[which]
    return fit_loglinear(p.name, [r[p.x] for r in rows], [r[p.target] for r in rows],
                         {t: [r[t] for r in rows] for t in p.terms},
                         {t: (c, [r[t] for r in rows]) for t, c in p.fixed}, p.x_floor)


def _predict(model, row: dict, which: str) -> dict[str, float]:
    p = PREDICTORS[which]
    return model.predict(row[p.x], **{t: row[t] for t in (*p.terms, *(n for n, _ in p.fixed))})


def _fit(rows: list[dict], which: str):
    """The line fitted on ``rows`` (a population), its interval the split-conformal bounds
    (:func:`~modeconn.diagnostics.predictor.conformal_bounds`) of the leave-one-family-out residuals within ``rows``
    (the error on a family the line has not seen, not the in-sample residuals), clamped to hold the line."""
    from ..diagnostics.predictor import B_FLOOR, conformal_bounds

    p = PREDICTORS[which]
    line = _line(rows, which)
    res = []
    for fam in {r["family"] for r in rows}:
        train = [r for r in rows if r["family"] != fam]
        if len(train) < 3:
            continue
        inner = _line(train, which)
        res += [np.log(max(r[p.target], B_FLOOR) / _predict(inner, r, which)["barrier_mean"])
                for r in rows if r["family"] == fam]
    if len(res) < 2:
        return line
    lo, hi = conformal_bounds(res)
    return replace(line, lo=lo, hi=hi)


def score(pred: Sequence[float], measured: Sequence[float], low: Sequence[float] | None = None,
          high: Sequence[float] | None = None) -> dict[str, float]:
    """Spearman ρ, go / no-go accuracy (both sides below :data:`GO_THRESHOLD` or both not) and, with the intervals,
    their coverage (the measured barrier, floored at the predictor's ``B_FLOOR``, inside ``[low, high]``)."""
    from scipy.stats import spearmanr

    from ..diagnostics.predictor import B_FLOOR

    p, m = np.asarray(pred, float), np.asarray(measured, float)
    if len(p) == 0:
        return {"spearman": float("nan"), "go_accuracy": float("nan"), "coverage": float("nan"), "n": 0}
    rho = float(spearmanr(p, m).statistic) if len(p) > 2 and np.ptp(p) > 0 and np.ptp(m) > 0 else float("nan")
    out = {"spearman": rho, "go_accuracy": float(np.mean((p < GO_THRESHOLD) == (m < GO_THRESHOLD))), "n": len(p)}
    if low is not None and high is not None:
        mf = np.maximum(m, B_FLOOR)
        out["coverage"] = float(np.mean((np.asarray(low) <= mf) & (mf <= np.asarray(high))))
    return out


def held_out(rows: list[dict], which: str) -> dict[str, Any]:
    """Leave one family out: fit (line and interval) on the others, predict the held-out family's barriers (the
    predictor's own target); pooled and per-family scores."""
    p = PREDICTORS[which]
    rows = population(rows, which)
    families = sorted({r["family"] for r in rows})
    preds: list[dict[str, float]] = []
    for r in rows:
        train = [q for q in rows if q["family"] != r["family"]]
        nan = dict.fromkeys(("barrier_mean", "low", "high"), float("nan"))
        pred = _predict(_fit(train, which), r, which) if len(train) >= 3 else nan
        r[f"heldout_{which}"] = pred["barrier_mean"]
        r[f"heldout_{which}_interval"] = [pred["low"], pred["high"]]
        preds.append(pred)

    def scored(keep) -> dict[str, float]:
        idx = [i for i, r in enumerate(rows) if keep(r) and np.isfinite(preds[i]["barrier_mean"])]
        return score([preds[i]["barrier_mean"] for i in idx], [rows[i][p.target] for i in idx],
                     [preds[i]["low"] for i in idx], [preds[i]["high"] for i in idx])

    return {"pooled": scored(lambda r: True), "families": families,
            "per_family": {f: scored(lambda r, f=f: r["family"] == f) for f in families}}


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


def measure(size: Size, log: Log, data: Path | None = None, families: Sequence[str] | None = None
            ) -> tuple[list[dict], dict | None]:
    """Train and measure the pairs of ``families`` (default ``size.families``): ``(rows, cost)``; the cost of
    ``check`` vs ``modeconn barrier`` is timed on the first pair (None if there is none)."""
    rows, cost = [], None
    for name in size.families if families is None else families:
        fam = FAMILIES[name]
        for label, setting in fam.settings(size):
            for pair in range(size.pairs):
                log(f"{name} {label}: pair {pair + 1}/{size.pairs}")
                a, b, bundle = fam.train(size, setting, pair, data)
                if cost is None:
                    cost = time_cost(a, b, bundle, log)
                rows.append(measure_pair(name, label, pair, a, b, bundle, size.lambdas))
    return rows, cost


def summarize(rows: list[dict], cost: dict | None, terms: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Fit and score the predictors on measured ``rows`` (leave one family out, and on every family); ``terms``:
    the further features of every predictor instead of :data:`PREDICTORS`' (``()``: x alone)."""
    if terms is not None:
        with _terms(dict.fromkeys(PREDICTORS, terms)):
            return summarize(rows, cost)
    families = list(dict.fromkeys(r["family"] for r in rows))
    results = {"experiment": "check-calibration", "rows": rows, "cost": cost, "replicates": replicate_agreement(rows),
               "families": {n: FAMILIES[n].doc for n in families}, "forms": compare_forms(rows)}
    for which in PREDICTORS:
        results[f"heldout_{which}"] = held_out(rows, which)
        results[f"calibration_{which}"] = _fit(population(rows, which), which).to_json()
    return results


def _f(x, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{digits}f}"


def _scores_table(results: dict[str, Any]):
    from ..report import markdown_table

    rows = []
    for which, p in PREDICTORS.items():
        held = results[f"heldout_{which}"]
        s = held["pooled"]
        terms = "".join(f" and {t}" for t in p.terms)
        rows.append([f"{which}: x = {p.name}{terms} (vs measured barrier {p.measured})", _f(s["spearman"]),
                     _f(s["go_accuracy"]), _f(s.get("coverage")), s["n"], len(held["families"])])
    return markdown_table(["predictor", "Spearman ρ", "go/no-go accuracy", "interval coverage", "pairs", "families"],
                          rows)


def _forms_table(results: dict[str, Any]):
    from ..report import markdown_table

    forms = results["forms"]
    shipped = {w: next((f for f, t in FORMS.items() if t == p.terms), "other") for w, p in PREDICTORS.items()}
    cell = lambda w, f: "—" if f not in forms[w] else (  # noqa: E731
        f"{_f(forms[w][f]['spearman'], 2)} / {_f(forms[w][f]['go_accuracy'], 2)} / "
        f"{_f(forms[w][f].get('coverage'), 2)}{' (shipped)' if shipped[w] == f else ''}")
    return ("Held-out ρ / go-no-go accuracy / interval coverage of every predictor with each set of further features "
            "(log-linear terms besides x); the shipped form is marked.\n\n"
            + markdown_table(["further features", *forms], [[f, *(cell(w, f) for w in forms)] for f in FORMS]))


def _family_table(results: dict[str, Any]):
    from ..report import markdown_table

    fams = list(results["families"])
    cell = lambda w, f: (lambda s: "—" if s is None else f"{_f(s['spearman'], 2)} / {_f(s['go_accuracy'], 2)} / "  # noqa: E731
                         f"{_f(s.get('coverage'), 2)} ({s['n']})")(results[f"heldout_{w}"]["per_family"].get(f))
    return ("ρ / go-no-go accuracy / interval coverage (pairs) of the held-out family.\n\n"
            + markdown_table(["family", *PREDICTORS], [[f, *(cell(w, f) for w in PREDICTORS)] for f in fams]))


def report(results: dict[str, Any]) -> str:
    """Markdown: the held-out scores, the fitted predictors, the cost, and one row per pair."""
    from ..report import markdown_table

    cost = results["cost"]
    fits = [results[f"calibration_{w}"] for w in PREDICTORS]
    cost_line = ("—" if not cost else f"`check` {cost['check_seconds']:.2f} s vs `modeconn barrier` (naive, weight, "
                 f"activation; 25 λ) {cost['barrier_seconds']:.2f} s on the first pair: ratio {cost['ratio']:.3f}.")
    lines = [
        "# check-calibration", "",
        f"Size: {results['size']}; {len(results['rows'])} pairs in {len(results['families'])} families; "
        f"{results['seconds']:.0f} s. Barriers: test-loss `barrier_mean` (nats) of the linear path, measured "
        "unaligned, after weight matching and after activation matching; predictions from `modeconn check` (of each "
        "path, as they are and after each alignment, the midpoint alone evaluated), each fitted without the pair's own family (leave one "
        f"family out), each predictor to its own measured barrier. Go / no-go: barrier_mean < {GO_THRESHOLD} nats.", "",
        "## Held-out scores (pooled over families)", "", _scores_table(results), "",
        "Interval coverage: the measured barrier (floored at 0.005) inside the stated interval of the held-out "
        "prediction, whose width is itself fitted without the held-out family (split-conformal bounds of its "
        "leave-one-family-out residuals). The pair predictors (as they are and after each alignment) read their "
        "path's barrier over its endpoints and midpoint, which `check` measures on its evaluation examples (the first "
        "2000 test examples): in this population those are the measurement's own test examples, so their residuals "
        "are the path's peak between those points (and, after activation matching, `check`'s permutation from fewer "
        "activations), not sampling error — `check` "
        "adds the midpoint's standard error to the interval in use. The aligned predictors are fitted "
        "and scored on pairs without fixed asymmetric structure only: in a W-asymmetric network a permutation is not "
        "a symmetry (the permuted B computes another function), and `check` predicts no aligned barrier there.",
        "", f"Noise ceiling: two seeds of one setting agree with Spearman ρ {_f(results['replicates']['spearman'])} and "
        f"go / no-go {_f(results['replicates']['go_accuracy'])} ({results['replicates']['n']} settings with two pairs).",
        *[line for note in results.get("provenance", ()) for line in ("", note)],
        "", "## Held-out scores per family", "", _family_table(results),
        "", "## Forms compared", "", _forms_table(results),
        "", "## Fitted on every family (the shipped calibration)", "",
        "`log(max(B, 0.005)) = intercept + slope · log(max(x, 0.01)) + Σ c_k · log(max(z_k, 0.01))` (B: the "
        "predictor's measured test-loss barrier_mean, nats; z: headroom = entropy of the training labels − the "
        "endpoints' mean test loss, that test loss, the label entropy (nats), the mean linear CKA); interval: "
        "split-conformal 5 % / 95 % bounds of the leave-one-family-out residuals.", "",
        markdown_table(["predictor", "x", "intercept", "slope", "headroom c", "test loss c", "label entropy c",
                        "CKA c", "residual q05", "residual q95", "points"],
                       [[w, c["feature"], _f(c["intercept"]), _f(c["slope"]),
                         *(_f(dict(c.get("terms", ())).get(t)) for t in ("headroom", "test_loss", "label_entropy",
                                                                           "cka")),
                         _f(c["lo"]), _f(c["hi"]), c["n"]] for w, c in zip(PREDICTORS, fits, strict=True)]),
        "", "## Cost", "",
        cost_line, "",
        "## Population", "",
        markdown_table(["family", "setting", "pair", "test acc %", "unaligned B", "WM B", "AM B", "held-out pred (pair)",
                        "held-out pred (WM)", "held-out pred (AM)", "held-out pred (twin)", "x identity",
                        "x WM (midpoint B)", "x AM (midpoint B)", "headroom", "twin x", "relationship"],
                       [[r["family"], r["setting"], r["pair"], _f(100 * float(np.mean(r["test_acc"])), 1),
                         _f(r["unaligned_barrier_mean"]), _f(r["aligned_barrier_mean"]),
                         _f(r.get("activation_barrier_mean")), _f(r.get("heldout_pair")),
                         _f(r.get("heldout_weight_matched")), _f(r.get("heldout_activation_matched")),
                         _f(r.get("heldout_twin", float("nan"))), _f(r["x_identity"]), _f(r.get("x_mid_weight")),
                         _f(r.get("x_mid_optimal")), _f(r["headroom"]), _f(r["twin_feature"]), r["relationship"]]
                        for r in results["rows"]]),
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
                  families=("mlp-mnist", "finetune-mnist", "synthetic-k", "lm-neox-austen"), sigmas=(None, 0.0, 1.0),
                  ks=(2, 16), coherences=(0.0, 1.0), terms=(),
                  lm=LMSettings(vocab=320, context=32, blocks=200, test_blocks=16,
                                settings=(("independent", 32, 2, "independent"), ("fine-tunes", 32, 2, "fine-tunes")))),
    "full": Size(pairs=2, epochs=3, width=128, limit_train=10000, limit_test=2000, lambdas=11,
                 families=tuple(FAMILIES), sigmas=(None, 0.0, 0.25, 0.5, 1.0, 2.0), ks=(2, 8, 32),
                 coherences=(0.0, 0.5, 1.0),
                 lm=LMSettings(vocab=512, context=64, blocks=600, test_blocks=64, settings=(
                     ("independent, 64 wide, 1 epoch", 64, 1, "independent"),
                     ("independent, 64 wide, 4 epochs", 64, 4, "independent"),
                     ("independent, 128 wide, 2 epochs", 128, 2, "independent"),
                     ("shared init, 64 wide, 4 epochs", 64, 4, "shared init"),
                     ("fine-tunes, 64 wide, 4 epochs", 64, 4, "fine-tunes")))),
}


def run_calibration(out: Path, *, size: Size, data: Path | None = None, overwrite: bool = False,
                    log: Log = print, measured: tuple[list[dict], dict | None] | None = None,
                    notes: Sequence[str] = ()) -> dict[str, Any]:
    """Run the population at ``size``; writes results.json, report.md and calibration.png into ``out`` atomically.
    ``measured``: the ``(rows, cost)`` of :func:`measure` run earlier (e.g. family by family in separate
    processes), fitted and reported instead of measuring again; ``notes``: where those rows come from (paragraphs
    of the report, ``results["provenance"]``)."""
    start = time.perf_counter()
    with output_directory(out, overwrite, command="experiment check-calibration") as tmp:
        results = {**summarize(*(measured or measure(size, log, data)), size.terms), "provenance": list(notes)}
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
