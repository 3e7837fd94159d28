"""``check``: "will these two merge?" — diagnostics and a predicted barrier, without evaluating the path.

The relationship of two models, per-space identifiability and per-layer symmetry breaking
(:mod:`~modeconn.diagnostics.pair`, :mod:`~modeconn.diagnostics.structure`), mapped to predicted test-loss
``barrier_mean`` values by the stated predictor of :mod:`~modeconn.diagnostics.predictor` (docs/methods.md §1,
"Prediction"). The relationship and the recommended method come from ordered rule tables
(:data:`RELATIONSHIPS`, :data:`RECOMMENDATIONS`): the first entry whose test holds wins.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data import DatasetBundle, make_loader
from ..errors import ConfigError
from ..nn_utils import model_device
from .pair import collect, space_statistics, weight_cosines
from .predictor import GO_THRESHOLD, LogLinear
from .structure import model_identifiability

FINE_TUNE_COSINE = 0.8
"""Mean identity weight cosine at or above which two models are called fine-tunes of one base."""
IDENTIFIED_RATIO = 0.9
"""Mean identity / optimal activation-matching ratio at or above which the units are already aligned."""
PERMUTATION_SHARE = 0.5
"""Below this ``q̄(optimal permutation) / q̄(optimal orthogonal map)`` permutations explain too little of the
correlation the best orthogonal map finds: the pair needs a continuous group."""


@dataclass(frozen=True)
class Rule:
    """One row of a rule table: ``name``, ``test(features) -> bool``, ``advice`` (what to do)."""

    name: str
    test: Callable[[Mapping[str, Any]], bool]
    advice: str


RELATIONSHIPS = (
    Rule("fine-tunes of one base", lambda f: f["weight_cosine_identity"] >= FINE_TUNE_COSINE, "align nothing"),
    Rule("identified independent runs (symmetry broken)", lambda f: f["identity_ratio"] >= IDENTIFIED_RATIO,
         "align nothing"),
    Rule("needs the continuous group", lambda f: f["permutation_share"] < PERMUTATION_SHARE,
         "permutations explain too little: the full group (orthogonal / invertible maps, dual matching)"),
    Rule("independent runs, permutations suffice", lambda f: True, "a permutation alignment"),
)
"""Pair relationship, first match wins (features: :func:`pair_features`)."""

_go = lambda key: lambda f: f[key] < GO_THRESHOLD  # noqa: E731
RECOMMENDATIONS = (
    Rule("none", _go("unaligned"), "merge as they are: no alignment needed"),
    Rule("weight matching", _go("weight_matched"), "align with weight matching (modeconn align --method weight)"),
    Rule("activation matching", _go("activation_matched"), "align with activation matching (--method activation)"),
    Rule("full group with dual matching", lambda f: f["relationship"] == "needs the continuous group",
         "absorb normalization and align the full group with dual matching (--method dual)"),
    Rule("weight matching", lambda f: f["activation_matched"] <= 0.5 * f["unaligned"],
         "the best permutation is predicted to reduce the barrier, not to remove it: align with weight matching "
         "(data-free) or activation matching"),
    Rule("no linear path: use LLPF", lambda f: True, "no alignment is predicted to give a low linear path: "
         "search a curved low-loss path (modeconn path --method llpf)"),
)
"""Recommended method, first match wins (features: predicted barriers and the relationship)."""


@dataclass
class CheckResult:
    """What :func:`check` found. ``pair`` is empty with one model; numbers in nats where they are losses."""

    dataset: str
    endpoints: list[dict[str, float]]
    layers: dict[str, dict[str, Any]]
    prediction: dict[str, Any]
    recommendation: dict[str, str]
    pair: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "endpoints": self.endpoints, "pair": self.pair, "layers": self.layers,
                "prediction": self.prediction, "recommendation": self.recommendation, "seconds": self.seconds}


def _mean(values) -> float:
    vals = [float(v) for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


def pair_features(spaces: Mapping[str, Mapping[str, Any]], cosines: Mapping[str, Mapping[str, Any]],
                  corr: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Space means of the per-space statistics, layer means of the weight cosines, and the permutation share
    ``q̄(optimal permutation) / q̄(orthogonal)`` with ``q(orthogonal) = ‖corr‖_* / n`` (nuclear norm: the best
    orthogonal map's mean correlation, ≥ the best permutation's)."""
    q_orth = _mean(float(torch.linalg.matrix_norm(c.double(), ord="nuc")) / c.shape[0] for c in corr.values())
    f = {key: _mean(s[key] for s in spaces.values()) for key in ("identity_ratio", "q_identity", "q_weight", "q_optimal", "cka")}
    f["q_orthogonal"] = q_orth
    f["permutation_share"] = f["q_optimal"] / q_orth if q_orth > 0 else 1.0
    f["weight_cosine_identity"] = _mean(c["identity"] for c in cosines.values())
    f["weight_cosine_matched"] = _mean(c["weight_matched"] for c in cosines.values())
    return f


