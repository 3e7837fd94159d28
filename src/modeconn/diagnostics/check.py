"""``check``: "will these two merge?" — diagnostics and a predicted barrier, without evaluating the path (of each
aligned path its midpoint alone, :mod:`~modeconn.diagnostics.midpoint`).

The relationship of two models, per-space identifiability and per-layer symmetry breaking
(:mod:`~modeconn.diagnostics.pair`, :mod:`~modeconn.diagnostics.structure`), mapped to predicted test-loss
``barrier_mean`` values by the stated predictor of :mod:`~modeconn.diagnostics.predictor` (docs/methods.md §1,
"Prediction"). The relationship and the recommended method come from ordered rule tables
(:data:`RELATIONSHIPS`, :data:`RECOMMENDATIONS`): the first entry whose test holds wins.

Undefined numbers never become a verdict. A diagnostic whose formula has no value — no symmetry space at all (a linear
probe), every unit of a model constant on the data, an all-zero weight tensor, a zero denominator, a NaN/Inf — is
``None`` with the reason recorded (``features["undefined"]``, a layer's ``undefined``), a prediction from it is
:func:`~modeconn.diagnostics.predictor.not_applicable`, and where the verdict rests on one the verdict is "not
applicable": ``prediction["go"]`` None, ``prediction["not_applicable"]`` the reason, relationship "undetermined" and
recommendation "not applicable" (measure the barrier instead).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..checks import check_finite
from ..data import DatasetBundle, make_loader
from ..errors import ConfigError
from ..match.progress import reporter
from ..nn_utils import model_device
from .midpoint import aligned_midpoints
from .pair import SPACE_STATISTICS, collect, space_statistics, weight_cosines
from .predictor import GO_THRESHOLD, LogLinear, not_applicable
from .structure import model_identifiability

FINE_TUNE_COSINE = 0.8
"""Mean identity weight cosine at or above which two models are called fine-tunes of one base."""
IDENTIFIED_RATIO = 0.9
"""Mean identity / optimal activation-matching ratio at or above which the units are already aligned."""
PERMUTATION_SHARE = 0.5
"""Below this ``q̄(optimal permutation) / q̄(optimal orthogonal map)`` permutations explain too little of the
correlation the best orthogonal map finds: the pair needs a continuous group."""
NO_SPACES = ("the model has no symmetry space (no units that can be permuted): the mean unit correlation the "
             "predictor reads is not defined, and there is nothing to align")
NO_LAYERS = ("model A has no Linear / Conv2d layer whose outputs form a permutation space: no symmetry to break, "
             "the twin predictor's relative swap cost is not defined")
UNDETERMINED = "undetermined"
NOT_APPLICABLE = "not applicable"


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
    Rule("weight matching", lambda f: f["weight_matched"] <= min(f["activation_matched"], 0.5 * f["unaligned"]),
         "weight matching is predicted to reduce the barrier (at least halve it), not to remove it, and as much as "
         "activation matching: align with weight matching (data-free)"),
    Rule("activation matching", lambda f: f["activation_matched"] <= 0.5 * f["unaligned"],
         "activation matching is predicted to reduce the barrier (at least halve it) most, not to remove it: align "
         "with activation matching (--method activation)"),
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


def _mean(items: Mapping[str, tuple[float | None, str | None]], what: str, none: str) -> tuple[float | None, str | None]:
    """``(mean, None)`` of ``items`` (name → (value, why it is undefined)), or ``(None, why)``: no items (``none``),
    an undefined or non-finite item (named: ``what`` and the name). A value None without a reason is not part of
    the mean (a statistic that does not apply there, e.g. ``q_weight`` of a non-permutation space)."""
    if not items:
        return None, none
    vals = []
    for name, (v, why) in items.items():
        if why is not None or (v is not None and not np.isfinite(v)):
            return None, f"{what} {name!r}: {why or f'the value is {v}'}"
        if v is not None:
            vals.append(float(v))
    return (float(np.mean(vals)), None) if vals else (None, f"no {what} has a value")


def pair_features(spaces: Mapping[str, Mapping[str, Any]], cosines: Mapping[str, Mapping[str, Any]],
                  corr: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Space means of the per-space statistics, layer means of the weight cosines, and the permutation share
    ``q̄(optimal permutation) / q̄(orthogonal)`` with ``q(orthogonal) = ‖corr‖_* / n`` (nuclear norm: the best
    orthogonal map's mean correlation, ≥ the best permutation's).

    A feature is None where it is undefined — no space (:data:`NO_SPACES`), a space or tensor where its statistic is
    (their ``undefined``), no weight tensor, ``q̄(orthogonal) = 0`` — and ``features["undefined"]`` maps it to why."""
    f: dict[str, Any] = {}
    why: dict[str, str] = {}

    def put(name: str, value_why: tuple[float | None, str | None]) -> None:
        f[name] = value_why[0]
        if value_why[1] is not None:
            why[name] = value_why[1]

    def per_space(key: str) -> dict[str, tuple[float | None, str | None]]:
        return {s: (v[key], v.get("undefined", {}).get(key)) for s, v in spaces.items()}

    for key in SPACE_STATISTICS:
        put(key, _mean(per_space(key), "space", NO_SPACES))
    nuclear = {s: (float(torch.linalg.matrix_norm(c.double(), ord="nuc")) / c.shape[0], per_space("q_optimal")[s][1])
               for s, c in corr.items()}
    put("q_orthogonal", _mean(nuclear, "space", NO_SPACES))
    q_opt, q_orth = f["q_optimal"], f["q_orthogonal"]
    put("permutation_share", (q_opt / q_orth, None) if q_opt is not None and q_orth is not None and q_orth > 0 else
        (None, why.get("q_orthogonal") or why.get("q_optimal") or "q̄(orthogonal) is 0: the share is 0/0"))
    no_tensor = "no weight tensor with ≥ 2 dimensions is bound to a space"
    for name, key in (("weight_cosine_identity", "identity"), ("weight_cosine_matched", "weight_matched")):
        put(name, _mean({k: (c[key], c.get("undefined")) for k, c in cosines.items()}, "tensor", no_tensor))
    f["undefined"] = why
    return f


