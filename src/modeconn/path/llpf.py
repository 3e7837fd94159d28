"""Low-Loss Path Finding, LLPF (layer-wise connectivity; reference code twoentartian/DFL_torch,
``tool/find_high_accuracy_path_v2``). docs/methods.md §2.

**Model-to-model (M2M)** from θ_A to a destination D = θ_B. The current point P starts at θ_A; every *tick*:

1. *move*: every unlocked group's parameters ``p ← p + s·(D − p)`` (a fraction ``step`` = s of the remaining
   distance; ``torch.lerp``);
2. *variance correction*: each corrected tensor w is put back on its "variance sphere",
   ``w ← mean(w) + (w − mean(w))·sqrt(v*/var(w))`` (unbiased variance over all entries, mean kept — the
   reference's rescaling without its ε), because averaging uncorrelated weights shrinks their variance;
3. *refine*: plain SGD (``p ← p − lr·∇L``: no momentum, no weight decay) on every trainable parameter
   (locked groups included), one minibatch per step, until the mean of the last ``max(1, min_steps)``
   minibatch losses is ≤ ``threshold`` and at least ``min_steps`` steps were taken, at most ``max_steps``;
4. *projection*: the variance correction again.

*The refinement target is relative to the endpoints* (default ``threshold=None``; docs/methods.md §2: the
paper keeps the loss *low along the path*, i.e. near the endpoints' own loss, with the reference setting its
threshold a little above the endpoints' train loss). Before the first tick the run measures each endpoint's
train loss the way the refinement measures the path's — mean minibatch loss, train mode, over
:data:`ENDPOINT_BATCHES` minibatches drawn from a generator of its own (``seed``; the run's random stream is
untouched) — and sets ``threshold = max(L_A, L_B) + threshold_margin`` (M2O: ``L_A + threshold_margin``). The
default margin :data:`THRESHOLD_MARGIN` is the low-loss margin of the path verdict
(:data:`~modeconn.path.pathobj.LOW_LOSS_MARGIN`) less the continuity tolerance
(:data:`~modeconn.path.pathobj.CONTINUITY_TOL`): a path whose points meet the target and whose segments pass
the continuity check then stays within the low-loss margin of the endpoints (up to the minibatch estimate's
noise). An absolute target would be far above well-trained endpoints (the refinement stops while the path is
still many times their loss) and unreachable for endpoints with a high loss. A given ``threshold`` (nats) is
used as is. ``info["threshold"]`` records the value, the rule and the measured endpoint losses.

*Verification* (``verify_batches`` = k > 0; off by default). The windowed train-mode loss is a noisy statistic
(a tick stops on a dip of a few minibatches) in other terms than the evaluation's (for a BatchNorm network, batch
statistics against recomputed ones; an endpoint's train-mode loss can sit above its evaluated loss while a refined
point's sits below). With verification a tick whose window meets the target also has to pass a check in the
evaluation's terms on k fixed minibatches (the first k of the endpoint measurement's): on a private copy of the
point, BatchNorm statistics recomputed from them (:func:`~modeconn.path.batchnorm.reset_bn_stats`), then the
eval-mode loss over them, compared with the higher endpoint's loss measured the same way + ``threshold_margin``
(paired on the same examples, so the comparison does not carry the minibatches' sampling noise). Each check is
2k forward passes without gradient, counted in ``info["verify_forwards"]``, not in ``grad_evals``; each tick's
record has its last ``verified_loss``; ``info["threshold"]["verify"]`` the endpoints' values and the target.

The point after each tick is a point of the path (every ``record_every``-th tick is stored); the last
point is D itself (``info["final_gap"]``: ‖P_T − D‖/‖θ_A − D‖ over the parameters, the jump the last segment
makes — the continuity check of :meth:`Path.evaluate` measures it).

*Closing* (``closing_ticks`` = n > 0; off by default). A refinement that meets a target at the endpoints' own
loss pulls each point off the move schedule, so the schedule's last point can end several percent of the A–B
distance from B, and the path closes with one long straight segment to B that a continuity check with a few
sub-points sees only at its middle. n closing ticks after the schedule store n points on that segment, dividing it
into n+1 equal parts (no variance correction, no refinement: the path is the same polyline, now stored — and
evaluated — at n more points along its closing segment; ``info["final_gap"]`` is then the last part's length).
They take no share of the budget. Closing *with* refinement (moving a drifted point towards B and refining it)
was tried and left out: the refined points leave the straight segment, and the chord from the schedule's last point
to the first of them rose far above both (docs/results/llpf-budget).

Decisions (documented here because the paper and reference leave room):

- *Variance targets* (``variance_target``): ``"interpolate"`` (default) — tensor w of group g has target
  ``v*_w = var_D(w) + r_g·(var_S(w) − var_D(w))`` with ``r_g = (1−s)^{ticks g was unlocked}`` the fraction of
  the distance the move schedule has left (1 while locked). For M2M between modes of the same
  hyper-parameters var_S ≈ var_D and this is the reference's "keep the source's sphere" up to the small
  per-layer difference, but it lands the path exactly on D's sphere at the end, so the final segment does
  not have to jump between spheres. ``"source"``: ``v*_w = var_S(w)`` (the reference's ``FollowOthers`` with
  the start model; LLPF paper: "its original variance sphere").
- *Which tensors are corrected* (``variance_correction``): ``"weights"`` (default) — parameters with ≥ 2
  dimensions of non-normalization modules (Linear/Conv kernels, embeddings): the tensors whose variance
  averaging shrinks and on whose scale the function depends through the following normalization. Biases
  (their "variance" across units is not a scale) and normalization affine parameters (meaningful
  per-channel gains, not random-like) are moved but not rescaled. ``"all"``: every floating parameter with
  > 1 entry (the reference's choice), ``"none"``: no correction (ablation).
- *Follow Data Flow (FDF) groups* (:func:`fdf_groups`): one pass over the torch.fx trace; every module that
  owns parameters starts a group when the graph reaches it, except a normalization layer applied directly to
  a writer's output, which joins the writer's group (``conv + its BN``); parallel branches (the ResNet
  shortcut conv + BN) are their own groups at the position the graph reaches them; parameters read with
  ``get_attr`` are a group each; parameters never reached close the list. Group g is unlocked at tick
  ``g·unlock_every`` (so the first group moves from tick 0; ``order="all"`` moves everything from tick 0, the
  ablation the paper reports to fail on ResNet18/DLA). ``fdf_groups(model, level=2)`` merges consecutive
  groups of one module prefix (e.g. a ResNet stage: the reference's "one stage per 2,000 ticks").
- *BatchNorm*: affine parameters are path coordinates (moved, refined); running statistics are not (left as
  the refinement's train-mode passes leave them); :meth:`Path.evaluate` recomputes them per point.

**Model-to-origin (M2O)**: D = 0 for every parameter of non-normalization modules (weights and biases:
``p ← (1−s)·p``), normalization layers are not moved, no variance correction. The refinement uses the
*angle-conformal* learning rate, per layer: ``lr_w = lr · var(w)/var₀(w)`` for each ≥2-d weight w of a
non-normalization module (var₀ at the source), the module's other parameters (bias) share its factor,
normalization parameters keep ``lr``. For a layer followed by a normalization (scale-invariant), the
gradient scales as 1/‖w‖, so the angular step ``lr_w·‖∇‖/‖w‖`` stays constant as ‖w‖ shrinks.

**Cross-sphere** (modes trained with different weight decay): M2O-like ticks scale each module by
``c = clip(sqrt(var_B(w)/var(w)), 1−s, 1+s)`` until, after a move, every ≥2-d weight's variance is within
``sphere_rtol`` of B's (or ``m2o_max_ticks``), then M2M from there (its variance targets start at that
point's variances). ``info["phase_boundary"]`` is the index of the switch point.

Every random choice (minibatch order, dropout) comes from ``torch.Generator().manual_seed(seed)``. With
``out_dir`` the run checkpoints every ``checkpoint_every`` ticks (points written as safetensors shards, then
the state — current weights, generator state, data position, records — atomically); ``resume=True``
continues a killed run and yields the same path bytes as an uninterrupted one. Resuming trusts nothing it
has not checked: the state file carries the sha256 of its own tensors and of every shard written so far,
all verified before the run continues (a modified or corrupt file is named, CheckpointError); and the run's
fingerprint covers the settings, both endpoints' contents and the training data (the caller's
``data_info`` — dataset name, split, limit — plus the number of examples and the sha256 of all of them,
which every minibatch is drawn from), so a resume with anything different is refused with a ConfigError
naming what differs.

Compute is counted in ``grad_evals`` (one per minibatch backward), the unit shared with the curve methods.
With ``budget`` (grad evals) the run never exceeds it: each tick's refinement is capped at its fair share
``⌊(budget − spent) / ticks left⌋`` (unspent steps roll over to later ticks; ``min_steps`` is lowered to the
share where it is smaller), so the whole schedule fits — which needs ``budget ≥`` the number of ticks (for
cross-sphere ``m2o_max_ticks + ticks``), checked before any work.

*Reaching B*: ``info["reached_b"]`` is True when an M2M / cross-sphere run finished its schedule and closed
the path at B; a run stopped early (``stop_on_unreached``) ends at its last tick without B (False; M2O: None,
its destination — the origin — is never a point). Whether the path is *complete* also needs the continuity
check of the evaluated path (:meth:`~modeconn.path.pathobj.PathCurve.completeness`): the last segment jumps
``final_gap`` of the way to B, and only the loss along it tells whether that jump is low-loss.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import pathlib
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

import torch
import torch.fx
import torch.nn as nn
from pydantic import Field, model_validator
from safetensors import safe_open

from .._util.digest import tensors_sha256
from .._util.jsonio import to_json
from ..checks import check_compatible, check_finite
from ..config import StrictConfig
from ..errors import CheckpointError, ConfigError, NonFiniteError
from ..io import save_state_dict
from ..nn_utils import mean_cross_entropy
from ._stream import BatchStream, data_fingerprint, resolve_dataset
from .batchnorm import reset_bn_stats
from .curves import check_endpoints
from .llpf_layers import corrected_keys, norm_param_keys, param_owners, project_to_variance_, resolve_groups
from .llpf_layers import scale_to_variance as scale_to_variance  # public here (modeconn.path.scale_to_variance)
from .llpf_layers import fdf_groups as fdf_groups  # public here (modeconn.path.llpf.fdf_groups)
from .llpf_layers import tensor_variance, weight_keys
from .pathobj import CONTINUITY_TOL, LOW_LOSS_MARGIN, MANIFEST, Path, cpu_clone, distance, model_keys, param_names
from .pathobj import sha256_file, write_shard

StateDict = Mapping[str, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

STATE_FILE = "llpf-state.safetensors"
STATE_VERSION = 2  # 2: fingerprint parts (settings, endpoints, training data) and sha256 of the state's tensors


# ----------------------------------------------------------------------------------------- the engine


_PART_LABELS = {"mode": "mode", "settings": "settings", "A": "endpoint A (content sha256)",
                "B": "endpoint B (content sha256)", "data": "training data"}


def _short(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    if len(text) == 64 and all(ch in "0123456789abcdef" for ch in text):
        return text[:12] + "…"  # a sha256
    return text if len(text) <= 60 else text[:57] + "…"


def fingerprint_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between two runs' fingerprint parts (``{"mode", "settings", "A", "B",
    "data"}``), e.g. ``["settings: lr 0.05 → 0.02", "training data: examples 200 → 300, sha256 1a2b… → 3c4d…"]``."""
    out = []
    for part, label in _PART_LABELS.items():
        a, b = old.get(part), new.get(part)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys = [k for k in list(a) + [k for k in b if k not in a] if a.get(k) != b.get(k)]
            out.append(f"{label}: " + ", ".join(f"{k} {_short(a.get(k))} → {_short(b.get(k))}" for k in keys))
        else:
            out.append(f"{label}: {_short(a)} → {_short(b)}")
    return out


Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
BUDGET_TICKS_PER_SQRT = 2.0
"""With a budget and no ``ticks``, an LLPF run makes ``≈ 2·√budget`` ticks (:meth:`LLPFConfig.for_budget`)."""
STEP_TIMES_TICKS = 6.0
"""With a budget and neither ``step`` nor ``ticks`` given, ``step = 6 / ticks``."""