def twin_feature(layers: Mapping[str, Mapping[str, Any]]) -> float:
    """``min`` over layers of ``relative_swap_cost`` (0 for a network without broken symmetry)."""
    vals = [v["relative_swap_cost"] for v in layers.values() if np.isfinite(v["relative_swap_cost"])]
    return float(min(vals)) if vals else 0.0


def first(rules, features: Mapping[str, Any]) -> Rule:
    """The first rule of ``rules`` whose test holds for ``features``."""
    return next(r for r in rules if r.test(features))


def _check_inputs(model_a: nn.Module, model_b: nn.Module | None, data: Any, max_batches: int) -> None:
    if not isinstance(model_a, nn.Module) or (model_b is not None and not isinstance(model_b, nn.Module)):
        raise ConfigError(f"check takes torch modules, got {type(model_a).__name__} and {type(model_b).__name__}")
    if not isinstance(data, DatasetBundle):
        raise ConfigError(f"check needs data= a DatasetBundle (modeconn.data.load_dataset), got {type(data).__name__}")
    if isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1:
        raise ConfigError(f"max_batches must be a positive integer, got {max_batches!r}")
    if model_b is not None:
        sa, sb = model_a.state_dict(), model_b.state_dict()
        bad = [k for k in sa if k not in sb or sb[k].shape != sa[k].shape] + [k for k in sb if k not in sa]
        if bad:
            raise ConfigError(f"model A and model B differ at {bad[:5]} (keys or shapes): check needs one architecture")


def _endpoint(model: nn.Module, loader) -> dict[str, float]:
    from ..path import evaluate_model

    r = evaluate_model(model, loader)
    return {"test_loss": float(r["loss"]), "test_acc": float(r["acc"])}


def _predict(pair: Mapping[str, float] | None, layers, calibration: Mapping[str, LogLinear]) -> dict:
    out: dict[str, Any] = {"threshold": GO_THRESHOLD, "twin": calibration["twin"].predict(twin_feature(layers)),
                           "twin_feature": twin_feature(layers), "calibration": {k: v.to_json() for k, v in calibration.items()}}
    if pair is not None:
        model = calibration["pair"]
        for name, key in (("unaligned", "q_identity"), ("weight_matched", "q_weight"),
                          ("activation_matched", "q_optimal")):
            out[name] = model.predict(1.0 - pair[key])
    return out