def twin_undefined(layers: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why the twin feature (:func:`twin_feature`) is undefined: no candidate layer, or a layer whose relative swap
    cost is undefined (named); None when it is defined."""
    if not layers:
        return NO_LAYERS
    bad = next(((n, v) for n, v in layers.items() if v.get("undefined") or v["relative_swap_cost"] is None), None)
    return None if bad is None else f"layer {bad[0]!r}: {bad[1].get('undefined') or 'no relative swap cost'}"


def twin_feature(layers: Mapping[str, Mapping[str, Any]]) -> float | None:
    """``min`` over layers of ``relative_swap_cost`` (0 for a network whose symmetry is unbroken); None where
    :func:`twin_undefined` gives a reason."""
    if twin_undefined(layers) is not None:
        return None
    return float(min(v["relative_swap_cost"] for v in layers.values()))


def undefined_reason(undefined: Mapping[str, str]) -> str | None:
    """One sentence for a map feature → why it is undefined (features sharing a reason grouped); None if empty."""
    by_reason: dict[str, list[str]] = {}
    for name, why in undefined.items():
        by_reason.setdefault(why, []).append(name)
    return "; ".join(f"{why} (undefined: {', '.join(names)})" for why, names in by_reason.items()) or None


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
    for m, name in ((model_a, "model A"), (model_b, "model B")):
        if m is not None:  # NaN/Inf weights would make every diagnostic NaN: the input's fault, named
            check_finite(m.state_dict(), name)


def _endpoint(model: nn.Module, loader) -> dict[str, float]:
    from ..path import evaluate_model

    r = evaluate_model(model, loader)
    return {"test_loss": float(r["loss"]), "test_acc": float(r["acc"])}


def _line(model: LogLinear, x: float | None, why: str | None, features: Mapping[str, float],
          x_se: float | None = None) -> dict[str, Any]:
    """``model``'s prediction at ``x`` (standard error ``x_se`` where ``x`` is measured; ``features``: the values of
    its further terms), or :func:`not_applicable` for an undefined ``x`` (``why``)."""
    if x is None or why is not None:
        return not_applicable(why or f"{model.feature} is undefined")
    return model.predict(x, x_se or 0.0, **features)


ALIGNMENTS = {"unaligned": "q_identity", "weight_matched": "q_weight", "activation_matched": "q_optimal"}
"""Each pair prediction and the mean unit correlation its ``x = 1 − q̄`` reads (identity, weight matching's, the
optimal permutation) — unless its line reads the aligned path's midpoint (:data:`MIDPOINT_FEATURES`)."""

