"""Evaluate the linear path between two models on a λ grid, and merge models."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .._util.statedict import with_metadata
from ..checks import check_compatible, check_finite, check_one_device
from ..errors import ConfigError, NonFiniteError
from ..models.asymmetric import fixed_structure_keys
from ..nn_utils import batchnorm_modules, eval_mode, flatten_sequence_logits, model_device
from ..symmetry import SymmetrySpec, symmetry_spec
from .batchnorm import check_bn_policy, check_bn_statistics, fixed_batches, reset_bn_stats
from .curve import Curve
from .interpolate import interpolate, merge_weights, weighted_average
from .merge_rules import MergeRule, as_rule
from .repair import channel_stats, interpolated_targets, repair_model

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
StateDict = Mapping[str, torch.Tensor]


def lambda_grid(lambdas: int | Sequence[float]) -> np.ndarray:
    """``lambdas`` points evenly spaced on [0, 1] (endpoints included) or the given values (each in [0, 1])."""
    if isinstance(lambdas, int):
        if lambdas < 2:
            raise ConfigError(f"lambdas must be ≥ 2 points, got {lambdas}")
        return np.linspace(0.0, 1.0, lambdas)
    grid = np.asarray(list(lambdas), dtype=float)
    if grid.ndim != 1 or len(grid) < 2 or (grid < 0).any() or (grid > 1).any():
        raise ConfigError(f"lambdas must be ≥ 2 values in [0, 1], got {grid.tolist()}")
    return grid


@torch.no_grad()
def evaluate_model(model: nn.Module, loader: Iterable, loss_fn: LossFn | None = None,
                   max_batches: int | None = None, *, where: str = "evaluation") -> dict[str, float]:
    """Mean loss (default cross-entropy, nats), accuracy (fraction) and sample count ``n`` of ``model`` in
    eval mode over ``loader`` (batches ``(x, y)``, labels int64); training flags are restored.

    Sequence models (logits ``(B, T, V)``, labels ``(B, T)``) are scored per token via
    :func:`flatten_sequence_logits`: ``loss`` is the mean next-token cross-entropy in nats per token
    (perplexity ``exp(loss)``), ``acc`` the fraction of tokens whose argmax is the label, ``n`` the number of
    tokens; ``loss_fn`` then receives the flattened ``(B·T, V)`` / ``(B·T,)`` tensors.
    Raises ConfigError for an empty loader, NonFiniteError (message starting with ``where``, e.g. the λ and split,
    and naming the batch) when a logit or the loss is NaN/Inf — a number computed from them is never returned."""
    loss_fn = loss_fn or (lambda logits, y: F.cross_entropy(logits, y, reduction="sum"))
    device = model_device(model)
    total, correct, n = torch.zeros((), dtype=torch.float64), 0, 0
    with eval_mode(model):
        for i, (x, y, *_) in enumerate(loader):
            if max_batches is not None and i >= max_batches:
                break
            x, y = x.to(device), y.to(device)
            logits, y = flatten_sequence_logits(model(x), y)
            _check_finite_output(logits, "logits", where, i)
            loss = loss_fn(logits, y).double().cpu()
            _check_finite_output(loss, "loss", where, i)
            total += loss
            correct += int((logits.argmax(-1) == y).sum())
            n += len(y)
    if n == 0:
        raise ConfigError("evaluation data is empty (no samples)")
    return {"loss": float(total) / n, "acc": correct / n, "n": n}


def _check_finite_output(t: torch.Tensor, what: str, where: str, batch: int) -> None:
    """NonFiniteError ``"<where>: <what> of batch <i> has k NaN/Inf entries"`` unless every entry is finite."""
    bad = ~torch.isfinite(t.detach())
    if bool(bad.any()):
        raise NonFiniteError(f"{where}: the {what} of batch {batch} has {int(bad.sum())} NaN/Inf entries "
                             f"(of {t.numel()}); no loss or accuracy is reported from a non-finite output")


def point_label(lam: float) -> str:
    """How errors name a point of a path: ``"θ(λ=0.5)"``."""
    return f"θ(λ={lam:g})"


class _Workbench:
    """A private copy of the model that points of a path are loaded into (the caller's model is never
    touched), plus the fixed batches for BatchNorm re-estimation and REPAIR."""

    def __init__(self, model: nn.Module, bn: str, bn_loader, bn_batches: int | None, spec: SymmetrySpec | None):
        check_bn_policy(bn)
        self.model = copy.deepcopy(model)
        self.bn = bn
        self.has_bn = bool(batchnorm_modules(self.model))
        needs_data = bn == "repair" or (bn == "reset" and self.has_bn)
        if needs_data and bn_loader is None:
            raise ConfigError(f"bn={bn!r} needs bn_loader= (training batches to re-estimate statistics)")
        self.batches = fixed_batches(bn_loader, bn_batches) if needs_data else []
        self.spec = spec
        if bn == "repair" and self.spec is None:
            self.spec = symmetry_spec(self.model, self.batches[0][:2].to(model_device(self.model)))
        self.points = list(self.spec.repair_points) if bn == "repair" else []

    def endpoint_stats(self, sd: StateDict):
        self.model.load_state_dict(sd)
        return channel_stats(self.model, self.points, self.batches)

    def load(self, sd: StateDict, endpoint: bool, targets=None) -> nn.Module:
        self.model.load_state_dict(sd)
        if endpoint:
            return self.model
        if self.bn == "reset":
            reset_bn_stats(self.model, self.batches)
        elif self.bn == "repair":
            repair_model(self.model, targets, self.points, self.batches)
        return self.model


def check_fixed_structure(model: nn.Module, state_dicts: Sequence[StateDict], names: Sequence[str]) -> None:
    """W-asymmetric layers' fixed offsets/masks (F, D) must be identical in every model: they are shared
    structure, not coordinates. ConfigError naming the first differing key otherwise (different mask_seed)."""
    for key in fixed_structure_keys(model):
        for sd, name in zip(state_dicts[1:], names[1:], strict=False):
            if not torch.equal(state_dicts[0][key], sd[key]):
                raise ConfigError(
                    f"fixed structure {key!r} differs between {names[0]} and {name}: W-asymmetric models must share "
                    "F and D (the same mask_seed) to be interpolated or merged"
                )


def _keep_a_stats(sd: dict, sd_a: StateDict, model: nn.Module) -> dict:
    names = {n for n, m in model.named_modules() if m in set(batchnorm_modules(model))}
    for n in names:
        for buf in ("running_mean", "running_var"):
            sd[f"{n}.{buf}"] = sd_a[f"{n}.{buf}"]
    return sd


def _two_arg_progress(progress):
    """``progress`` as a ``(i, total)`` callback or None: True gives a tqdm bar ("path points"), False None."""
    if progress is True:
        from ..match.progress import tqdm_progress

        tick = tqdm_progress()
        return lambda done, total: tick("path points", done, total)
    return progress or None


def evaluate_path(
    model: nn.Module,
    sd_a: StateDict,
    sd_b: StateDict,
    loader: Iterable | Mapping[str, Iterable],
    *,
    lambdas: int | Sequence[float] = 25,
    bn: str = "reset",
    bn_loader: Iterable | None = None,
    bn_batches: int | None = None,
    spec: SymmetrySpec | None = None,
    loss_fn: LossFn | None = None,
    max_batches: int | None = None,
    progress: Callable[[int, int], None] | bool | None = None,
) -> Curve:
    """Loss and accuracy of ``θ(λ) = (1−λ)θ_A + λθ_B`` on a λ grid.

    Args:
        model: an instance of the architecture (only used as a template: a private copy is loaded with
            each θ(λ); the caller's model and both state dicts are never mutated).
        sd_a, sd_b: endpoint state dicts (same keys/shapes/device; floats interpolated in fp32, integer
            buffers from A). λ=0 and λ=1 evaluate A and B exactly as given (no re-estimation there).
        loader: batches ``(x, y)``, or ``{"train": loader, "test": loader}`` to report several splits.
        lambdas: number of evenly spaced points (default 25, endpoints included) or explicit values.
        bn: BatchNorm policy at interior points — ``reset`` (default: running statistics re-estimated as a
            cumulative average over the fixed ``bn_loader`` batches), ``interpolate`` (statistics
            interpolated like weights), ``keep`` (A's statistics, a stale-statistics diagnostic) or
            ``repair`` (REPAIR, Jordan et al. 2023: channel statistics matched to the interpolated
            endpoint statistics, then folded). Models without BatchNorm ignore reset/keep/interpolate.
        bn_loader, bn_batches: training data for ``reset``/``repair``; the first ``bn_batches`` batches
            (all when None) are materialised once so every λ sees the same batches.
        spec: the symmetry spec (for ``repair``; traced from the first batch when None).
        loss_fn: ``loss_fn(logits, y)`` returning the *summed* loss (default cross-entropy).
        max_batches: evaluate on the first batches of each split only.
        progress: called as ``progress(i, total)`` after each point; True: a tqdm bar on stderr; None or False:
            silent.
    Returns: :class:`Curve` with per-λ ``loss`` and ``acc`` per split; ``.barrier("mean")`` etc.
    Raises: ConfigError (bad λ grid, bn policy, missing bn_loader), StateDictMismatchError,
        DeviceMismatchError, NonFiniteError (NaN/Inf weights) — all before any forward pass; NonFiniteError
        naming λ for invalid BatchNorm statistics at a point (negative/non-finite running_var, non-finite
        running_mean) and naming λ and split for a NaN/Inf logit or loss: a curve never holds a non-finite value.
    """
    grid = lambda_grid(lambdas)
    progress = _two_arg_progress(progress)
    check_bn_policy(bn)
    check_compatible([model.state_dict(), sd_a, sd_b], ["model", "A", "B"])
    check_fixed_structure(model, [sd_a, sd_b], ["A", "B"])
    check_one_device([sd_a, sd_b], ["A", "B"])
    check_finite(sd_a, "A")
    check_finite(sd_b, "B")
    loaders = dict(loader) if isinstance(loader, Mapping) else {"eval": loader}
    bench = _Workbench(model, bn, bn_loader, bn_batches, spec)
    for sd, name, lam in ((sd_a, "A", 0.0), (sd_b, "B", 1.0)):  # both endpoints before any forward pass
        bench.model.load_state_dict(sd)
        check_bn_statistics(bench.model, f"{point_label(lam)} = {name}")
    stats = [bench.endpoint_stats(sd_a), bench.endpoint_stats(sd_b)] if bn == "repair" else None
    metrics: dict[str, dict[str, list[float]]] = {s: {"loss": [], "acc": []} for s in loaders}
    for i, lam in enumerate(grid):
        lam = float(lam)
        sd = interpolate(sd_a, sd_b, lam)
        endpoint = lam in (0.0, 1.0)
        if bn == "keep" and not endpoint:
            sd = _keep_a_stats(sd, sd_a, bench.model)
        targets = interpolated_targets(stats, [1 - lam, lam]) if stats is not None else None
        net = bench.load(sd, endpoint, targets)
        check_bn_statistics(net, point_label(lam))
        for split, ld in loaders.items():
            m = evaluate_model(net, ld, loss_fn, max_batches, where=f"{point_label(lam)}, split {split!r}")
            metrics[split]["loss"].append(m["loss"])
            metrics[split]["acc"].append(m["acc"])
        if progress is not None:
            progress(i + 1, len(grid))
    return Curve(
        lambdas=grid,
        metrics={s: {k: np.asarray(v) for k, v in d.items()} for s, d in metrics.items()},
        bn=bn,
        info={"bn_batches": len(bench.batches), "has_batchnorm": bench.has_bn},
    )


def merge(
    state_dicts: Sequence[StateDict],
    weights: Sequence[float] | None = None,
    *,
    model: nn.Module | None = None,
    bn: str = "reset",
    bn_loader: Iterable | None = None,
    bn_batches: int | None = None,
    spec: SymmetrySpec | None = None,
    normalize: bool = True,
    rule: str | MergeRule = "linear",
    settings=None,
) -> dict[str, torch.Tensor]:
    """Merge aligned models: ``Σ_i w_i θ_i`` (uniform weights by default; another merge rule with ``rule``), then fix
    BatchNorm.

    Args:
        state_dicts: two or more *aligned* state dicts of one architecture (align them first, e.g.
            ``weight_matching`` + ``spec.apply``); never mutated.
        weights: one finite weight per model (default uniform). ``merge([a, b], [1, 0])`` is ``a``. With
            ``normalize`` (default) they must be ≥ 0 and are divided by their sum (``[0.7, 0.7]`` averages);
            ``normalize=False`` uses any finite weights as given (task-arithmetic sums, extrapolation such as
            ``[2, -1]``; then prefer ``bn="reset"``). See :func:`~modeconn.path.interpolate.merge_weights`.
        model: an instance of the architecture; needed for ``bn="reset"`` on a model with BatchNorm and
            for ``bn="repair"``. Without a model the average is returned as is (statistics averaged).
        bn: ``reset`` (default), ``interpolate`` (statistics averaged like weights), ``keep`` (the first
            model's statistics) or ``repair`` (REPAIR with the endpoints' channel statistics, folded back
            into the weights).
        bn_loader, bn_batches, spec: as in :func:`evaluate_path`.
        rule: the merge rule, a name of :data:`~modeconn.path.merge_rules.MERGE_RULES` or its entry (``linear``: the
            weighted average);
            ``settings``: its base model, parameters and seed (:class:`~modeconn.path.merge_rules.RuleSettings`).
    Returns: the merged state dict (input dtypes kept). With a model, W-asymmetric fixed structure is the first
    model's (checked identical in all) and integer buffers are never averaged.
    Raises: ConfigError (bad weights naming the entry, bn policy, missing bn_loader), StateDictMismatchError,
        DeviceMismatchError, NonFiniteError (NaN/Inf inputs; with a model, invalid merged BatchNorm statistics —
        negative/non-finite running_var, non-finite running_mean — under bn="interpolate"/"keep").
    """
    if len(state_dicts) < 2:
        raise ConfigError(f"merge needs at least two state dicts, got {len(state_dicts)}")
    check_bn_policy(bn)
    names = [f"model {i}" for i in range(len(state_dicts))]
    check_compatible(list(state_dicts), names)
    check_one_device(list(state_dicts), names)
    for sd, name in zip(state_dicts, names, strict=False):
        check_finite(sd, name)
    weights = merge_weights(weights, len(state_dicts), normalize=normalize)
    rule = as_rule(rule)  # a typo names the rules before any work
    if model is None:
        if bn == "repair":
            raise ConfigError("bn='repair' needs model= and bn_loader=")
        return weighted_average(state_dicts, weights, check=False, normalize=False, rule=rule, settings=settings)
    check_compatible([model.state_dict(), state_dicts[0]], ["model", names[0]])
    check_fixed_structure(model, state_dicts, names)
    merged = weighted_average(state_dicts, weights, check=False, normalize=False, keep=fixed_structure_keys(model),
                              rule=rule, settings=settings)
    bench = _Workbench(model, bn, bn_loader, bn_batches, spec)
    targets = None
    if bn == "repair":
        targets = interpolated_targets([bench.endpoint_stats(sd) for sd in state_dicts], weights)
    if bn == "keep":
        merged = _keep_a_stats(merged, state_dicts[0], bench.model)
    net = bench.load(merged, endpoint=False, targets=targets)
    check_bn_statistics(net, "merged model")
    final = net.state_dict()
    return with_metadata({k: v.detach().clone() for k, v in final.items()}, final)