def check(model_a: nn.Module, model_b: nn.Module | None = None, *, data: DatasetBundle, max_batches: int = 5,
          batch_size: int = 500, eval_limit: int = 2000, seed: int = 0,
          calibration: Mapping[str, LogLinear] | None = None, device: str | torch.device | None = None) -> CheckResult:
    """Will ``model_a`` and ``model_b`` merge without alignment? With ``model_a`` alone: would an independently
    trained twin of it (same architecture, fixed structure and data, another seed)?

    No point of the interpolation path is evaluated: the endpoints' test loss (first ``eval_limit`` test examples),
    activations of both models on ``max_batches`` training batches of ``batch_size``, one weight matching, and
    realization costs of model A's layers (module docstrings of :mod:`modeconn.diagnostics`).

    Args:
        model_a, model_b: classifiers of one architecture (logits ``(N, num_classes)``); never modified.
        data: the dataset bundle the models were trained on.
        calibration: ``{"pair": LogLinear, "twin": LogLinear}``; default the fit shipped in
            :mod:`modeconn.diagnostics.calibration`.
        device: where the forward passes and weight matching's score products run (copies of the models are moved
            there; ``None``: the models' own device). ConfigError naming ``device`` if it is not available.
    Returns:
        :class:`CheckResult`: ``prediction["unaligned" | "weight_matched" | "activation_matched" | "twin"]`` each
        ``{"barrier_mean", "low", "high"}`` (test loss, nats), ``prediction["go"]`` (unaligned, or the twin's, below
        :data:`~modeconn.diagnostics.predictor.GO_THRESHOLD`), ``recommendation`` (method, advice) and the
        diagnostics behind them.
    Raises:
        ConfigError: not modules, ``data`` not a DatasetBundle, models of different keys or shapes, a bad
            ``max_batches`` — before any forward pass.
    """
    from ..symmetry import symmetry_spec
    from ..match import weight_matching
    from .calibration import DEFAULT

    _check_inputs(model_a, model_b, data, max_batches)
    model_a, model_b = _on_device(model_a, model_b, device)
    start = time.perf_counter()
    calibration = DEFAULT if calibration is None else calibration
    spec = symmetry_spec(model_a, data.train.tensors[0][:2].to(model_device(model_a)))
    train = make_loader(data.train, batch_size, shuffle=True, seed=seed)
    test = make_loader(torch.utils.data.Subset(data.test, range(min(eval_limit, len(data.test)))), 1000)
    models = [model_a] if model_b is None else [model_a, model_b]
    endpoints = [_endpoint(m, test) for m in models]
    layers = model_identifiability(model_a, spec, train, max_batches, seed)
    pair: dict[str, Any] = {}
    features = None
    if model_b is not None:
        sa, sb = model_a.state_dict(), model_b.state_dict()
        wm = weight_matching(spec, sa, sb)
        corr, samples, _ = collect(spec, model_a, model_b, train, max_batches, seed)
        spaces = space_statistics(spec, corr, samples, wm.element)
        cosines = weight_cosines(spec, sa, sb, wm.apply(sb))
        features = pair_features(spaces, cosines, corr)
        rel = first(RELATIONSHIPS, features)
        pair = {"spaces": spaces, "weights": cosines, "features": features,
                "relationship": {"name": rel.name, "advice": rel.advice}}
    prediction = _predict(features, layers, calibration)
    key = "unaligned" if model_b is not None else "twin"
    prediction["go"] = prediction[key]["barrier_mean"] < GO_THRESHOLD
    rec = _recommend(prediction, pair)
    return CheckResult(data.name, endpoints, layers, prediction, rec, pair, time.perf_counter() - start)


def _on_device(model_a: nn.Module, model_b: nn.Module | None, device) -> tuple[nn.Module, nn.Module | None]:
    """The models, or copies of them on ``device`` (the inputs are never moved)."""
    import copy

    from .._util.device import resolve_device

    dev = resolve_device(device, "device")
    if dev is None or model_device(model_a) == dev:
        return model_a, model_b
    return tuple(None if m is None else copy.deepcopy(m).to(dev) for m in (model_a, model_b))  # type: ignore[return-value]


def _recommend(prediction: Mapping[str, Any], pair: Mapping[str, Any]) -> dict[str, str]:
    """The first :data:`RECOMMENDATIONS` rule for a pair; for a twin of A alone "none" or weight matching."""
    if pair:
        f: dict[str, Any] = {k: prediction[k]["barrier_mean"] for k in ("unaligned", "weight_matched", "activation_matched")}
        f["relationship"] = pair["relationship"]["name"]
        rule = first(RECOMMENDATIONS, f)
    else:
        rule = RECOMMENDATIONS[0] if prediction["twin"]["barrier_mean"] < GO_THRESHOLD else RECOMMENDATIONS[1]
    return {"method": rule.name, "advice": rule.advice}