MIDPOINT_FEATURES = {"unaligned": "barrier over λ = 0, 1/2, 1 as they are",
                     "weight_matched": "barrier over λ = 0, 1/2, 1 after weight matching",
                     "activation_matched": "barrier over λ = 0, 1/2, 1 after activation matching"}
"""The ``feature`` of a calibration line whose ``x`` is the aligned path's barrier over its endpoints and midpoint
alone, ``max(L(½), L_A, L_B moved) − (L_A + L_B moved) / 2`` on the evaluation examples
(:mod:`~modeconn.diagnostics.midpoint`): one point of the path ``modeconn barrier`` measures, a direct small-sample
measurement of the aligned barrier."""


def label_entropy(dataset) -> float:
    """Entropy (nats) of the label marginal of ``dataset`` (a ``TensorDataset(x, labels)``; sequence labels
    ``(N, T)`` count every token, negative labels — ignored positions — none): the loss of the best prediction that
    ignores the input."""
    y = dataset.tensors[1].flatten()
    counts = torch.bincount(y[y >= 0].long()).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def endpoint_features(entropy: float, endpoints: list[dict[str, float]],
                      moved: Mapping[str, Mapping[str, float | None]] | None = None) -> dict[str, Any]:
    """The endpoint features of the predictor (:mod:`~modeconn.diagnostics.predictor`): the label entropy H
    (``entropy``), the endpoints' mean ``test_loss`` L, ``headroom = H − L`` (what the models learned beyond the
    label marginal) and, for a pair, per alignment (``moved``: :func:`~modeconn.diagnostics.midpoint.aligned_midpoints`)
    ``moved_loss[name]``, the test loss of B moved by the alignment's permutation, ``midpoint_barrier[name]``, the
    aligned path's barrier over λ ∈ {0, ½, 1} alone, and ``midpoint_se[name]``, its standard error (None where no midpoint
    was evaluated)."""
    losses = [e["test_loss"] for e in endpoints]
    loss = float(np.mean(losses))
    moved = dict(moved or {})
    return {"label_entropy": entropy, "test_loss": loss, "headroom": entropy - loss,
            **{key: {k: v[key] for k, v in moved.items()} for key in ("moved_loss", "midpoint_barrier", "midpoint_se")}}


