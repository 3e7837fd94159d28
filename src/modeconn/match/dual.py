"""Dual learned matching (LMC-DM, docs/methods.md §3) and one-sided learned matching (Theus et al. 2025).

Both endpoints get a group element, ``π_A = g_A`` and ``π_B = g_B``, and the continuous parts of both are
learned by minimising the expected loss along the linear path between the transformed endpoints,

    θ(λ) = (1 − λ)·π_A(θ_A) + λ·π_B(θ_B),        min over the transforms of  E_λ L(θ(λ)),

with the models' weights frozen and one λ drawn per step (``lambda_schedule``). λ is the weight of B, as in
:func:`modeconn.evaluate_path` (METHODS §3 writes ``λ·π_A(θ_A) + (1−λ)·π_B(θ_B)``; the same path with λ ↔ 1−λ,
and every schedule here is symmetric about ``lambda_value``). *One-sided* matching (Theus et al. 2025, the
baseline) keeps ``π_A`` the identity and learns ``π_B`` only.

Which side carries what (the gauge decision):

* **Discrete parts** (``permutation`` spaces: residual/FFN/head permutations) come from weight matching of
  (θ_A, θ_B) and are held fixed; they act on **B only** (``g_A`` is the identity there). A permutation applied
  to both endpoints is a gauge freedom (it changes nothing along the path), so this fixes it.
* **Continuous parts** (``orthogonal``, ``invertible``, ``scaling``, ``head_*`` spaces) are learned on both sides
  (dual) or on B only (one-sided). ``init="weight"`` starts B at weight matching's continuous solution and A at
  the identity; ``init="identity"`` starts both at the identity (B keeps WM's permutations).
* The continuous gauge ``(g_A, g_B) → (h∘g_A, h∘g_B)`` is **not** fixed. Every group here acts linearly on the
  parameters, so ``θ(λ) = g_A·((1−λ)θ_A + λ·(g_A^{-1}∘g_B)·θ_B)`` and ``L(θ(λ))`` equals the loss of the one-sided
  path with the *relative* element ``g_A^{-1}∘g_B`` on B: dual and one-sided matching have the same optimal
  value, and differ only in how the optimisation moves (two trivialised charts, one per endpoint — the
  "better conditioned optimisation" the paper argues for). Fixing the gauge (``g_A = I``) would turn the
  method into the one-sided one, so it is left free; the result reports both elements and the relative one.

The returned :class:`DualAlignment` is an :class:`~modeconn.match.result.Alignment` whose ``element`` is the
relative element ``g_A^{-1}∘g_B`` (apply it to B, keep A as is: the path has the same losses up to fp32
rounding, so ``evaluate_path(model, sd_a, res.apply(sd_b), ...)`` measures the dual path), plus ``element_a`` /
``element_b`` with :meth:`~DualAlignment.apply_a` / :meth:`~DualAlignment.apply_b` for the literal dual path and
:meth:`~DualAlignment.export_transforms` (plain ``{space: tensor}`` state dicts, safetensors-compatible).

Implementation: the transforms are :mod:`modeconn.match.parametrize` modules (Cayley by default); the
forward pass is ``torch.func.functional_call`` on a private fp32 eval-mode copy of ``model`` with ``θ(λ)`` built
from the transformed endpoints by the spec's own (differentiable) ``apply_tensor`` — discrete parts applied
once up front, only the continuous bindings per step. Adam on the transform parameters only.

Multi-process (data-parallel) matching, :mod:`modeconn.match.distributed` underneath. Launch with
``torchrun --nproc_per_node N script.py`` and call :func:`init_distributed` first (gloo on the CPU, NCCL with
``cuda:LOCAL_RANK`` where CUDA is available); :func:`dual_matching` then runs data-parallel whenever a default
process group exists (``distributed=None``; ``False`` forces one process, ``process_group=`` picks another group).

* **Same inputs on every rank.** Every rank passes the same endpoints, options and loader (same batches in the
  same order: a seeded shuffle); it iterates the *global* batches and keeps its contiguous block of rows,
  ``torch.tensor_split(x, world)[rank]`` (the first ``N mod world`` blocks have one row more).
* **The gradient of the global batch.** Rank r back-propagates ``(n_r / N)·L_r`` (``L_r``: the mean loss over
  its ``n_r`` of the batch's ``N`` rows); the flattened gradient of the transform parameters is summed over ranks
  (one all-reduce) before each Adam step, so every rank takes the step of ``Σ_r (n_r/N)·L_r`` = the full-batch
  mean whenever ``loss_fn`` is a mean over rows (or over the same number of tokens per row, as for the default
  per-token cross-entropy of equal-length blocks; a loss that ignores some labels is weighted by rows, not by
  counted tokens). A rank whose block is empty (a short last batch) contributes zeros.
* **Same λ, same steps.** The λ generator is seeded alike on every rank. One all-gather per step sums the
  reported loss (the global mean: ``history`` and ``progress`` see it on every rank) and checks that every rank
  got the same number of rows, the same batch checksum and the same λ (DistributedError naming the step).
* **Result.** Agrees with one process on the same data up to fp32 reduction order: on the tiny GPT-NeoX test
  problem, after 10 steps with batches of 8, 8 and 5 rows on 2 processes, max |Δelement| = 2e-6 (tested at
  ≤ 1e-4) and |Δloss| ≤ 3e-7 per step. The elements are identical on all ranks (a digest is compared at the
  start and at the end: DistributedError otherwise); a resumed run gives the same bytes as an uninterrupted
  one with the same world size.
* **Files.** Only rank 0 writes the checkpoint; the others wait on a barrier until it is in place, and every
  rank reads it to resume (``checkpoint_dir`` must be visible to all ranks: any local path on one node).
* **Sharded** (``shard=True``, :mod:`modeconn.match.sharded`): the same steps with ZeRO-3 storage — each rank holds
  its blocks of both endpoints (``Shard(dim)`` along a free axis where a tensor has one, else along an attention head
  axis where the blocks hold whole heads, else rows; read per rank from safetensors), 1/W of the transforms and Adam
  state (FSDP2) and the per-head elements of its heads; every module's tensors are materialised inside its
  checkpointed forward — block-local ones transformed and interpolated per block and θ all-gathered, the others
  all-gathered, then transformed. Per-rank memory: :mod:`modeconn.match.memory`.
* **Errors** (every rank raises the same): ConfigError before any work for ``distributed=True`` /
  ``process_group=`` without an initialised group, ``distributed=False`` with ``process_group``, a process
  outside ``process_group``, a world size larger than the first batch's rows, or a backend that cannot
  communicate the endpoints' device type (NCCL with CPU tensors; gloo with CUDA tensors is staged through host
  memory).
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import field_validator
from torch import nn
from torch.func import functional_call

from .._util.batches import endless
from ..checks import check_compatible, check_finite, check_one_device
from ..errors import ConfigError, DistributedError, NonFiniteError, SpecError
from ..symmetry import Element, SymmetrySpec
from .distributed import DistributedInfo, Ranks, current_rank, init_distributed, launched_world_size
from .dual_checkpoint import CHECKPOINT_FILE, _fingerprint, _load_checkpoint, _save_checkpoint
from .dual_plan import _ContinuousPlan
from .options import LAMBDA_SCHEDULES, Bool, Int, LambdaSchedule, PositiveInt, PositiveReal, draw_lambda
from .parametrize import get_parameterization, make_transform
from .progress import reporter, step_loss_legacy
from .sharded import (LazyLeaves, RowReader, ShardedEndpoints, check_finite_shards, detached_element, device_mesh,
                      element_gradient, gather_blocks, meta_work_model, row_block, shard_transforms, unsharded_element)
from .result import Alignment
from .weight import weight_matching

StateDict = Mapping[str, torch.Tensor]
LossFn = Callable[[Any, torch.Tensor], torch.Tensor]
INITS = ("weight", "identity")
#: function-preservation check on the final elements: max|Δoutput| ≤ FUNCTION_RTOL · max(1, max|output|)
FUNCTION_RTOL = 1e-3
__all__ = ["LAMBDA_SCHEDULES", "DistributedInfo", "DualAlignment", "DualMatchingConfig", "current_rank", "default_loss", "dual_matching",
           "element_from_state_dict", "init_distributed", "launched_world_size", "one_sided_matching"]


@dataclass
class DualAlignment(Alignment):
    """Result of :func:`dual_matching` / :func:`one_sided_matching`.

    ``element_a``, ``element_b``: full group elements (every space) for A and B; the dual path is
    ``(1−λ)·apply_a(θ_A) + λ·apply_b(θ_B)``. ``element`` (inherited): the relative element ``g_A^{-1}∘g_B``
    for B alone (equal to ``element_b`` for one-sided matching); see the module docstring. ``objective``: mean
    training loss over the last 10% of steps (nats); ``history[0]``: the loss per step; ``stats``: steps,
    seconds, the options, ``lambdas`` (λ per step), ``wm_objective``, ``continuous_spaces``,
    ``max_output_change_a/_b`` (function-preservation check), ``resumed_from``.
    """

    element_a: dict[str, torch.Tensor] = field(default_factory=dict)
    element_b: dict[str, torch.Tensor] = field(default_factory=dict)

    def apply_a(self, state_dict: StateDict) -> dict[str, torch.Tensor]:
        """``π_A(θ) = element_a · θ`` (a new dict; the input is not mutated)."""
        return self.spec.apply(state_dict, self.element_a)

    def apply_b(self, state_dict: StateDict) -> dict[str, torch.Tensor]:
        """``π_B(θ) = element_b · θ`` (a new dict; the input is not mutated)."""
        return self.spec.apply(state_dict, self.element_b)

    def export_transforms(self) -> dict[str, dict[str, torch.Tensor]]:
        """``{"a": {space: tensor}, "b": {space: tensor}}``: the learned elements as plain state dicts (contiguous
        CPU tensors, int64 permutations and fp32/fp64 continuous elements) that ``safetensors.torch.save_file``
        accepts; load them back with :func:`element_from_state_dict`."""
        return {side: {s: t.detach().cpu().contiguous().clone() for s, t in el.items()}
                for side, el in (("a", self.element_a), ("b", self.element_b))}

    def to_json(self) -> dict:
        out = super().to_json()
        out["element_a"] = {k: v.tolist() for k, v in self.element_a.items()}
        out["element_b"] = {k: v.tolist() for k, v in self.element_b.items()}
        return out


def element_from_state_dict(spec: SymmetrySpec, state_dict: StateDict) -> Element:
    """A group element from an exported ``{space: tensor}`` dict (e.g. a safetensors file written from
    :meth:`DualAlignment.export_transforms`); SpecError unless it is a valid element of ``spec``."""
    g = {k: v for k, v in state_dict.items()}
    spec.check_element(g)
    return g


class DualMatchingConfig(LambdaSchedule):
    """Options of :func:`dual_matching` / :func:`one_sided_matching` (unknown fields and bad values: ConfigError
    naming the field, before any work).

    Attributes:
        steps: Adam steps, one batch each (≥ 1); ``lr``: Adam learning rate on the transform parameters (> 0).
        lambda_schedule, lambda_value, lambda_width: λ per step (:mod:`modeconn.match.options`), drawn from a
            generator seeded with ``seed``.
        init: ``"weight"`` (B's continuous parts start at weight matching's solution) or ``"identity"``.
        parameterization: ``"cayley"`` (default), ``"matrix_exp"`` or ``"unconstrained"``
            (:mod:`modeconn.match.parametrize`).
        one_sided: learn B's transform only (``π_A`` = identity).
        seed: seeds weight matching and the λ draws (same seed and data → same bytes).
        checkpoint_every: steps between checkpoints when a ``checkpoint_dir`` is given (≥ 1).
        verify: check at the end that the learned elements preserve both endpoints' functions.
    """

    steps: PositiveInt = 200
    lr: PositiveReal = 1e-2
    init: Literal["weight", "identity"] = "weight"
    parameterization: str = "cayley"
    one_sided: Bool = False
    seed: Int = 0
    checkpoint_every: PositiveInt = 50
    verify: Bool = True

    @field_validator("parameterization", mode="before")
    @classmethod
    def _known_parameterization(cls, v: Any) -> str:
        return get_parameterization(v).name  # ConfigError naming the choices


def one_sided_matching(spec: SymmetrySpec, model: nn.Module, sd_a: StateDict, sd_b: StateDict, loader: Iterable,
                       config: DualMatchingConfig | Mapping[str, Any] | None = None, **options) -> DualAlignment:
    """One-sided learned matching (Theus et al. 2025): :func:`dual_matching` with ``one_sided=True`` (``π_A`` the
    identity, B's continuous transforms learned). Same options, result and errors."""
    if "one_sided" in options:
        raise ConfigError("one_sided_matching does not take one_sided= (it is always one-sided)")
    return dual_matching(spec, model, sd_a, sd_b, loader, config, one_sided=True, **options)


def dual_matching(
    spec: SymmetrySpec,
    model: nn.Module,
    sd_a: StateDict,
    sd_b: StateDict,
    loader: Iterable,
    config: DualMatchingConfig | Mapping[str, Any] | None = None,
    *,
    loss_fn: LossFn | None = None,
    progress: Callable[..., None] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    weight_alignment: Alignment | Element | None = None,
    distributed: bool | None = None,
    process_group: Any = None,
    shard: bool = False,
    **options: Any,
) -> DualAlignment:
    """Learn continuous symmetry transforms of both endpoints (or of B only) that lower the loss along the path.

    Minimises ``E_λ L((1−λ)·π_A(θ_A) + λ·π_B(θ_B))`` over the continuous transforms (docs/methods.md §3; the module
    docstring gives the equations and the gauge decision) with Adam, ``steps`` steps of one batch each.

    Args:
        spec: the symmetry spec with continuous spaces (e.g. ``hf_symmetry_spec(absorb_normalization(m),
            groups={"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible",
            "vo": "head_invertible"})``).
        model: an instance of the architecture (only a private fp32 eval-mode copy is used: no dropout, frozen).
        sd_a, sd_b: endpoint state dicts (same keys/shapes, one device; any float dtype, computed in fp32;
            never mutated).
        loader: re-iterable batches ``(x, y, ...)``; re-iterated epoch after epoch (:func:`modeconn._util.batches.
            endless`). ``model(x)`` may return a tensor or an object with ``.logits``; sequence outputs ``(B, T, V)``
            with labels ``(B, T)`` are scored per token.
        config, options: a :class:`DualMatchingConfig` (or a dict of its fields) and keyword overrides: ``steps``,
            ``lr``, ``lambda_schedule``, ``lambda_value``, ``lambda_width``, ``init``, ``parameterization``,
            ``one_sided``, ``seed``, ``checkpoint_every``, ``verify`` (``verify``: check at the end, on the first
            batch, that ``π_A(θ_A)`` and ``π_B(θ_B)`` compute the outputs of θ_A and θ_B, ``max|Δ| ≤
            1e-3·max(1, max|output|)``; results in ``stats["max_output_change_a/_b"]``).
        loss_fn: ``loss_fn(output, y)`` → mean loss (default: cross-entropy on ``output.logits`` or ``output``).
        progress: ``progress(stage, done, total, loss=…, lam=…)`` after each step (:mod:`modeconn.match.progress`;
            on every rank, with the global loss). A callback without ``**metrics`` is called the deprecated way,
            ``progress(step, steps, loss)``.
        checkpoint_dir: a directory for ``dual_matching.pt`` (transform parameters, Adam state, λ generator,
            losses), written atomically (by rank 0 only) every ``checkpoint_every`` steps and at the end. A call
            with the same options and endpoints finds it and resumes (``steps`` may be raised); the result is the
            same bytes as an uninterrupted run (with as many processes) when the loader yields the same batches in
            the same order when re-iterated.
        weight_alignment: a precomputed weight-matching :class:`Alignment` (or element) of (θ_A, θ_B) to take the
            discrete parts and the ``init="weight"`` start from; default: ``weight_matching(spec, sd_a, sd_b,
            seed=seed)``.
        distributed: data parallelism over a ``torch.distributed`` process group (module docstring): ``None``
            (default) when a default group is initialised, ``True`` to require one, ``False`` for one process.
        process_group: the group to use instead of the default one (implies ``distributed``).
        shard: ZeRO-3 / FSDP storage (:mod:`modeconn.match.sharded`): each rank holds ``1/W`` of each endpoint's
            rows and of the transforms' parameters and Adam state; ``sd_a`` / ``sd_b`` may then also be checkpoint
            directories (safetensors, read per rank with ``get_slice``; absorbed checkpoints for the full group) and
            ``model`` a meta-device model (e.g. ``AbsorbedView(path).model``). The same steps as the data-parallel
            mode (the result agrees up to fp32 reduction order); one process: the same code without communication.
            Not with ``checkpoint_dir``; every batch needs at least one row per rank (DistributedError otherwise).
            ``verify`` then checks the continuous parts (A against A, B with its discrete part against itself).
    Returns: :class:`DualAlignment` (``objective_sense="minimize"``; the same on every rank; ``stats["world_size"]``:
        the number of processes).
    Raises (all before any heavy work unless noted): ConfigError naming a bad option (steps, lr, lambda_schedule,
        lambda_value, lambda_width, init, parameterization, checkpoint_every, a spec without continuous spaces,
        an empty loader, a checkpoint from other options/endpoints); StateDictMismatchError; DeviceMismatchError;
        NonFiniteError (also during training: a non-finite loss, naming the step and λ); SpecError (a bad
        ``weight_alignment``; after training: a learned element that is not a valid group element or does not
        preserve the function); CheckpointError (an unreadable checkpoint). Multi-process: ConfigError before any
        work for the ``distributed`` / ``process_group`` misuses of the module docstring, a world size above the
        first batch's rows or a backend that cannot serve the endpoints' device; DistributedError when ranks got
        different batches or λ (naming the step) or end with different elements.
    """
    cfg = DualMatchingConfig.from_any(config, **options)  # typos and bad values fail here, before any work
    run = _Run(spec, model, sd_a, sd_b, loader, cfg, loss_fn=loss_fn, progress=progress,
               checkpoint_dir=checkpoint_dir, weight_alignment=weight_alignment, distributed=distributed,
               process_group=process_group, shard=shard)
    return run.run()


class _Run:
    """One dual (or one-sided) matching call: setup (checks) → resume (checkpoint, batch stream) → prepare (discrete
    parts, transforms, endpoints) → one :meth:`step` per Adam step (checkpointed) → finish (elements, checks)."""

    def __init__(self, spec: SymmetrySpec, model: nn.Module, sd_a: StateDict, sd_b: StateDict, loader: Iterable,
                 cfg: DualMatchingConfig, *, loss_fn: LossFn | None, progress: Callable[..., None] | None,
                 checkpoint_dir: str | os.PathLike | None, weight_alignment: Alignment | Element | None,
                 distributed: bool | None, process_group: Any, shard: bool = False) -> None:
        self.start_time = time.perf_counter()
        self.spec, self.model, self.sd_a, self.sd_b, self.loader, self.cfg = spec, model, sd_a, sd_b, loader, cfg
        self.par = get_parameterization(cfg.parameterization)
        self.opts = {"lr": float(cfg.lr), "lambda_schedule": cfg.lambda_schedule, "lambda_value": cfg.lambda_value,
                     "lambda_width": cfg.lambda_width, "init": cfg.init, "parameterization": self.par,
                     "one_sided": cfg.one_sided, "seed": cfg.seed}  # the checkpoint fingerprint's options
        self.continuous = [s for s in spec.spaces if not spec.group_of(s).exact]
        if not self.continuous:
            raise ConfigError(
                "spec has no continuous space (orthogonal, invertible, scaling, head_*): nothing for dual matching to "
                "learn; use weight_matching or learned_matching for permutation-only specs"
            )
        self.shard = bool(shard)
        if self.shard:
            self.readers = (RowReader(sd_a), RowReader(sd_b))
            self.sd_a, self.sd_b = sd_a, sd_b = self.readers[0].mapping, self.readers[1].mapping
            meta_a, meta_b = (r.meta for r in self.readers)
            if checkpoint_dir is not None:
                raise ConfigError("shard=True does not take checkpoint_dir (sharded runs are not checkpointed)")
        else:
            meta_a, meta_b = sd_a, sd_b
        spec.check_state_dict(meta_a, "state dict A")
        spec.check_state_dict(meta_b, "state dict B")
        check_compatible([model.state_dict(), meta_a, meta_b], ["model", "A", "B"])
        self.device = _shard_device(meta_a) if self.shard else check_one_device([sd_a, sd_b], ["A", "B"])
        self.ranks = Ranks.resolve(distributed, process_group, self.device)
        self.mesh = device_mesh(self.ranks, self.device) if self.shard else None
        if not self.shard:  # sharded: each rank checks its shards as it reads them
            check_finite(sd_a, "A")
            check_finite(sd_b, "B")
        self.weight_alignment = weight_alignment
        self.wm_element = _wm_element(spec, weight_alignment)
        self.loss_fn = loss_fn or default_loss
        self.stage = "one-sided matching" if cfg.one_sided else "dual matching"
        self.progress = reporter(progress, step_loss_legacy, what=self.stage)
        self.ckpt_path = Path(checkpoint_dir) / CHECKPOINT_FILE if checkpoint_dir is not None else None
        self.fingerprint = _fingerprint(spec, sd_a, sd_b, self.opts) if self.ckpt_path is not None else None

    # ------------------------------------------------------------------ setup
    def resume(self) -> None:
        """The checkpoint to resume from (if any), the batch stream from the resume step and its first batch."""
        path, steps = self.ckpt_path, self.cfg.steps
        self.saved = _load_checkpoint(path, self.fingerprint, steps) if path is not None and path.exists() else None
        self.start_step = self.saved["step"] if self.saved is not None else 0
        self.stream = endless(self.loader, skip=self.start_step, what="dual matching")
        self.batch = next(self.stream) if self.start_step < steps else None  # ConfigError for an empty loader, before WM
        if self.batch is not None:
            _check_rows(self.batch, self.ranks)

    def _discrete(self) -> None:
        """The discrete parts (B only; weight matching unless given or resumed) and the ``init="weight"`` start."""
        spec, device, saved = self.spec, self.device, self.saved
        self.wm_objective = float("nan")
        if isinstance(self.weight_alignment, Alignment):
            self.wm_objective = float(self.weight_alignment.objective)
        if saved is not None:
            self.disc = {s: t.to(device) for s, t in saved["discrete"].items()}
            self.wm_objective = saved["wm_objective"]
        else:
            if self.wm_element is None:
                wm = weight_matching(spec, self.sd_a, self.sd_b, seed=self.cfg.seed)
                self.wm_element, self.wm_objective = wm.element, wm.objective
            self.disc = {s: self.wm_element[s].to(device) for s in spec.spaces if s not in self.continuous}
        # the continuous spaces' identity is rebuilt where needed (not held through the steps: elements-sized)
        self.identity = {s: t.to(device) for s, t in spec.identity().items() if s not in self.continuous}

    def _transforms(self) -> None:
        """The transform modules of B (and A), Adam, the λ generator; their saved state when resuming."""
        spec, device, saved, cfg = self.spec, self.device, self.saved, self.cfg
        from_wm = saved is None and cfg.init == "weight"
        identity = self._identity()
        init_b = {s: (self.wm_element[s] if from_wm else identity[s]).to(device, torch.float32)
                  for s in self.continuous}
        self.mods_b = nn.ModuleList([make_transform(spec.group_of(s), init_b[s], self.par)
                                     for s in self.continuous]).to(device)
        self.mods_a = None if cfg.one_sided else nn.ModuleList(
            [make_transform(spec.group_of(s), identity[s].float(), self.par) for s in self.continuous]).to(device)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.losses: list[float] = []
        self.lambdas: list[float] = []
        self.elapsed = 0.0
        if saved is not None:
            self.mods_b.load_state_dict(saved["mods_b"])
            if self.mods_a is not None:
                self.mods_a.load_state_dict(saved["mods_a"])
            self.gen.set_state(saved["generator"])
            self.losses, self.lambdas = list(saved["losses"]), list(saved["lambdas"])
            self.elapsed = float(saved["seconds"])

    def _identity(self) -> Element:
        """The identity of the continuous spaces (fresh, on the run's device)."""
        ident = self.spec.identity()
        return {s: ident[s].to(self.device) for s in self.continuous}

    def _params(self) -> list[nn.Parameter]:
        """The trainable transform parameters (not the bases a sharded run holds as frozen parameters)."""
        mods = [self.mods_b, *(() if self.mods_a is None else (self.mods_a,))]
        return [p for m in mods for p in m.parameters() if p.requires_grad]

    def _optimizer(self) -> None:
        """Adam on the transform parameters (FSDP-sharded first in a sharded run), with its saved state on resume."""
        if self.shard:
            shard_transforms([*self.mods_b, *(self.mods_a or ())], self.mesh)
        self.params = self._params()
        self.optimizer = torch.optim.Adam(self.params, lr=self.cfg.lr)
        if self.saved is not None:
            self.optimizer.load_state_dict(self.saved["optimizer"])

    def _endpoints(self) -> None:
        """Fixed fp32 endpoint tensors (A as is, B with its discrete part applied) and the private model copy."""
        if self.shard:
            return self._sharded_endpoints()
        b_disc = self.spec.apply(self.sd_b, {**self._identity(), **self.disc})
        self.a32 = {k: (v.detach().to(torch.float32) if v.is_floating_point() else v) for k, v in self.sd_a.items()}
        self.b32 = {k: (v.detach().to(torch.float32) if v.is_floating_point() else v) for k, v in b_disc.items()}
        self.plan = _ContinuousPlan(self.spec, self.continuous, self.a32)
        self.work = copy.deepcopy(self.model).to(self.device).float().eval()
        self.work.requires_grad_(False)

    def _sharded_endpoints(self) -> None:
        """This rank's shards of A and of B with its discrete part applied (:mod:`modeconn.match.sharded`) and the
        meta-device working model with lazy leaves."""
        spec, (reader_a, reader_b) = self.spec, self.readers
        self.plan = _ContinuousPlan(spec, self.continuous, reader_a.meta)
        keys = [k for k in reader_a.meta if k not in self.plan.aliases]
        disc_el, cont, cache = {**self.identity, **self.disc}, set(self.continuous), {}
        permuted = {k for k in keys if any(b.space not in cont for b in spec.tensors.get(k, ()))}

        def whole_b(key: str) -> torch.Tensor | None:  # the discrete bindings only (the continuous ones act later)
            if key not in permuted:
                return None
            skip = tuple(b for b in spec.tensors[key] if b.space in cont)
            return spec.apply_tensor(key, reader_b.whole(key).to(self.device), disc_el, skip=skip, cache=cache)

        rank, world = self.ranks.rank, self.ranks.world
        axes = {k: self.plan.block_axis(k, tuple(reader_a.meta[k].shape), world) for k in keys}
        dims = {k: a for k, a in axes.items() if a is not None}
        # block-local tensors (split where each block transforms on its own) are transformed per block and only their
        # interpolation is all-gathered; one process has nothing to gather and holds whole elements
        self.blocks = {k: (a, *row_block(reader_a.meta[k].shape[a], rank, world)) for k, a in dims.items()
                       if reader_a.meta[k].is_floating_point()} if self.mesh is not None else {}
        self.held = self.plan.held_units(self.blocks, keys) if self.mesh is not None else {}
        self.store_a = ShardedEndpoints.load(reader_a, keys, rank, world, self.mesh, self.device, dims=dims)
        self.store_b = ShardedEndpoints.load(reader_b, keys, rank, world, self.mesh, self.device, whole=whole_b,
                                             dims=dims)
        check_finite_shards({"A": self.store_a, "B": self.store_b}, self.ranks)
        self.work = meta_work_model(self.model, reader_a.meta, self.device)
        self.leaves = LazyLeaves(self.work, reader_a.meta, self.plan.aliases)

    def prepare(self) -> None:
        self._discrete()
        self._transforms()
        self.ranks.check_same("the discrete parts, initial transforms or resume step",
                              [*self.disc.values(), *self._params()], extra=f"{self.start_step}/{self.fingerprint}".encode())
        self._optimizer()
        self._endpoints()

    # ------------------------------------------------------------------ training
    def _elements_now(self, mods: nn.ModuleList | None) -> Element | None:
        """The transforms' current (differentiable) elements by space; None for an identity side."""
        return None if mods is None else {s: m() for s, m in zip(self.continuous, mods, strict=True)}

    def _detached_elements(self, mods: nn.ModuleList | None) -> Element | None:
        """Sharded runs: the transforms' current elements computed without autograd and entered as leaf tensors that
        collect their gradients (``requires_grad``); :meth:`_backward_transforms` carries those gradients into the
        transform parameters one module at a time. The result is the chain rule's, but no transform's autograd graph
        (Cayley solves, polar factors, the gathered parameters and bases) is held across the model's forward and
        backward pass: only the elements and their gradients."""
        if mods is None:
            return None
        return {s: detached_element(m, self.held.get(s)) for s, m in zip(self.continuous, mods, strict=True)}

    def _backward_transforms(self) -> None:
        """The elements' gradients (from the model's backward pass) through each transform module in turn: its
        element recomputed with autograd (FSDP all-gathers its parameters and bases), ``backward(∂element)`` (FSDP
        reduce-scatters the parameters' gradients), the graph freed before the next module. Every rank runs every
        module in the same order (a zero gradient where its rows did not reach a space), as the collectives need."""
        for mods, els in zip((self.mods_a, self.mods_b), self.leaf_elements, strict=True):
            if mods is None:
                continue
            for s, m in zip(self.continuous, mods, strict=True):
                grad = els.pop(s).grad
                out = m()
                if out.requires_grad:  # the same on every rank (the same modules)
                    torch.autograd.backward(out, element_gradient(grad, out, self.held.get(s)))
                del out, grad
        self.leaf_elements = None

    def _output(self, x: torch.Tensor, lam: float, g_a: Element | None, g_b: Element | None) -> Any:
        """``model(x)`` at ``θ(λ) = (1−λ)·g_a(θ_A) + λ·g_b(θ_B)`` (None: no transform on that side): whole tensors
        through ``functional_call``, or the sharded store's tensors materialised leaf by leaf."""
        if self.shard:
            def theta(key: str) -> torch.Tensor:
                if key in self.blocks:  # this rank's block transformed and interpolated, then gathered
                    block, held = self.blocks[key], self.held
                    local = _lerp(self.plan.act_block(key, self.store_a.block(key), g_a, block, held),
                                  self.plan.act_block(key, self.store_b.block(key), g_b, block, held), lam)
                    return gather_blocks(local, block[0], self.store_a.shapes[key][block[0]], self.ranks.group)
                return _lerp(self.plan.act_key(key, self.store_a.full(key), g_a),
                             self.plan.act_key(key, self.store_b.full(key), g_b), lam)

            self.leaves.theta = theta
            return self.work(x)
        theta_a, theta_b = self.plan.act(self.a32, g_a), self.plan.act(self.b32, g_b)
        return functional_call(self.work, {k: _lerp(ta, theta_b[k], lam) for k, ta in theta_a.items()}, (x,))

    def _loss(self, x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor | None:
        """This rank's share of the global mean: its rows' mean loss × rows / global rows (None without rows).
        Sharded: the elements enter as detached leaves (:meth:`_detached_elements`)."""
        if not len(x):
            return None
        if self.shard:
            self.leaf_elements = (self._detached_elements(self.mods_a), self._detached_elements(self.mods_b))
            out = self._output(x, lam, *self.leaf_elements)
        else:
            out = self._output(x, lam, self._elements_now(self.mods_a), self._elements_now(self.mods_b))
        loss = self.loss_fn(out, y)
        rows, total = len(x), _rows(self.batch)
        return loss if rows == total else loss * (rows / total)

    def step(self, step: int) -> None:
        """One Adam step on one global batch (index ``step``, from 0), then progress and the checkpoint."""
        if self.batch is None:
            self.batch = next(self.stream)
        lam = _draw_lambda(self.opts, self.gen)
        if self.shard:
            _check_rows(self.batch, self.ranks, step)
        x, y = _unpack(self.batch, self.device, self.ranks)
        loss = self._loss(x, y, lam)
        global_loss = _global_loss(self.ranks, loss, self.batch, lam, step)
        if not math.isfinite(global_loss):
            raise NonFiniteError(f"dual matching: the loss became {global_loss} at step {step + 1} (λ = {lam:.3f}); "
                                 f"lower lr (= {self.cfg.lr})")
        self.optimizer.zero_grad(set_to_none=True)
        if loss is not None:
            loss.backward()
            del loss
        if self.shard:  # FSDP reduce-scatters the parameters' gradients in the transforms' backward passes
            self._backward_transforms()
        else:
            self.ranks.all_reduce_grads(self.params)
        self.optimizer.step()
        self.losses.append(global_loss)
        self.lambdas.append(lam)
        self.batch = None
        steps = self.cfg.steps
        self.progress(self.stage, step + 1, steps, loss=global_loss, lam=lam)
        if self.ckpt_path is not None and ((step + 1) % self.cfg.checkpoint_every == 0 or step + 1 == steps):
            self.save(step + 1)

    def save(self, step: int) -> None:
        """Write the checkpoint (rank 0; the others wait on a barrier until it is in place)."""
        if self.ranks.rank != 0:
            self.ranks.barrier()
            return
        _save_checkpoint(self.ckpt_path, {
            "fingerprint": self.fingerprint, "step": step,
            "discrete": {s: t.cpu() for s, t in self.disc.items()}, "wm_objective": self.wm_objective,
            "mods_b": self.mods_b.state_dict(), "mods_a": {} if self.mods_a is None else self.mods_a.state_dict(),
            "optimizer": self.optimizer.state_dict(), "generator": self.gen.get_state(),
            "losses": self.losses, "lambdas": self.lambdas, "seconds": self._seconds(),
        })
        self.ranks.barrier()

    def _seconds(self) -> float:
        return self.elapsed + time.perf_counter() - self.start_time

    # ------------------------------------------------------------------ finish
    def _elements(self) -> tuple[Element, Element]:
        """The learned elements of A and B on the CPU (projected to the group where the parameterisation is not
        exact), the same on every rank and valid group elements (SpecError naming the model otherwise)."""
        cont = self.continuous
        element_b = {**self.identity, **self.disc,
                     **{s: unsharded_element(m) for s, m in zip(cont, self.mods_b, strict=True)}}
        element_a = {**self.identity, **self._identity()} if self.mods_a is None else {
            **self.identity, **{s: unsharded_element(m) for s, m in zip(cont, self.mods_a, strict=True)}}
        element_b = {s: element_b[s].cpu() for s in self.spec.spaces}  # in the spec's order
        element_a = {s: element_a[s].cpu() for s in self.spec.spaces}
        self.ranks.check_same("the learned elements", [*element_a.values(), *element_b.values()])
        for side, el in (("A", element_a), ("B", element_b)):
            try:
                self.spec.check_element(el)
            except SpecError as e:
                raise SpecError(f"dual matching learned an invalid element for model {side}: {e}") from None
        return element_a, element_b

    def finish(self) -> DualAlignment:
        spec, cfg = self.spec, self.cfg
        element_a, element_b = self._elements()
        relative = element_b if cfg.one_sided else spec.compose(spec.inverse(element_a), element_b)
        stats: dict[str, Any] = {
            "steps": cfg.steps, "seconds": self._seconds(), "lr": float(cfg.lr),
            "lambda_schedule": cfg.lambda_schedule, "lambda_value": cfg.lambda_value,
            "lambda_width": cfg.lambda_width, "init": cfg.init, "parameterization": self.par.name,
            "one_sided": cfg.one_sided, "seed": cfg.seed, "continuous_spaces": self.continuous,
            "wm_objective": self.wm_objective, "resumed_from": self.start_step, "lambdas": self.lambdas,
            "world_size": self.ranks.world, "sharded": self.shard,
        }
        if self.shard:
            stats["stored_bytes"] = {"endpoints": self.store_a.nbytes() + self.store_b.nbytes(),
                                     "transforms": _local_bytes([*self.mods_b.parameters(), *self.mods_b.buffers(), *(
                                         () if self.mods_a is None else (*self.mods_a.parameters(), *self.mods_a.buffers()))])}
        if cfg.verify:
            check_batch = next(endless(self.loader, what="dual matching"))
            x, _ = _unpack(check_batch, self.device, self.ranks)
            stats.update(_check_function(self._verify_outputs(x, element_a, element_b), self.ranks))
        losses = self.losses
        tail = losses[-max(1, len(losses) // 10):] if losses else [float("nan")]
        return DualAlignment(method="one_sided" if cfg.one_sided else "dual", spec=spec, element=relative,
                             objective=sum(tail) / len(tail), history=[losses], stats=stats,
                             objective_sense="minimize", element_a=element_a, element_b=element_b)

    @torch.no_grad()
    def _verify_outputs(self, x: torch.Tensor, element_a: Element, element_b: Element):
        """``(reference, transformed)`` logits on ``x`` for A and for B (None where this rank has no rows): θ and
        π(θ) with the whole elements, or (sharded) the stored tensors without and with the continuous parts."""
        if not len(x):
            return [None, None]
        if not self.shard:
            return [(_logits(functional_call(self.work, _float(sd), (x,))), _logits(functional_call(
                self.work, _float(self.spec.apply(sd, {s: t.to(self.device) for s, t in el.items()})), (x,))))
                for sd, el in ((self.sd_a, element_a), (self.sd_b, element_b))]
        pairs = []
        for el, side in ((element_a, "a"), (element_b, "b")):
            g = {s: el[s][slice(*self.held.get(s, (None, None)))].to(self.device) for s in self.continuous}
            ref = _logits(self._output(x, 0.0 if side == "a" else 1.0, None, None))
            got = _logits(self._output(x, 0.0 if side == "a" else 1.0, g if side == "a" else None,
                                       g if side == "b" else None))
            pairs.append((ref, got))
        return pairs

    def run(self) -> DualAlignment:
        self.resume()
        self.prepare()
        for step in range(self.start_step, self.cfg.steps):
            self.step(step)
        return self.finish()


# ------------------------------------------------------------------------------------------ helpers
def default_loss(output: Any, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``output`` (a logits tensor, an object with ``.logits`` or a tuple whose first entry
    is the logits) against integer labels ``y``; logits ``(B, T, V)`` with labels ``(B, T)`` are scored per token."""
    logits = getattr(output, "logits", output)
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    if logits.ndim == 3 and y.ndim == 2 and tuple(logits.shape[:2]) == tuple(y.shape):
        logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
    return F.cross_entropy(logits, y)


def _logits(output: Any) -> torch.Tensor:
    out = getattr(output, "logits", output)
    return out[0] if isinstance(out, (tuple, list)) else out


def _wm_element(spec: SymmetrySpec, weight_alignment) -> Element | None:
    if weight_alignment is None:
        return None
    el = weight_alignment.element if isinstance(weight_alignment, Alignment) else weight_alignment
    if not isinstance(el, Mapping):
        raise ConfigError(f"weight_alignment must be an Alignment or a group element, got {type(weight_alignment).__name__}")
    el = dict(el)
    try:
        spec.check_element(el)
    except SpecError as e:
        raise SpecError(f"weight_alignment: {e}") from None
    return el


def _draw_lambda(opts: Mapping[str, Any], gen: torch.Generator) -> float:
    """One λ of the schedule in ``opts`` (``lambda_schedule``, ``lambda_value``, ``lambda_width``; fp64 draws)."""
    return draw_lambda(opts["lambda_schedule"], opts["lambda_value"], opts["lambda_width"], gen)


def _unpack(batch, device, ranks: Ranks) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of the batch's ``(x, y)`` (:meth:`Ranks.shard`), on ``device``."""
    _check_format(batch)
    return ranks.shard(batch[0]).to(device), ranks.shard(batch[1]).to(device)


def _check_format(batch) -> None:
    if not isinstance(batch, (tuple, list)) or len(batch) < 2 or not isinstance(batch[0], torch.Tensor):
        raise ConfigError(f"dual matching expects loader batches (x, y, ...) of tensors, got {type(batch).__name__}")


def _rows(batch) -> int:
    return len(batch[0])


def _check_rows(batch, ranks: Ranks, step: int | None = None) -> None:
    """ConfigError (before the first step) or DistributedError (at ``step``, sharded runs) for a batch with fewer
    rows than ranks."""
    _check_format(batch)
    if step is not None and ranks.world > _rows(batch):
        raise DistributedError(f"dual matching step {step + 1}: the batch has {_rows(batch)} rows for {ranks.world} "
                               "ranks; sharded runs need a row per rank in every batch (drop the short last batch)")
    if ranks.world > _rows(batch):
        raise ConfigError(f"world size {ranks.world} exceeds the batch size {_rows(batch)} (rows of the loader's first "
                          "batch): every rank needs a share of each batch; use larger batches or fewer processes")


def _global_loss(ranks: Ranks, loss: torch.Tensor | None, batch, lam: float, step: int) -> float:
    """The global batch's mean loss: the sum over ranks of their weighted shares (one all-gather, which also checks
    that every rank got the same global batch and λ; DistributedError naming the step otherwise)."""
    share = 0.0 if loss is None else float(loss.detach())
    if ranks.world == 1:
        return share
    x, y = batch[0], batch[1]
    n = len(x)
    pos = torch.arange(1, n + 1, dtype=torch.float64, device=x.device)
    checksum = float((x.reshape(n, -1).double().sum(1) * pos).sum() + (y.reshape(n, -1).double().sum(1) * pos).sum())
    got = ranks.gather(torch.tensor([share, n, checksum, lam], dtype=torch.float64))
    if not bool((got[:, 1:] == got[0, 1:]).all()):
        rows = "; ".join(f"rank {r}: {int(v[1])} rows, checksum {v[2]:.6g}, λ {v[3]:.6g}" for r, v in enumerate(got.tolist()))
        raise DistributedError(f"dual matching step {step + 1}: the ranks got different batches or λ ({rows}); every "
                               "rank must iterate the same loader (same data, same seeded order) with the same seed")
    return float(got[:, 0].sum())


def _check_function(outputs, ranks: Ranks) -> dict[str, float]:
    """max|Δoutput| between θ and π(θ) for both endpoints from ``outputs`` (``(reference, transformed)`` logits of A
    and of B on this rank's rows, or None; maxima all-reduced); SpecError beyond the tolerance (on every rank)."""
    maxima = torch.zeros(4, dtype=torch.float64)  # |Δ| and max|output| of A, then of B
    for i, pair in enumerate(outputs):
        if pair is not None:
            ref, got = pair
            maxima[2 * i], maxima[2 * i + 1] = float((got - ref).abs().max()), float(ref.abs().max())
    ranks.all_reduce_(torch.nan_to_num_(maxima, nan=math.inf), dist.ReduceOp.MAX)
    out = {}
    for i, side in enumerate("ab"):
        diff, tol = float(maxima[2 * i]), FUNCTION_RTOL * max(1.0, float(maxima[2 * i + 1]))
        if not diff <= tol:
            raise SpecError(
                f"dual matching: the learned transform of model {side.upper()} changes its outputs by {diff:.3g} "
                f"(> {tol:.3g}); the element is numerically unusable (ill-conditioned invertible transform?)"
            )
        out[f"max_output_change_{side}"] = diff
    return out


def _local_bytes(params) -> int:
    """Bytes of this rank's part of ``params`` (the local shard of a DTensor)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
    return sum(t.numel() * t.element_size() for t in local)


def _lerp(ta: torch.Tensor, tb: torch.Tensor, lam: float) -> torch.Tensor:
    """``(1−λ)·ta + λ·tb`` as ``ta + λ·(tb − ta)`` for floating tensors; ``ta`` for the others."""
    return ta + lam * (tb - ta) if ta.is_floating_point() else ta


def _shard_device(meta: StateDict) -> torch.device:
    """Where a sharded run computes: the endpoints' device when they are in memory, else ``cuda`` (the current device)
    under an NCCL default group, else the CPU."""
    devices = {t.device for t in meta.values() if t.device.type != "meta"}
    if devices:
        return next(iter(devices))
    if torch.cuda.is_available() and dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _float(sd: StateDict) -> dict[str, torch.Tensor]:
    return {k: (v.to(torch.float32) if v.is_floating_point() else v) for k, v in sd.items()}