ENDPOINT_BATCHES = 32
"""Minibatches over which each endpoint's train loss is measured for the relative refinement target (a train-mode
estimate on few minibatches of a BatchNorm network varies by more than the target's margin from seed to seed)."""
THRESHOLD_MARGIN = LOW_LOSS_MARGIN - CONTINUITY_TOL
"""Default refinement target above the higher endpoint's train loss (nats): the low-loss margin less the continuity
tolerance, so a continuous path of points at the target is low-loss."""


def relative_threshold(endpoint_losses: Sequence[float], margin: float = THRESHOLD_MARGIN) -> float:
    """LLPF's refinement target relative to the endpoints: ``max(endpoint_losses) + margin`` (nats).

    Raises: ConfigError when there is no endpoint loss or one is not finite (the target would be meaningless)."""
    losses = [float(v) for v in endpoint_losses]
    if not losses or not all(math.isfinite(v) for v in losses):
        raise ConfigError(f"LLPF's relative threshold needs finite endpoint losses, got {losses}")
    return max(losses) + margin


class LLPFConfig(StrictConfig):
    """Settings of an LLPF run (:func:`llpf_m2m`, :func:`llpf_m2o`, :func:`llpf_cross_sphere`). Unknown fields
    (typos) and bad values raise ConfigError naming the field, before any work.

    Attributes:
        step: fraction s ∈ (0, 1] of the remaining distance each unlocked group moves per tick (M2M), or the
            shrink factor per tick (M2O: ``p ← (1−s)·p``). Reference: 0.001 with 16,000 ticks on ResNet18.
        ticks: number of ticks (M2M: ``ticks // record_every`` + 2 points; cross-sphere: M2M ticks after the
            M2O phase). With a ``budget`` and no ``ticks`` (nor ``step``), both are scaled to the budget
            (:meth:`for_budget`: ≈ 2·√budget ticks).
        unlock_every: ticks between FDF unlocks (default ``max(1, ticks // (3·groups))``: every group is
            unlocked within the first third of the run).
        order: ``"fdf"`` (:func:`fdf_groups`), ``"all"`` (every layer from tick 0: the ablation), or explicit
            groups of parameter names in unlock order (covering every parameter once). M2O ignores it.
        fdf_level: with ``order="fdf"``, merge consecutive groups sharing the first ``fdf_level`` module-name
            components (``fdf_groups(model, level)``; 2 on a ResNet: stem, one group per stage, head — the
            reference's stage-wise schedule). None: one group per layer.
        variance_correction: ``"weights"`` (≥2-d non-norm parameters), ``"all"`` or ``"none"``. M2O: none.
        variance_target: ``"interpolate"`` (moves with the group's progress from A's to B's variance) or
            ``"source"`` (A's variance throughout).
        lr: SGD learning rate of the refinement (reference 0.001).
        threshold: train loss (nats, mean of the last ``max(1, min_steps)`` minibatch losses) at which a tick's
            refinement stops. None (default): relative to the endpoints, ``max(L_A, L_B) + threshold_margin``
            with the endpoints' losses measured by the run (module docstring); a number: that absolute target.
        threshold_margin: nats above the higher endpoint's train loss of the relative target (default
            :data:`THRESHOLD_MARGIN`); ignored when ``threshold`` is given.
        min_steps, max_steps: refinement steps per tick (reference 20 / 20,000); ``max_steps=0`` disables
            refinement. A tick that reaches ``max_steps`` above the threshold is listed in
            ``info["unreached_ticks"]``; with ``stop_on_unreached`` the search stops there and the partial
            path (without the destination) is returned, ``info["complete"] = False``.
        batch_size: minibatch size (default: the DataLoader's, else 128).
        record_every: store every k-th tick as a point (plus the last tick and phase boundaries).
        seed: seeds the one ``torch.Generator`` of the run (minibatch order, dropout).
        checkpoint_every: ticks between checkpoints when an ``out_dir`` is given (also ticks per shard file).
        angle_conformal: M2O / cross-sphere refinement with the per-layer lr ``lr·var(w)/var₀(w)``
            (False: plain ``lr``, the ablation). M2M ignores it.
        m2o_step, m2o_max_ticks, sphere_rtol: cross-sphere only — the largest per-tick scale change, the most
            M2O ticks, and the relative variance tolerance at which B's sphere counts as reached.
        budget: most gradient evaluations of the whole run (None: no limit). Each tick's refinement is capped
            at its fair share ``⌊(budget − spent)/ticks left⌋`` (≥ 1 while ``budget ≥`` ticks — for cross-sphere
            ``m2o_max_ticks + ticks`` —, checked before any work); ticks whose share was below ``max_steps``
            record it as ``steps_cap``.
        verify_batches: 0 (default): a tick stops on the windowed train-mode loss alone. k > 0: it stops only
            when the point's *evaluated* loss also meets the target in the evaluation's terms — BatchNorm
            statistics recomputed on k fixed training minibatches, then the eval-mode loss on them — the target
            being the higher endpoint's loss measured the same way + ``threshold_margin`` (a given
            ``threshold``: that value); a failed check refines at least ``max(1, min_steps)`` more steps
            before the next one, within the tick's share of the budget (module docstring, *verification*).
        closing_ticks: M2M / cross-sphere ticks after the schedule that store points dividing the straight
            closing segment to B into ``closing_ticks + 1`` equal parts, without refinement and outside the budget
            (module docstring, *closing*); 0 (default): none. M2O ignores it.
    """

    step: Fraction = 0.01
    ticks: int = Field(500, ge=1)
    unlock_every: int | None = Field(None, ge=1)
    order: Literal["fdf", "all"] | list[list[str]] = "fdf"
    fdf_level: int | None = Field(None, ge=1)
    variance_correction: Literal["weights", "all", "none"] = "weights"
    variance_target: Literal["interpolate", "source"] = "interpolate"
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False)
    threshold: float | None = Field(None, allow_inf_nan=False)
    threshold_margin: float = Field(THRESHOLD_MARGIN, ge=0, allow_inf_nan=False)
    min_steps: int = Field(20, ge=0)
    max_steps: int = Field(2000, ge=0)
    batch_size: int | None = Field(None, ge=1)
    record_every: int = Field(1, ge=1)
    stop_on_unreached: bool = False
    seed: int = Field(0, ge=0, lt=2**63)
    checkpoint_every: int = Field(10, ge=1)
    angle_conformal: bool = True
    m2o_step: Fraction = 0.01
    m2o_max_ticks: int = Field(1000, ge=1)
    sphere_rtol: float = Field(0.01, gt=0, allow_inf_nan=False)
    budget: int | None = Field(None, ge=1)
    verify_batches: int = Field(0, ge=0)
    closing_ticks: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _steps_ordered(self) -> LLPFConfig:
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps ({self.min_steps}) must be ≤ max_steps ({self.max_steps})")
        return self

    def for_budget(self, cross: bool = False) -> LLPFConfig:
        """The schedule scaled to ``budget`` where the caller left it open (fields set explicitly are kept; no
        budget: ``self``): ``ticks ≈ 2·√budget``, so the number of ticks and the refinement per tick (the fair
        share, ≈ √budget / 2) both grow with the budget, as the paper's long schedules do; ``step =
        min(1, 6/ticks)`` (``step·ticks`` fixed: the first group ends ≈ e⁻⁶ of the way from B); cross-sphere:
        ``m2o_max_ticks = ticks``. Never more ticks than the budget pays one step each."""
        if self.budget is None:
            return self
        given, update = self.model_fields_set, {}
        if "ticks" not in given:
            ticks = max(1, round(BUDGET_TICKS_PER_SQRT * math.sqrt(self.budget)))
            update["ticks"] = max(1, min(ticks, self.budget // 2 if cross else self.budget))
        ticks = update.get("ticks", self.ticks)
        if "step" not in given and "ticks" not in given:
            update["step"] = min(1.0, STEP_TIMES_TICKS / ticks)
        if cross and "m2o_max_ticks" not in given:
            update["m2o_max_ticks"] = max(1, min(ticks, self.budget - ticks))
        return self.model_copy(update=update) if update else self


def _check_budget(mode: str, c: Mapping[str, Any]) -> None:
    """ConfigError unless the budget pays at least one refinement step per tick (the fair share ≥ 1)."""
    budget = c["budget"]
    if budget is None or c["max_steps"] == 0:
        return
    ticks = c["ticks"] + (c["m2o_max_ticks"] if mode == "cross" else 0)
    if budget < ticks:
        what = f"m2o_max_ticks + ticks = {ticks}" if mode == "cross" else f"ticks = {ticks}"
        fits = f"-o ticks={budget - ticks + c['ticks']}" if budget - ticks + c["ticks"] >= 1 else "fewer m2o_max_ticks"
        raise ConfigError(f"budget of {budget} gradient evaluations cannot pay one refinement step per tick "
                          f"({what}): give --budget {ticks} or more, or {fits} with this budget")


def _endpoint_device(model: nn.Module, sd_a: StateDict, sd_b: StateDict | None) -> torch.device:
    """The run's device, after checking the endpoints (both: :func:`check_endpoints`; A alone — M2O — against
    the model and for finiteness)."""
    if sd_b is not None:
        return check_endpoints(model, sd_a, sd_b)
    check_compatible([model.state_dict(), sd_a], ["model", "A"])
    check_finite(sd_a, "A")
    devs = {v.device for v in sd_a.values()}
    return next(iter(devs)) if devs else torch.device("cpu")


def _mode_settings(mode: str, config: LLPFConfig) -> tuple[dict[str, Any], Any]:
    """The run's settings for ``mode`` (M2O: every non-norm layer at once, no variance correction; M2M: no
    angle-conformal lr; the cross-sphere fields only for cross-sphere) and the ``order`` taken out of them."""
    c = config.model_dump()
    if mode == "m2o":  # M2O moves every non-norm layer at once and never corrects variances
        c.update(order="all", unlock_every=None, variance_correction="none", variance_target="source",
                 closing_ticks=0)
    if mode == "m2m":
        c["angle_conformal"] = False
    if mode != "cross":
        for k in ("m2o_step", "m2o_max_ticks", "sphere_rtol"):
            c.pop(k)
    order = c.pop("order")
    return c, order


def _set_unlock_every(c: dict[str, Any], n_groups: int) -> None:
    """``c["unlock_every"]`` (its default where None); ConfigError when the ticks leave FDF groups locked."""
    if c["unlock_every"] is None:
        c["unlock_every"] = max(1, c["ticks"] // (3 * n_groups)) if c["order"] != "all" else 1
    if c["order"] != "all" and (n_groups - 1) * c["unlock_every"] >= c["ticks"]:
        raise ConfigError(
            f"ticks={c['ticks']} leaves FDF groups locked: {n_groups} groups unlocked every {c['unlock_every']} "
            f"tick(s) need ticks > {(n_groups - 1) * c['unlock_every']} (or merge groups with fdf_level=2, or "
            "order='all')")


def _ticks_for_groups(c: dict[str, Any], n_groups: int, cross: bool, rescale_step: bool) -> None:
    """A schedule scaled to the budget (:meth:`LLPFConfig.for_budget`) gets at least 3 ticks per FDF group where the
    budget pays them (every group then unlocks within the first third of the run), a derived ``step`` rescaled."""
    if c["order"] == "all" or c["ticks"] >= 3 * n_groups:
        return
    room = c["budget"] - (c["m2o_max_ticks"] if cross else 0)
    ticks = max(c["ticks"], min(3 * n_groups, room))
    if rescale_step:
        c["step"] = min(1.0, c["step"] * c["ticks"] / ticks)
    c["ticks"] = ticks


@torch.no_grad()
def _sgd_step(params: list[torch.Tensor], grads: tuple[torch.Tensor | None, ...], lrs: list[float]) -> None:
    """``p ← p − lr·g`` for every parameter with a gradient, one fused ``_foreach_add_`` per learning rate."""
    by_lr: dict[float, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for p, g, lr in zip(params, grads, lrs, strict=True):
        if g is not None:
            ps, gs = by_lr.setdefault(lr, ([], []))
            ps.append(p)
            gs.append(g)
    for lr, (ps, gs) in by_lr.items():
        torch._foreach_add_(ps, gs, alpha=-lr)


class _Run:
    """One LLPF run (M2M, M2O or cross-sphere); state checkpointed to ``out_dir``: setup (``__init__``: checks,
    settings, network, groups, endpoints, fingerprint) → resume (a checkpoint, or point 0) → one :meth:`_step`
    per tick → finish (the destination closes the path)."""

    def __init__(self, mode: str, model: nn.Module, sd_a: StateDict, sd_b: StateDict | None, train_data: Any,
                 config: LLPFConfig, loss_fn: LossFn | None, out_dir, resume: bool,
                 progress: Callable[[int, int], None] | None, data_info: Mapping[str, Any] | None = None,
                 scaled: set[str] | frozenset[str] = frozenset()) -> None:
        self.mode, self.scaled = mode, scaled  # the settings for_budget derived (not given)
        self.device = _endpoint_device(model, sd_a, sd_b)
        c, order = _mode_settings(mode, config)
        self.ds, c["batch_size"] = resolve_dataset(train_data, c["batch_size"])
        self._setup_net(model, sd_a)
        self._setup_groups(c, order)
        _check_budget(mode, c)
        self.cfg = c
        self.loss_fn = loss_fn or mean_cross_entropy
        self.progress = progress
        self._setup_endpoints(sd_a, sd_b)
        self.threshold_info = self._setup_threshold(c, sd_a, sd_b)
        self._setup_verify(c, sd_a, sd_b)
        self.gen = torch.Generator().manual_seed(int(c["seed"]))
        self.stream = BatchStream(self.ds, c["batch_size"], self.gen)
        self.out_dir = pathlib.Path(out_dir) if out_dir is not None else None
        self._setup_fingerprint(sd_a, sd_b, data_info)
        self.s: dict[str, Any] = self._initial_state(sd_a)  # the mutable state (checkpointed)
        self.pending: list[dict[str, torch.Tensor]] = []
        self.last_point: dict[str, torch.Tensor] | None = None
        self.resume = resume

    # ------------------------------------------------------------------ setup
    def _setup_net(self, model: nn.Module, sd_a: StateDict) -> None:
        """The working copy of the model at A, its coordinates and the per-layer bookkeeping of the moves and
        the angle-conformal lr."""
        self.net = copy.deepcopy(model).to(self.device)
        self.net.load_state_dict(sd_a)
        self.coords = param_names(self.net)
        self.owners = param_owners(self.net)
        norm = norm_param_keys(self.net)
        self.sphere_keys = weight_keys(self.net)
        mod_weight: dict[str, str] = {}
        for k in self.sphere_keys:
            mod_weight.setdefault(self.owners[k], k)
        self.lr_ref = {k: mod_weight.get(self.owners[k]) for k in self.coords}  # whose variance sets k's lr factor
        self.moved_m2o = [k for k in self.coords if k not in norm]
        self.moved_m2o_set = set(self.moved_m2o)

    def _setup_groups(self, c: dict[str, Any], order: Any) -> None:
        """M2M / cross-sphere: the unlock groups (recorded in ``c``), the corrected tensors and the unlock
        schedule; M2O: none."""
        if self.mode not in ("m2m", "cross"):
            self.groups, self.corrected, self.group_of = [], [], {}
            return
        c["order"], self.groups = resolve_groups(self.net, order, c["fdf_level"])
        self.corrected = corrected_keys(self.net, c["variance_correction"])
        if "ticks" in self.scaled:
            _ticks_for_groups(c, len(self.groups), cross=self.mode == "cross", rescale_step="step" in self.scaled)
        _set_unlock_every(c, len(self.groups))
        c["groups"] = self.groups
        self.group_of = {k: g for g, keys in enumerate(self.groups) for k in keys}

    def _setup_endpoints(self, sd_a: StateDict, sd_b: StateDict | None) -> None:
        """The destination (on the run's device), both endpoints on the CPU and their variances."""
        self.dest = {k: v.detach().to(self.device, copy=True) for k, v in sd_b.items()} if sd_b is not None else None
        self.src_cpu = cpu_clone(sd_a)
        self.dest_cpu = cpu_clone(sd_b) if sd_b is not None else None
        self.var0 = {k: tensor_variance(sd_a[k]) for k in self.sphere_keys}
        self.var_dest = ({k: tensor_variance(sd_b[k]) for k in set(self.sphere_keys) | set(self.corrected)}
                         if sd_b is not None else {})

    def _setup_threshold(self, c: dict[str, Any], sd_a: StateDict, sd_b: StateDict | None) -> dict[str, Any]:
        """``c["threshold"]`` resolved: a given one kept, else :func:`relative_threshold` of the endpoints' measured
        train losses (:meth:`_endpoint_losses`); the record of how (``info["threshold"]``)."""
        margin = c.pop("threshold_margin")
        if c["threshold"] is not None:
            return {"value": c["threshold"], "rule": "given"}
        losses = self._endpoint_losses([sd for sd in (sd_a, sd_b) if sd is not None], c)
        c["threshold"] = relative_threshold(losses, margin)
        return {"value": c["threshold"], "rule": "relative", "endpoint_losses": losses, "margin": margin,
                "batches": ENDPOINT_BATCHES}

    def _fixed_batches(self, c: Mapping[str, Any], n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first ``n`` minibatches of a generator of the run's own seed (the run's random stream untouched)."""
        stream = BatchStream(self.ds, c["batch_size"], torch.Generator().manual_seed(int(c["seed"])))
        return [stream.next(self.device)[:2] for _ in range(n)]

    def _setup_verify(self, c: Mapping[str, Any], sd_a: StateDict, sd_b: StateDict | None) -> None:
        """With ``verify_batches``: its fixed minibatches, a private network for the checks, the endpoints'
        evaluated losses and the verified target (recorded in ``threshold_info["verify"]``)."""
        self.verify_set: list[tuple[torch.Tensor, torch.Tensor]] = []
        if c["verify_batches"] == 0:
            return
        self.verify_set = self._fixed_batches(c, c["verify_batches"])
        self.verify_net = copy.deepcopy(self.net)
        losses = [self._evaluated_loss(sd) for sd in (sd_a, sd_b) if sd is not None]
        target = (c["threshold"] if self.threshold_info["rule"] == "given"
                  else relative_threshold(losses, self.threshold_info["margin"]))
        self.verify_target = target
        self.threshold_info["verify"] = {"batches": c["verify_batches"], "endpoint_losses": losses, "value": target}

    @torch.no_grad()
    def _evaluated_loss(self, sd: StateDict, project: bool = False) -> float:
        """The loss of ``sd`` in the evaluation's terms on the verification minibatches: BatchNorm statistics
        recomputed from them, then the eval-mode mean minibatch loss (module docstring, *verification*); with
        ``project``, of ``sd`` after the tick's closing projection (the point the tick would store)."""
        net = self.verify_net
        net.load_state_dict(sd)
        if project:
            self._project(dict(net.named_parameters()))
        reset_bn_stats(net, [x for x, _ in self.verify_set])
        net.eval()
        return sum(self.loss_fn(net(x), y).item() for x, y in self.verify_set) / len(self.verify_set)

    def _verified(self) -> float:
        """The current point's evaluated loss (:meth:`_evaluated_loss`), its forward passes counted."""
        self.s["verify_forwards"] = self.s.get("verify_forwards", 0) + 2 * len(self.verify_set)
        return self._evaluated_loss(self.net.state_dict(), project=True)

    @torch.no_grad()
    def _endpoint_losses(self, sds: list[StateDict], c: Mapping[str, Any]) -> list[float]:
        """Each endpoint's mean minibatch train loss (train mode, as the refinement measures the path) over the same
        :data:`ENDPOINT_BATCHES` minibatches of a generator of its own; on a copy of the network."""
        net = copy.deepcopy(self.net).train()
        batches = self._fixed_batches(c, ENDPOINT_BATCHES)
        devices = [self.device] if self.device.type == "cuda" else []
        losses = []
        for sd in sds:
            net.load_state_dict(sd)
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(int(c["seed"]))  # dropout
                losses.append(sum(self.loss_fn(net(x), y).item() for x, y in batches) / len(batches))
        return losses

    def _setup_fingerprint(self, sd_a: StateDict, sd_b: StateDict | None, data_info: Mapping[str, Any] | None) -> None:
        """The resume fingerprint (its parts: mode, settings, endpoints, training data) of a checkpointed run."""
        self.fingerprint_parts: dict[str, Any] = {}
        if self.out_dir is not None:  # only a checkpointed run needs it (the data digest reads every example)
            self.fingerprint_parts = {
                "mode": self.mode, "settings": json.loads(to_json(self.cfg, "LLPF settings", nan="null")),
                "A": tensors_sha256(sd_a), "B": tensors_sha256(sd_b), "data": data_fingerprint(self.ds, data_info),
            }
        self.fingerprint = hashlib.sha256(to_json(self.fingerprint_parts, "LLPF fingerprint", nan="null").encode()).hexdigest()

    def _initial_state(self, sd_a: StateDict) -> dict[str, Any]:
        """The mutable state of a fresh run (what a checkpoint stores as ``state``)."""
        return {
            "tick": 0, "phase": "m2o" if self.mode in ("m2o", "cross") else "m2m", "phase_start": 0,
            "remaining": [1.0] * len(self.groups),
            "var_start": {k: tensor_variance(sd_a[k]) for k in self.corrected},
            "records": [], "n_points": 0, "shards": [], "cum": [], "grad_evals": 0, "wall_time_s": 0.0,
            "finished": False, "stopped": False, "phase_boundary": None, "sphere_reached": None, "m2o_ticks": 0,
        }

    # ------------------------------------------------------------------ state helpers
    def _params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.net.named_parameters())

    def _record(self) -> None:
        p = cpu_clone(self.net.state_dict())
        self._append(p)

    def _append(self, p: dict[str, torch.Tensor]) -> None:
        d = distance(self.last_point, p, self.coords) if self.last_point is not None else 0.0
        self.s["cum"].append((self.s["cum"][-1] if self.s["cum"] else 0.0) + d)
        self.last_point = {k: p[k] for k in self.coords}
        self.pending.append(p)
        self.s["n_points"] += 1

    def _var_target(self, k: str) -> float:
        vs = self.s["var_start"][k]
        if self.cfg["variance_target"] == "source":
            return vs
        r = self.s["remaining"][self.group_of[k]]
        return self.var_dest[k] + r * (vs - self.var_dest[k])

    @torch.no_grad()
    def _project(self, params: Mapping[str, torch.Tensor] | None = None) -> None:
        """The variance correction of the corrected tensors of ``params`` (default: the run's network)."""
        params = self._params() if params is None else params
        for k in self.corrected:
            project_to_variance_(params[k], self._var_target(k))

    def _step_limits(self) -> tuple[int, int]:
        """``(most, least)`` refinement steps of the coming tick: ``max_steps`` / ``min_steps``, with a budget
        at most the tick's fair share ``⌊(budget − spent)/ticks left⌋`` (``least`` lowered to it)."""
        c = self.cfg
        most = c["max_steps"]
        if c["budget"] is not None:
            left = self._total() - c["closing_ticks"] - self.s["tick"]  # closing ticks do not refine
            most = min(most, (c["budget"] - self.s["grad_evals"]) // max(1, left))
        return most, min(c["min_steps"], most)

    def _refine(self, limits: tuple[int, int], lr_of: Mapping[str, float] | None = None) -> dict[str, Any]:
        """Plain SGD until the windowed loss ≤ threshold (≥ ``least``, ≤ ``most`` steps: ``limits``) and, with
        verification, the evaluated loss ≤ its target; the tick record's ``steps``, ``loss`` (the window's mean),
        ``reached`` (and ``verified_loss``)."""
        c = self.cfg
        most, least = limits
        if most == 0:
            return {"steps": 0, "loss": None, "reached": None}
        named = [(n, p) for n, p in self.net.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        lrs = [(lr_of or {}).get(n, c["lr"]) for n, _ in named]
        window: deque[float] = deque(maxlen=max(1, least))
        steps, reached, verified, next_check = 0, False, None, 0
        self.net.train()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(torch.randint(0, 2 ** 62, (), generator=self.gen)))  # dropout etc.
            while steps < most:
                x, y = self.stream.next(self.device)[:2]
                loss = self.loss_fn(self.net(x), y)
                value = loss.item()  # the one synchronisation of a step
                if not math.isfinite(value):
                    raise NonFiniteError(f"LLPF refinement loss became {value} at tick {self.s['tick']} "
                                         f"(step {steps}); lower lr")
                _sgd_step(params, torch.autograd.grad(loss, params, allow_unused=True), lrs)
                window.append(value)
                steps += 1
                if steps >= max(least, next_check) and sum(window) / len(window) <= c["threshold"]:
                    verified = self._verified() if self.verify_set else None
                    if verified is None or verified <= self.verify_target:
                        reached = True
                        break
                    next_check = steps + max(1, c["min_steps"])
        self.s["grad_evals"] += steps
        rec = {"steps": steps, "loss": sum(window) / len(window), "reached": reached}
        return rec if verified is None else {**rec, "verified_loss": verified}

    # ------------------------------------------------------------------ ticks
    def _tick_m2m(self, limits: tuple[int, int]) -> dict[str, Any]:
        c = self.cfg
        k = self.s["tick"] - self.s["phase_start"]
        if k >= c["ticks"]:
            return self._tick_closing(k - c["ticks"])
        n_unlocked = len(self.groups) if c["order"] == "all" else min(len(self.groups), k // c["unlock_every"] + 1)
        params = self._params()
        with torch.no_grad():
            for g in range(n_unlocked):
                for key in self.groups[g]:
                    params[key].lerp_(self.dest[key].to(params[key].dtype), c["step"])
                self.s["remaining"][g] *= 1.0 - c["step"]
        self._project()
        rec = self._refine(limits)
        self._project()
        return {"unlocked": n_unlocked, **rec}

    @torch.no_grad()
    def _tick_closing(self, j: int) -> dict[str, Any]:
        """Closing tick ``j`` (from 0): every parameter ``1/(n+1−j)`` of its remaining way to B, so the n closing
        points divide the straight segment from the schedule's last point to B into n+1 equal parts (module
        docstring, *closing*); no variance correction, no refinement."""
        params = self._params()
        frac = 1.0 / (self.cfg["closing_ticks"] + 1 - j)
        for key in self.coords:
            params[key].lerp_(self.dest[key].to(params[key].dtype), frac)
        return {"unlocked": len(self.groups), "steps": 0, "loss": None, "reached": None, "closing": True}

    def _tick_m2o(self, limits: tuple[int, int]) -> dict[str, Any]:
        c = self.cfg
        params = self._params()
        out: dict[str, Any] = {}
        with torch.no_grad():
            if self.mode == "m2o":
                for key in self.moved_m2o:
                    params[key].mul_(1.0 - c["step"])
            else:  # cross-sphere: scale each module toward B's sphere, at most m2o_step per tick
                s = c["m2o_step"]
                factor: dict[str, float] = {}
                for w in self.sphere_keys:
                    v = tensor_variance(params[w])
                    f = math.sqrt(self.var_dest[w] / v) if v > 0 else 1.0
                    factor.setdefault(self.owners[w], min(max(f, 1.0 - s), 1.0 + s))
                for key in self.moved_m2o:
                    f = factor.get(self.owners[key])
                    if f is not None:
                        params[key].mul_(f)
                out["on_sphere"] = all(
                    abs(tensor_variance(params[w]) / self.var_dest[w] - 1.0) <= c["sphere_rtol"]
                    for w in self.sphere_keys if self.var_dest[w] > 0
                )
        lr_of = None
        if c["angle_conformal"]:
            lr_of = {}
            for key in self.coords:
                ref = self.lr_ref.get(key)
                if ref is not None and key in self.moved_m2o_set and self.var0[ref] > 0:
                    lr_of[key] = c["lr"] * tensor_variance(params[ref]) / self.var0[ref]
        out.update(self._refine(limits, lr_of))
        return out

    # ------------------------------------------------------------------ persistence
    def _state_path(self) -> pathlib.Path:
        return self.out_dir / STATE_FILE

    def _flush(self) -> None:
        if self.out_dir is None or not self.pending:
            return
        start = self.s["n_points"] - len(self.pending)
        entry = write_shard(self.out_dir, start, self.pending)
        self.s["shards"] = [s for s in self.s["shards"] if s["start"] != start] + [entry]
        self.pending = []

    def _checkpoint(self) -> None:
        self._flush()
        tensors = {f"net/{k}": v for k, v in self.net.state_dict().items()}
        if self.last_point is not None:
            tensors.update({f"last/{k}": v for k, v in self.last_point.items()})
        tensors["rng/gen"] = self.gen.get_state()
        st = self.stream.state_dict()
        tensors["stream/perm"] = st["perm"]
        meta = {"llpf_state": to_json({
            "version": STATE_VERSION, "fingerprint": self.fingerprint, "fingerprint_parts": self.fingerprint_parts,
            "mode": self.mode, "tensors_sha256": tensors_sha256(tensors),
            "stream": {"pos": st["pos"], "epoch": st["epoch"]}, "state": self.s,
        }, "LLPF state", nan="null")}
        save_state_dict(self._state_path(), tensors, metadata=meta)

    def _try_resume(self) -> bool:
        """Load the checkpoint in ``out_dir``; True if one was loaded."""
        if self.out_dir is None:
            return False
        f = self._state_path()
        exists = f.is_file()
        if exists and not self.resume:
            raise CheckpointError(f"{self.out_dir}: already holds an LLPF run ({STATE_FILE}); pass resume=True "
                                  "to continue it, or choose another out_dir")
        if not exists:
            if (self.out_dir / MANIFEST).exists():
                raise CheckpointError(f"{self.out_dir}: already holds a saved path ({MANIFEST}); choose another out_dir")
            return False
        meta, tensors = self._read_state(f)
        self.s = meta["state"]
        self.net.load_state_dict({k[4:]: v.to(self.device) for k, v in tensors.items() if k.startswith("net/")})
        last = {k[5:]: v for k, v in tensors.items() if k.startswith("last/")}
        self.last_point = last or None
        self.gen.set_state(tensors["rng/gen"])
        self.stream.load_state_dict({"perm": tensors["stream/perm"], **meta["stream"]})
        self.pending = []
        return True

    def _read_state(self, f: pathlib.Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """The checkpoint's metadata and tensors, after checking (in this order) that it is readable, of this
        state version, intact (its tensors hash to the recorded sha256), made by the same run (fingerprint,
        differences named) and that every shard it records is present with its recorded sha256."""
        again = "start again (overwrite it, or use another out_dir)"
        try:
            with safe_open(str(f), framework="pt", device="cpu") as fh:
                meta = json.loads(fh.metadata()["llpf_state"])
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        except Exception as err:
            raise CheckpointError(f"{f}: unreadable LLPF checkpoint (truncated or corrupt?): {err}") from None
        if meta.get("version") != STATE_VERSION:
            raise CheckpointError(f"{f}: LLPF state version {meta.get('version')!r}, this modeconn reads version "
                                  f"{STATE_VERSION} (written by another version); {again}")
        if tensors_sha256(tensors) != meta.get("tensors_sha256"):
            raise CheckpointError(f"{f}: its tensors do not match the sha256 recorded in it (modified or corrupt); "
                                  f"the run cannot be resumed safely — {again}")
        if meta.get("fingerprint") != self.fingerprint:
            diffs = fingerprint_differences(meta.get("fingerprint_parts") or {}, self.fingerprint_parts)
            raise ConfigError(
                f"{f}: cannot resume — this LLPF checkpoint was made with different settings, endpoints or "
                f"training data: {'; '.join(diffs) or 'fingerprint differs'}. Resume with the same arguments and "
                f"data, or {again}")
        for entry in meta["state"]["shards"]:
            shard = self.out_dir / entry["file"]
            if not shard.is_file():
                raise CheckpointError(f"{shard}: shard of points {entry['start']}…{entry['start'] + entry['count'] - 1} "
                                      f"recorded in {STATE_FILE} is missing; {again}")
            if sha256_file(shard) != entry["sha256"]:
                raise CheckpointError(f"{shard}: sha256 differs from the one recorded in {STATE_FILE} (modified or "
                                      f"corrupt); the run cannot be resumed safely — {again}")
        return meta, tensors

    # ------------------------------------------------------------------ main loop
    def _total(self) -> int:
        m2m = self.cfg["ticks"] + self.cfg["closing_ticks"]
        if self.mode in ("m2m", "m2o"):
            return m2m
        if self.s["phase"] == "m2m":
            return self.s["phase_start"] + m2m
        return self.cfg["m2o_max_ticks"] + m2m

    def _done(self) -> bool:
        if self.s["stopped"]:
            return True
        if self.s["phase"] == "m2m":
            return self.s["tick"] - self.s["phase_start"] >= self.cfg["ticks"] + self.cfg["closing_ticks"]
        return self.mode == "m2o" and self.s["tick"] >= self.cfg["ticks"]

    def run(self) -> Path:
        """resume (or point 0) → one :meth:`_step` per tick until done → :meth:`_finish`; a finished
        checkpointed run is loaded."""
        resumed = self._resume()
        if resumed and self.s["finished"]:
            return Path.load(self.out_dir)
        self._t0, self._wall0 = time.perf_counter(), self.s["wall_time_s"]
        while not self._done():
            self._step()
        return self._finish()

    def _resume(self) -> bool:
        """The checkpoint in ``out_dir`` loaded (True), or point 0 — the input itself — appended (False)."""
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        resumed = self._try_resume()
        if not resumed:
            self._append(cpu_clone(self.src_cpu))  # point 0 is the input itself
        return resumed

    def _update_wall_time(self) -> None:
        self.s["wall_time_s"] = self._wall0 + time.perf_counter() - self._t0

    def _step(self) -> None:
        """One tick: the phase's move / refinement and its record, the point, a phase switch (cross-sphere),
        then the wall time, a checkpoint and the progress report."""
        c = self.cfg
        phase = self.s["phase"]
        rec = self._tick(phase)
        self.s["records"].append(rec)
        self.s["tick"] += 1
        switch = self._count_m2o_tick(phase, rec)
        if rec["reached"] is False and c["stop_on_unreached"]:
            self.s["stopped"] = True
        last_tick = self._done() or switch
        if self.s["tick"] % c["record_every"] == 0 or last_tick:
            self._record()
        if switch:
            self._switch_to_m2m(rec)
        self._update_wall_time()
        if self.out_dir is not None and self.s["tick"] % c["checkpoint_every"] == 0 and not self._done():
            self._checkpoint()
        if self.progress is not None:
            self.progress(self.s["tick"], self._total())

    def _tick(self, phase: str) -> dict[str, Any]:
        """The current tick of ``phase`` (within the budget's fair share), its record."""
        limits = self._step_limits()
        rec = self._tick_m2m(limits) if phase == "m2m" else self._tick_m2o(limits)
        rec = {"tick": self.s["tick"], "phase": phase, **rec}
        if self.cfg["budget"] is not None and limits[0] < self.cfg["max_steps"] and not rec.get("closing"):
            rec["steps_cap"] = limits[0]
        return rec

    def _count_m2o_tick(self, phase: str, rec: Mapping[str, Any]) -> bool:
        """Cross-sphere M2O phase: count the tick; whether the run switches to M2M now (B's sphere reached or
        ``m2o_max_ticks`` spent)."""
        if not (phase == "m2o" and self.mode == "cross"):
            return False
        self.s["m2o_ticks"] += 1
        return rec.get("on_sphere") or self.s["m2o_ticks"] >= self.cfg["m2o_max_ticks"]

    def _switch_to_m2m(self, rec: Mapping[str, Any]) -> None:
        """Cross-sphere: the M2M phase starts at the current point (its variance targets start from there)."""
        self.s["sphere_reached"] = bool(rec.get("on_sphere"))
        self.s["phase_boundary"] = self.s["n_points"] - 1
        self.s["phase"], self.s["phase_start"] = "m2m", self.s["tick"]
        params = self._params()
        self.s["var_start"] = {k: tensor_variance(params[k]) for k in self.corrected}
        self.s["remaining"] = [1.0] * len(self.groups)

    def _finish(self) -> Path:
        """The destination closes an M2M / cross-sphere path (unless stopped); the run is marked finished."""
        if self.mode != "m2o" and not self.s["stopped"]:
            self.s["final_gap"] = (distance(self.last_point, self.dest_cpu, self.coords)
                                   / max(distance(self.src_cpu, self.dest_cpu, self.coords), 1e-30))
            self._append(cpu_clone(self.dest_cpu))
        self.s["finished"] = True
        self._update_wall_time()
        return self._build_path()

    def _build_path(self) -> Path:
        cum = self.s["cum"]
        t = [x / cum[-1] for x in cum] if cum and cum[-1] > 0 else None
        if t is not None:
            t[-1] = 1.0
        recs = self.s["records"]
        unreached = [r["tick"] for r in recs if r["reached"] is False]
        info = {
            "mode": self.mode,
            "settings": {k: v for k, v in self.cfg.items() if k != "groups"},
            "groups": self.groups,
            "corrected": self.corrected,
            "ticks_done": self.s["tick"],
            "reached_b": None if self.mode == "m2o" else not self.s["stopped"],
            "stop_reason": "unreached" if self.s["stopped"] else None,
            "budget": self.cfg["budget"],
            "unreached_ticks": unreached,
            "threshold_reached_all": not unreached,
            "threshold": self.threshold_info,
            "final_gap": self.s.get("final_gap"),
            "phase_boundary": self.s["phase_boundary"],
            "sphere_reached": self.s["sphere_reached"],
            "m2o_ticks": self.s["m2o_ticks"] if self.mode == "cross" else None,
            "records": recs,
        }
        compute = {"grad_evals": self.s["grad_evals"], "wall_time_s": self.s["wall_time_s"]}
        if self.verify_set:
            info["verify_forwards"] = self.s.get("verify_forwards", 0)
        method = {"m2m": "llpf-m2m", "m2o": "llpf-m2o", "cross": "llpf-cross-sphere"}[self.mode]
        if self.out_dir is None:
            return Path(self.pending, t, method=method, info=info, compute=compute)
        self._flush()
        path = Path._from_shards(self.out_dir, self.s["shards"], model_keys(self.net),
                                 {k: str(v.dtype).replace("torch.", "") for k, v in self.net.state_dict().items()},
                                 t, method, info, compute)
        path.save(self.out_dir)  # writes path.json (the shards are in place)
        self._checkpoint()       # marks the run finished
        return path


# ------------------------------------------------------------------------------------------ public API

_COMMON_DOC = """
    Args:
        model: an instance of the architecture (copied, never mutated; traced for ``order="fdf"``).
        train_data: a Dataset (TensorDataset preferred) or a DataLoader (its dataset/batch size; batches are
            drawn with the run's seeded generator).
        config: an :class:`LLPFConfig`, a mapping of its fields, or None (defaults); ``**options`` override
            single fields (``step=0.05, ticks=200``).
        loss_fn: ``loss_fn(logits, y)`` → mean loss (default cross-entropy).
        out_dir: checkpoint/output directory (points as safetensors shards, ``path.json`` at the end); the
            returned path is then disk-backed. None: everything in memory.
        resume: continue the run checkpointed in ``out_dir`` (same settings, endpoints and training data required
            — checked by a fingerprint, ConfigError naming what differs; ``loss_fn`` is not part of it, pass the
            same one); every recorded sha256 (state tensors, shards) is verified first, CheckpointError naming a
            modified file. A finished run is simply loaded. Without it an existing run in ``out_dir`` raises
            CheckpointError.
        progress: ``progress(tick, total_ticks)`` after each tick.
        data_info: what the training data is (e.g. ``{"name": "mnist", "split": "train", "limit": 2000}``),
            recorded in the resume fingerprint next to the data's example count and sha256.

    Raises: ConfigError (unknown option or bad value, named), StateDictMismatchError (endpoints of different
        architectures), DeviceMismatchError, NonFiniteError (inputs or refinement loss), CheckpointError,
        TraceError (FDF on an untraceable model).
"""


def _run(mode: str, model: nn.Module, sd_a: StateDict, sd_b: StateDict | None, train_data: Any,
         config: LLPFConfig | Mapping[str, Any] | None, loss_fn: LossFn | None, out_dir: Any, resume: bool,
         progress: Callable[[int, int], None] | None, data_info: Mapping[str, Any] | None,
         options: dict[str, Any]) -> Path:
    cfg = LLPFConfig.from_any(config, **options)  # typos fail here, before any work
    scaled = {"ticks", "step"} - cfg.model_fields_set if cfg.budget is not None and mode != "m2o" else set()
    cfg = cfg.for_budget(cross=mode == "cross")
    return _Run(mode, model, sd_a, sd_b, train_data, cfg, loss_fn, out_dir, resume, progress, data_info,
                scaled=scaled).run()


def llpf_m2m(model: nn.Module, sd_a: StateDict, sd_b: StateDict, train_data: Any,
             config: LLPFConfig | Mapping[str, Any] | None = None, *, loss_fn: LossFn | None = None,
             out_dir: str | pathlib.Path | None = None, resume: bool = False,
             progress: Callable[[int, int], None] | None = None, data_info: Mapping[str, Any] | None = None,
             **options: Any) -> Path:
    """LLPF model-to-model: a low-loss path from ``sd_a`` to ``sd_b`` by ticks of move → variance correction
    → refine → projection (module docstring; docs/methods.md §2). Settings: :class:`LLPFConfig`.

    ``sd_a``, ``sd_b``: source and destination state dicts (never mutated; one device — the run's device).

    Returns: a :class:`Path` (method ``"llpf-m2m"``): point 0 is sd_a, the last point sd_b (exactly), ``t`` the
        normalised arc length; ``info`` has the settings, FDF groups, per-tick records (steps, loss, reached,
        unlocked groups), ``unreached_ticks``, ``final_gap``, ``reached_b`` (False when stopped before B),
        ``stop_reason``, ``budget``; ``compute`` grad_evals and wall time.
    """
    return _run("m2m", model, sd_a, sd_b, train_data, config, loss_fn, out_dir, resume, progress, data_info,
                options)


def llpf_m2o(model: nn.Module, sd_a: StateDict, train_data: Any,
             config: LLPFConfig | Mapping[str, Any] | None = None, *, loss_fn: LossFn | None = None,
             out_dir: str | pathlib.Path | None = None, resume: bool = False,
             progress: Callable[[int, int], None] | None = None, data_info: Mapping[str, Any] | None = None,
             **options: Any) -> Path:
    """LLPF model-to-origin: every parameter of non-normalization modules shrinks by ``(1 − step)`` per tick,
    no variance correction, refinement with the angle-conformal per-layer lr ``lr·var(w)/var₀(w)``
    (``angle_conformal=False``: plain ``lr``, the ablation). Normalization layers are not moved.

    Returns: a :class:`Path` (method ``"llpf-m2o"``): point 0 is sd_a, the last point the last tick (the origin
        itself is not a point).
    """
    return _run("m2o", model, sd_a, None, train_data, config, loss_fn, out_dir, resume, progress, data_info,
                options)


def llpf_cross_sphere(model: nn.Module, sd_a: StateDict, sd_b: StateDict, train_data: Any,
                      config: LLPFConfig | Mapping[str, Any] | None = None, *, loss_fn: LossFn | None = None,
                      out_dir: str | pathlib.Path | None = None, resume: bool = False,
                      progress: Callable[[int, int], None] | None = None,
                      data_info: Mapping[str, Any] | None = None, **options: Any) -> Path:
    """LLPF across variance spheres (modes trained with different weight decay): M2O-like ticks scale each
    module of A toward B's per-layer variance (at most ``m2o_step`` per tick, angle-conformal refinement) until
    every ≥2-d weight's variance is within ``sphere_rtol`` of B's (or ``m2o_max_ticks``), then M2M (``ticks``
    more ticks) to B. One path; ``info["phase_boundary"]`` is the index of the switch point,
    ``info["sphere_reached"]`` whether the sphere was reached.
    """
    return _run("cross", model, sd_a, sd_b, train_data, config, loss_fn, out_dir, resume, progress, data_info,
                options)


for _f in (llpf_m2m, llpf_m2o, llpf_cross_sphere):
    _f.__doc__ = _f.__doc__.rstrip() + "\n" + _COMMON_DOC
del _f