def optimal_element(spec, corr: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The optimal permutation of each permutation space's correlation (activation matching's element on the
    activations ``check`` read); the identity on the other spaces."""
    from ..identifiability import identity_vs_optimal

    element = dict(spec.identity())
    for s, c in corr.items():
        if element[s].dim() == 1:
            element[s] = identity_vs_optimal(c)["perm"].to(element[s].device)
    return element


def not_a_symmetry(layer: str, moved_loss: float | None) -> str:
    """Why no barrier after alignment is predicted for a model with fixed asymmetric structure."""
    moved = "" if moved_loss is None else f"; B moved by it has test loss {moved_loss:.3f}"
    return (f"layer {layer!r} has fixed asymmetric structure: a permutation is not a symmetry of the model, so the "
            f"aligned B computes another function{moved}, and the calibration holds no such pair (align nothing, or "
            "measure it: modeconn barrier)")


def _predict(pair: Mapping[str, Any] | None, layers, calibration: Mapping[str, LogLinear],
             endpoint: Mapping[str, Any]) -> dict:
    """The predictions, ``go`` and ``not_applicable`` (the reason the verdict's own prediction — the pair's when
    there is one, else the twin's — does not exist, or None)."""
    twin = twin_feature(layers)
    head = {k: endpoint[k] for k in ("headroom", "test_loss", "label_entropy")}
    fixed = next((n for n, v in layers.items() if v.get("asymmetric")), None)
    out: dict[str, Any] = {"threshold": GO_THRESHOLD,
                           "twin": _line(calibration["twin"], twin, twin_undefined(layers), head),
                           "twin_feature": twin, "endpoint_features": dict(endpoint),
                           "calibration": {k: v.to_json() for k, v in calibration.items()}}
    if pair is not None:
        for name, key in ALIGNMENTS.items():
            model = calibration.get("pair" if name == "unaligned" else name, calibration["pair"])
            midpoint = model.feature == MIDPOINT_FEATURES.get(name)
            terms = {t for t, _ in model.terms}
            why = next((pair["undefined"][k] for k in ((() if midpoint else (key,)) + tuple(terms))
                        if k in pair["undefined"]), None)
            if name != "unaligned" and fixed is not None and why is None:
                why = not_a_symmetry(fixed, endpoint["moved_loss"].get(name))
            x = endpoint["midpoint_barrier"].get(name) if midpoint else None if pair[key] is None else 1.0 - pair[key]
            se = endpoint["midpoint_se"].get(name) if midpoint else None
            out[name] = _line(model, x, why, {**head, "cka": pair["cka"]}, se)
    why = undefined_reason(pair["undefined"]) if pair is not None else out["twin"].get("not_applicable")
    out["not_applicable"] = why
    out["go"] = None if why else out["unaligned" if pair is not None else "twin"]["barrier_mean"] < GO_THRESHOLD
    return out


def check(model_a: nn.Module, model_b: nn.Module | None = None, *, data: DatasetBundle, max_batches: int = 5,
          batch_size: int = 500, eval_limit: int = 2000, seed: int = 0,
          calibration: Mapping[str, LogLinear] | None = None, device: str | torch.device | None = None,
          progress: Callable[..., None] | bool = True) -> CheckResult:
    """Will ``model_a`` and ``model_b`` merge without alignment? With ``model_a`` alone: would an independently
    trained twin of it (same architecture, fixed structure and data, another seed)?

    Of the interpolation paths only one point is evaluated, the midpoint of each path (as the models are and after
    each alignment): the endpoints' test loss (first ``eval_limit`` test examples; also of B moved by weight
    matching's and by the optimal activation permutation, and of the midpoint ``(θ_A + g·θ_B) / 2`` of each, g the
    identity included, :mod:`~modeconn.diagnostics.midpoint`),
    activations of both models on ``max_batches`` training batches of ``batch_size``, one weight matching, and
    realization costs of model A's layers (module docstrings of :mod:`modeconn.diagnostics`).

    Args:
        model_a, model_b: classifiers of one architecture (logits ``(N, num_classes)``); never modified.
        data: the dataset bundle the models were trained on.
        calibration: ``{"pair": LogLinear, "twin": LogLinear}`` and optionally ``"weight_matched"`` /
            ``"activation_matched"`` lines for the predictions after alignment (absent: the pair line); default the
            fit shipped in :mod:`modeconn.diagnostics.calibration`.
        device: where the forward passes and weight matching's score products run (copies of the models are moved
            there; ``None``: the models' own device). ConfigError naming ``device`` if it is not available.
        progress: ``progress("check", phases done, phases, phase=next phase)`` between the phases (endpoints,
            realization costs, then for a pair weight matching — which reports its own sweeps — and activations;
            :mod:`modeconn.match.progress`); True (default): tqdm bars on stderr; False: silent.
    Returns:
        :class:`CheckResult`: ``prediction["unaligned" | "weight_matched" | "activation_matched" | "twin"]`` each
        ``{"barrier_mean", "low", "high"}`` (test loss, nats; ``low ≤ barrier_mean ≤ high``) or, where its diagnostic
        is undefined, those None and ``not_applicable`` the reason; ``prediction["go"]`` (unaligned, or the twin's,
        below :data:`~modeconn.diagnostics.predictor.GO_THRESHOLD`) — None, with ``prediction["not_applicable"]``
        the reason, when any feature of the pair (of A alone: the twin feature) is undefined (module docstring);
        the aligned predictions are not applicable (with the reason) for a model with fixed asymmetric structure,
        where a permutation is not a symmetry; ``prediction["endpoint_features"]``: ``label_entropy``,
        ``headroom``, ``moved_loss``, ``midpoint_barrier`` and ``midpoint_se`` (:func:`endpoint_features`);
        ``recommendation`` (method, advice) and the diagnostics behind them.
    Raises:
        ConfigError: not modules, ``data`` not a DatasetBundle, models of different keys or shapes, a bad
            ``max_batches`` — before any forward pass.
        NonFiniteError: a parameter or buffer with NaN/Inf entries (model and tensor named), before any forward pass.
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
    phase = _phases(reporter(progress), ["endpoints", "realization costs"]
                    + ([] if model_b is None else ["weight matching", "activations"]))
    phase()
    endpoints = [_endpoint(m, test) for m in models]
    phase()
    layers = model_identifiability(model_a, spec, train, max_batches, seed)
    pair: dict[str, Any] = {}
    features = None
    moved: dict[str, dict[str, float | None]] = {}
    if model_b is not None:
        sa, sb = model_a.state_dict(), model_b.state_dict()
        tick = phase()
        wm = weight_matching(spec, sa, sb, progress=tick)
        phase()
        corr, samples, _, constant = collect(spec, model_a, model_b, train, max_batches, seed)
        fixed = any(v.get("asymmetric") for v in layers.values())
        moved = aligned_midpoints(spec, model_a, sa, sb, {"unaligned": spec.identity(), "weight_matched": wm.element,
                                                          "activation_matched": optimal_element(spec, corr)},
                                  test, train, max_batches, ["unaligned"] if fixed else None)
        spaces = space_statistics(spec, corr, samples, wm.element, constant)
        cosines = weight_cosines(spec, sa, sb, wm.apply(sb))
        features = pair_features(spaces, cosines, corr)
        why = undefined_reason(features["undefined"])
        rel = first(RELATIONSHIPS, features) if why is None else Rule(UNDETERMINED, bool, f"{NOT_APPLICABLE}: {why}")
        pair = {"spaces": spaces, "weights": cosines, "features": features,
                "relationship": {"name": rel.name, "advice": rel.advice}}
    phase()
    prediction = _predict(features, layers, calibration, endpoint_features(label_entropy(data.train), endpoints, moved))
    rec = _recommend(prediction, pair)
    return CheckResult(data.name, endpoints, layers, prediction, rec, pair, time.perf_counter() - start)


def _phases(tick, names: list[str]) -> Callable[[], Callable[..., None]]:
    """``next_phase()``: reports ``tick("check", done, len(names), phase=the phase starting)`` and returns ``tick``
    (for a phase that reports its own steps); the last call reports every phase done."""
    done = iter(range(len(names) + 1))

    def next_phase() -> Callable[..., None]:
        i = next(done)
        tick("check", i, len(names), **({"phase": names[i]} if i < len(names) else {}))
        return tick

    return next_phase


def _on_device(model_a: nn.Module, model_b: nn.Module | None, device) -> tuple[nn.Module, nn.Module | None]:
    """The models, or copies of them on ``device`` (the inputs are never moved)."""
    import copy

    from .._util.device import resolve_device

    dev = resolve_device(device, "device")
    if dev is None or model_device(model_a) == dev:
        return model_a, model_b
    return tuple(None if m is None else copy.deepcopy(m).to(dev) for m in (model_a, model_b))  # type: ignore[return-value]


def _recommend(prediction: Mapping[str, Any], pair: Mapping[str, Any]) -> dict[str, str]:
    """The first :data:`RECOMMENDATIONS` rule for a pair; for a twin of A alone "none" or weight matching; "not
    applicable" (measure instead) when the verdict is."""
    if prediction["not_applicable"]:
        return {"method": NOT_APPLICABLE, "advice": "no barrier can be predicted for these models; measure it instead "
                "(modeconn barrier A B)"}
    if pair:
        f: dict[str, Any] = {k: math.inf if prediction[k]["barrier_mean"] is None else prediction[k]["barrier_mean"]
                             for k in ALIGNMENTS}  # an aligned prediction not made is never "go"
        f["relationship"] = pair["relationship"]["name"]
        rule = first(RECOMMENDATIONS, f)
    else:
        rule = RECOMMENDATIONS[0] if prediction["twin"]["barrier_mean"] < GO_THRESHOLD else RECOMMENDATIONS[1]
    return {"method": rule.name, "advice": rule.advice}
