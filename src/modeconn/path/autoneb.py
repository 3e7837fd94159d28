"""AutoNEB: nudged-elastic-band paths with automatic pivot insertion (Draxler et al. 2018, "Essentially No
Barriers in Neural Network Energy Landscape"; NEB of Jónsson, Mills & Jacobsen 1998 with the improved tangent
and spring force of Henkelman & Jónsson 2000).

A path is a chain of *pivots* θ_0 = θ_A, θ_1 … θ_m, θ_{m+1} = θ_B (endpoints fixed), joined by straight
segments. It starts with ``initial_pivots`` inner pivots evenly spaced on the segment θ_A → θ_B.

**NEB step** (one minibatch, shared by every pivot of the step): for each inner pivot i,

- g_i = ∇L(θ_i): one minibatch gradient of the training loss (model in train mode: BatchNorm uses batch
  statistics, dropout is active — as in Bezier curve training);
- τ_i: the unit tangent. ``tangent="central"`` (default): ``τ_i ∝ θ_{i+1} − θ_{i−1}`` (needs no energies, so
  minibatch noise in the losses cannot flip it). ``tangent="upwind"``: the improved tangent of Henkelman &
  Jónsson 2000: the segment towards the higher-loss neighbour, and at a loss extremum along the
  chain the ΔV-weighted mix of both segments; its energies are the step's minibatch losses (θ_A, θ_B are
  forwarded on the same batch: 2 ``forward_evals`` per step). A zero tangent (coincident neighbours) falls
  back to no projection and no spring for that pivot;
- NEB force ``F_i = −g⊥_i + F_s,i`` with the perpendicular gradient ``g⊥ = g − (g·τ)τ`` (the loss may not pull
  pivots along the path, which would let them slide into the minima) and the spring force
  ``F_s = k·(‖θ_{i+1} − θ_i‖ − ‖θ_i − θ_{i−1}‖)·τ`` (``spring`` = k ≥ 0; 0 disables it);
- the optimizer (SGD with momentum, or Adam) takes ``−F_i`` as the gradient of θ_i, i.e. plain SGD is
  ``θ_i ← θ_i − lr·g⊥_i + lr·F_s,i``. One pivot gradient is one ``grad_eval``, so a step costs m.

**AutoNEB cycles**: each of the ``cycles`` runs ``steps_per_cycle`` NEB steps (a fresh optimizer per cycle:
momentum / Adam moments restart when the chain changes size), then a *dense check*: the loss at every pivot
and at ``insert_probe`` evenly spaced points inside every segment, on a fixed set of ``eval_batches`` training
minibatches drawn once at the start. A probe's *excess* is its loss minus the linear interpolation of its
segment's two pivot losses; if the largest excess exceeds ``insert_tol`` (nats for cross-entropy), a new pivot
is inserted at that probe point (Draxler et al.'s insertion criterion: where the segment is not well
represented by its pivots), while there are fewer than ``max_pivots`` inner pivots. No pivot is inserted
after the last cycle (nothing would optimize it) nor when the budget cannot pay one more step.

Decisions (the paper and its reference implementation leave room):

- *Coordinates*: the model's trainable parameters (:func:`~modeconn.path.pathobj.param_names`), one flat fp32
  vector per pivot (fp64 if A has fp64 parameters; pivots keep A's dtypes). BatchNorm running statistics are not coordinates:
  inner pivots carry buffers linearly interpolated between A's and B's at the pivot's ``t`` (integer buffers
  from A), as the Bezier baseline's sampled points; :meth:`Path.evaluate` (``bn="reset"``) re-estimates them.
- *Dense check mode*: a private copy of the model in eval mode except its BatchNorm layers, which run in train
  mode — batch statistics of the evaluated weights (running statistics of the copy are updated but never
  read or returned), dropout off, so the check is deterministic and probes are comparable. The user's model
  is never touched. The endpoints' dense losses are computed once (they do not move).
- *Counting*: ``grad_evals`` counts minibatch backward passes (one per pivot per step; the unit LLPF and
  Bezier report), ``forward_evals`` the gradient-free minibatch forwards (dense checks; upwind endpoint
  energies). With ``budget`` (grad evals) no step is started that would exceed it (a partial step would update
  some pivots and not others), so ``grad_evals ≤ budget``, and when the budget stops the run the unspent
  remainder is smaller than one step (``info["budget_left"]``); budgets across methods are matched in grad
  evals, not wall time.
- *One minibatch per step for all pivots* (common random numbers): neighbouring pivots' forces then differ by
  the landscape, not by minibatch noise, which keeps the chain smooth.
- *Insertion threshold*: ``insert_tol`` defaults to 0.05 nats — a segment whose interior rises less than that
  above its pivots is well represented, and a new pivot costs a grad eval on every later step; 0 inserts
  whenever any probe lies above the chord (up to ``max_pivots``, which counts inner pivots only).
- *Output*: the pivots (not a resampling): point 0 is sd_a and the last point sd_b, bit-identical copies;
  ``t`` is the normalised cumulative arc length over the parameters (``Path.evaluate(sub_points=k)`` checks
  the segments between pivots densely). The chain always reaches B (``info["reached_b"]``), but too few pivots
  — a small budget, or ``max_pivots`` reached — leave segments whose interior rises above their pivots: such a
  path is *incomplete* by the continuity check (:meth:`~modeconn.path.pathobj.PathCurve.completeness`), like
  any other method's.

Every random choice (evaluation batches, minibatch order, dropout) comes from
``torch.Generator().manual_seed(seed)``: the same seed gives the same bytes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from ..config import StrictConfig
from ..errors import ConfigError, NonFiniteError
from ..nn_utils import batchnorm_modules
from ._flat import FlatParams
from ._stream import BatchStream, resolve_dataset
from .curves import _loss_fn, check_endpoints
from .interpolate import interpolate
from .pathobj import Path, cpu_clone

StateDict = Mapping[str, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class AutoNEBConfig(StrictConfig):
    """Settings of :func:`autoneb`. Unknown fields (typos) and bad values raise ConfigError naming the field.

    Attributes:
        initial_pivots: inner pivots of the initial chain (evenly spaced on the straight line), ≥ 1.
        max_pivots: most inner pivots (endpoints not counted); ≥ ``initial_pivots``.
        cycles: AutoNEB cycles (NEB steps, then a dense check and at most one insertion).
        steps_per_cycle: NEB steps per cycle (each costs one grad eval per inner pivot).
        lr: learning rate of the pivot optimizer.
        optimizer: ``"sgd"`` (with ``momentum``) or ``"adam"``.
        momentum: SGD momentum in [0, 1) (ignored by Adam).
        spring: spring constant k ≥ 0 (0: no spring force).
        tangent: ``"central"`` (θ_{i+1} − θ_{i−1}) or ``"upwind"`` (Henkelman & Jónsson 2000).
        insert_probe: probe points per segment in the dense check, ≥ 1 (probe k at k/(insert_probe+1)).
        insert_tol: a pivot is inserted only where a probe's loss exceeds the linear interpolation of its
            segment's pivot losses by more than this (loss units, nats for cross-entropy), ≥ 0.
        eval_batches: training minibatches of the dense check (drawn once, fixed for the run), ≥ 1.
        budget: most grad evals (None: cycles × steps_per_cycle steps); ≥ ``initial_pivots`` (one step). Without
            ``steps_per_cycle`` the cycles are sized to it (:meth:`for_budget`).
        batch_size: minibatch size (default: the DataLoader's, else 128).
        seed: seeds the run's one ``torch.Generator``.
    """

    initial_pivots: int = Field(3, ge=1)
    max_pivots: int = Field(10, ge=1)
    cycles: int = Field(4, ge=1)
    steps_per_cycle: int = Field(100, ge=1)
    lr: float = Field(0.01, gt=0, allow_inf_nan=False)
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(0.9, ge=0, lt=1)
    spring: float = Field(1.0, ge=0, allow_inf_nan=False)
    tangent: Literal["central", "upwind"] = "central"
    insert_probe: int = Field(9, ge=1)
    insert_tol: float = Field(0.05, ge=0, allow_inf_nan=False)
    eval_batches: int = Field(4, ge=1)
    budget: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1)
    seed: int = Field(0, ge=0, lt=2**63)

    @model_validator(mode="after")
    def _pivots_ordered(self) -> AutoNEBConfig:
        if self.max_pivots < self.initial_pivots:
            raise ValueError(f"max_pivots ({self.max_pivots}) must be ≥ initial_pivots ({self.initial_pivots})")
        if self.budget is not None and self.budget < self.initial_pivots:
            raise ValueError(f"budget ({self.budget} grad evals) must pay one step of the initial chain "
                             f"(initial_pivots = {self.initial_pivots})")
        return self

    def for_budget(self) -> AutoNEBConfig:
        """With a ``budget`` and no ``steps_per_cycle``: as many NEB steps per cycle as the budget pays when the
        chain grows by its most, one pivot per cycle (``budget // Σ_c min(initial_pivots + c, max_pivots)``);
        otherwise ``self``."""
        if self.budget is None or "steps_per_cycle" in self.model_fields_set:
            return self
        per_step = sum(min(self.initial_pivots + c, self.max_pivots) for c in range(self.cycles))
        return self.model_copy(update={"steps_per_cycle": max(1, self.budget // per_step)})


# ------------------------------------------------------------------------------------------ NEB forces


def neb_tangents(chain: torch.Tensor, energies: torch.Tensor | None = None) -> torch.Tensor:
    """Unit tangents at the inner points of a chain.

    Args:
        chain: (m+2, P) points θ_0 … θ_{m+1}.
        energies: None for the central tangent ``τ_i ∝ θ_{i+1} − θ_{i−1}``; or (m+2,) losses for the upwind
            ("improved") tangent of Henkelman & Jónsson 2000: τ⁺ = θ_{i+1} − θ_i if V_{i+1} > V_i > V_{i−1},
            τ⁻ = θ_i − θ_{i−1} if V_{i+1} < V_i < V_{i−1}, else ``τ⁺ΔV_max + τ⁻ΔV_min`` (V_{i+1} > V_{i−1}) or
            ``τ⁺ΔV_min + τ⁻ΔV_max`` with ΔV_max/min the larger/smaller of ``|V_{i±1} − V_i|``; an upwind
            tangent of zero length (equal energies) falls back to the central one.

    Returns: (m, P) tangents of unit length, or zero rows where the tangent is undefined (coincident points).
    """
    prev, cur, nxt = chain[:-2], chain[1:-1], chain[2:]
    central = nxt - prev
    if energies is None:
        tau = central
    else:
        e = torch.as_tensor(energies, dtype=torch.float64).to(chain.device)
        e_prev, e_cur, e_next = e[:-2], e[1:-1], e[2:]
        d_next, d_prev = (e_next - e_cur).abs(), (e_prev - e_cur).abs()
        d_max, d_min = torch.maximum(d_next, d_prev), torch.minimum(d_next, d_prev)
        up = (e_next > e_cur) & (e_cur > e_prev)
        down = (e_next < e_cur) & (e_cur < e_prev)
        rising = e_next > e_prev
        one, zero = torch.ones_like(e_cur), torch.zeros_like(e_cur)
        w_plus = torch.where(up, one, torch.where(down, zero, torch.where(rising, d_max, d_min)))
        w_minus = torch.where(up, zero, torch.where(down, one, torch.where(rising, d_min, d_max)))
        tau = w_plus.to(chain.dtype)[:, None] * (nxt - cur) + w_minus.to(chain.dtype)[:, None] * (cur - prev)
        degenerate = tau.norm(dim=1) == 0
        tau = torch.where(degenerate[:, None], central, tau)
    norm = tau.norm(dim=1, keepdim=True)
    return torch.where(norm > 0, tau / norm.clamp_min(torch.finfo(tau.dtype).tiny), torch.zeros_like(tau))


def perpendicular(grads: torch.Tensor, tangents: torch.Tensor) -> torch.Tensor:
    """``g⊥ = g − (g·τ)τ`` row by row: the part of each gradient orthogonal to its unit tangent. (m, P)."""
    return grads - (grads * tangents).sum(dim=-1, keepdim=True) * tangents


def spring_forces(chain: torch.Tensor, tangents: torch.Tensor, k: float) -> torch.Tensor:
    """``F_s,i = k·(‖θ_{i+1} − θ_i‖ − ‖θ_i − θ_{i−1}‖)·τ_i`` for the inner points of ``chain`` (m+2, P) → (m, P):
    pulls each pivot along the path towards the longer of its two segments (equal spacing is the rest state)."""
    prev, cur, nxt = chain[:-2], chain[1:-1], chain[2:]
    stretch = (nxt - cur).norm(dim=1) - (cur - prev).norm(dim=1)
    return k * stretch[:, None] * tangents


def neb_gradient(grads: torch.Tensor, chain: torch.Tensor, tangents: torch.Tensor, k: float) -> torch.Tensor:
    """The negative NEB force ``g⊥ − F_s`` (m, P), fed to the optimizer as the gradient of the inner pivots."""
    out = perpendicular(grads, tangents)
    if k:
        out = out - spring_forces(chain, tangents, k)
    return out


# ------------------------------------------------------------------------------------------------ run


class _Chain(FlatParams):
    """Flat-vector view of one architecture: pivots ↔ parameter dicts, minibatch losses and gradients."""

    def __init__(self, model: nn.Module, sd_a: StateDict, sd_b: StateDict, device: torch.device, loss_fn: LossFn):
        super().__init__(model, sd_a, device)
        self.loss_fn = loss_fn
        self.bn = batchnorm_modules(self.net)

    def loss(self, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.forward(v, x), y)

    def train_mode(self) -> None:
        self.net.train()

    def check_mode(self) -> None:
        """Eval mode except BatchNorm (batch statistics): deterministic, comparable dense checks."""
        self.net.eval()
        for m in self.bn:
            m.train()


def _dense_check(chain: _Chain, pts: torch.Tensor, batches: list[tuple[torch.Tensor, ...]], probe: int,
                 end_losses: tuple[float, float] | None, where: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Losses at the pivots (m+2,) and at the probes (m+1, probe) on ``batches`` (the endpoints' losses are
    computed when ``end_losses`` is None, else reused); returns them and the number of minibatch forwards."""
    chain.check_mode()
    forwards = 0

    @torch.no_grad()
    def loss_at(v: torch.Tensor, what: str) -> float:
        nonlocal forwards
        total = 0.0
        for x, y in batches:
            total += float(chain.loss(v, x, y))
            forwards += 1
        value = total / len(batches)
        if not math.isfinite(value):
            raise NonFiniteError(f"AutoNEB dense-check loss became {value} at {what} ({where}); lower lr")
        return value

    n = pts.shape[0]
    pivot = np.empty(n)
    if end_losses is None:
        end_losses = (loss_at(pts[0], "endpoint A"), loss_at(pts[-1], "endpoint B"))
    pivot[0], pivot[-1] = end_losses
    for i in range(1, n - 1):
        pivot[i] = loss_at(pts[i], f"pivot {i}")
    probes = np.empty((n - 1, probe))
    for j in range(n - 1):
        for k in range(probe):
            s = (k + 1) / (probe + 1)
            probes[j, k] = loss_at(torch.lerp(pts[j], pts[j + 1], s), f"segment {j}, s={s:.3f}")
    return pivot, probes, forwards


class _Run:
    """One AutoNEB call: setup (checks, the chain, the fixed evaluation batches) → one cycle at a time (NEB steps,
    then a dense check and at most one insertion) → finish (the :class:`Path`)."""

    def __init__(self, model: nn.Module, sd_a: StateDict, sd_b: StateDict, train_data: Any, cfg: AutoNEBConfig,
                 loss_fn: LossFn | None, progress: Callable[[int, int], None] | None) -> None:
        self.cfg, self.progress, self.sd_a, self.sd_b = cfg, progress, sd_a, sd_b
        ds, self.bs = resolve_dataset(train_data, cfg.batch_size)
        self.device = device = check_endpoints(model, sd_a, sd_b)
        self.start = time.perf_counter()
        self.ch = _Chain(model, sd_a, sd_b, device, _loss_fn(loss_fn))
        if not self.ch.names:
            raise ConfigError("the model has no parameters: AutoNEB has no coordinates to move")
        self.a, self.b = a, b = self.ch.flat(sd_a), self.ch.flat(sd_b)
        m0 = cfg.initial_pivots
        self.pivots = torch.stack([torch.lerp(a, b, (i + 1) / (m0 + 1)) for i in range(m0)])
        self.gen = torch.Generator().manual_seed(cfg.seed)
        eval_stream = BatchStream(ds, self.bs, self.gen)
        self.eval_set = [tuple(eval_stream.next(device)[:2]) for _ in range(cfg.eval_batches)]
        self.stream = BatchStream(ds, self.bs, self.gen)
        self.grad_evals = self.forward_evals = 0
        self.records: list[dict[str, Any]] = []
        self.total_steps = cfg.cycles * cfg.steps_per_cycle
        self.steps_done = 0
        self.stopped = "cycles"
        self.end_losses: tuple[float, float] | None = None
        self.last_check: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros((0, 0)))

    def run(self) -> None:
        """All cycles, under a forked global RNG seeded from the run's generator (dropout etc.)."""
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(torch.randint(0, 2 ** 62, (), generator=self.gen)))  # dropout etc.
            for cycle in range(self.cfg.cycles):
                if not self.cycle(cycle):
                    break

    def _chain(self) -> torch.Tensor:
        """(m+2, P): A, the inner pivots (detached), B."""
        return torch.cat([self.a[None], self.pivots.detach(), self.b[None]])

    def cycle(self, cycle: int) -> bool:
        """NEB steps with a fresh optimizer, then the dense check; False once the run stops."""
        cfg = self.cfg
        m = self.pivots.shape[0]
        self.pivots = self.pivots.detach().clone().requires_grad_(True)
        opt = (torch.optim.SGD([self.pivots], lr=cfg.lr, momentum=cfg.momentum) if cfg.optimizer == "sgd"
               else torch.optim.Adam([self.pivots], lr=cfg.lr))
        self.ch.train_mode()
        mean_losses: list[float] = []
        for step in range(cfg.steps_per_cycle):
            if cfg.budget is not None and self.grad_evals + m > cfg.budget:
                self.stopped = "budget"
                break
            mean_losses.append(self.step(opt, cycle, step, m))
        if not mean_losses:  # the budget cannot pay a step: the last check describes this chain already
            return False
        self.records.append(self.check(cycle, m, mean_losses))
        return self.stopped != "budget"

    def _gradients(self, x: torch.Tensor, y: torch.Tensor, cycle: int, step: int) -> tuple[torch.Tensor, list[float]]:
        """Minibatch gradient and loss at every inner pivot (one grad eval each)."""
        m = self.pivots.shape[0]
        grads = torch.empty_like(self.pivots)
        losses = []
        for i in range(m):
            v = self.pivots.detach()[i].clone().requires_grad_(True)
            loss = self.ch.loss(v, x, y)
            if not torch.isfinite(loss):
                raise NonFiniteError(f"AutoNEB training loss became {loss.item()} at cycle {cycle}, step {step}, "
                                     f"pivot {i + 1} of {m}; lower lr")
            grads[i] = torch.autograd.grad(loss, v)[0]
            losses.append(loss.item())
        return grads, losses

    def step(self, opt: torch.optim.Optimizer, cycle: int, step: int, m: int) -> float:
        """One NEB step on one minibatch shared by all pivots; returns the mean minibatch loss of the pivots."""
        cfg = self.cfg
        x, y = self.stream.next(self.device)[:2]
        grads, losses = self._gradients(x, y, cycle, step)
        self.grad_evals += m
        chain = self._chain()
        energies = None
        if cfg.tangent == "upwind":
            with torch.no_grad():
                ends = [self.ch.loss(self.a, x, y).item(), self.ch.loss(self.b, x, y).item()]
            self.forward_evals += 2
            energies = torch.tensor([ends[0], *losses, ends[1]], dtype=torch.float64)
        tau = neb_tangents(chain, energies)
        opt.zero_grad(set_to_none=True)
        self.pivots.grad = neb_gradient(grads, chain, tau, cfg.spring)
        opt.step()
        mean_loss = float(np.mean(losses))
        self.steps_done += 1
        if self.progress is not None:
            self.progress(self.steps_done, self.total_steps)
        return mean_loss

    def check(self, cycle: int, m: int, mean_losses: list[float]) -> dict[str, Any]:
        """The dense check after a cycle, and at most one insertion; returns the cycle's record."""
        cfg = self.cfg
        pts = self._chain()
        pivot_l, probe_l, fw = _dense_check(self.ch, pts, self.eval_set, cfg.insert_probe, self.end_losses,
                                            f"cycle {cycle}")
        self.end_losses = (float(pivot_l[0]), float(pivot_l[-1]))
        self.forward_evals += fw
        self.last_check = (pivot_l, probe_l)
        s_grid = np.arange(1, cfg.insert_probe + 1) / (cfg.insert_probe + 1)
        excess = probe_l - ((1 - s_grid)[None, :] * pivot_l[:-1, None] + s_grid[None, :] * pivot_l[1:, None])
        j, k = np.unravel_index(int(np.argmax(excess)), excess.shape)
        rec: dict[str, Any] = {
            "cycle": cycle, "steps": len(mean_losses), "grad_evals": self.grad_evals, "pivots": m,
            "train_loss_first": mean_losses[0], "train_loss_last": mean_losses[-1],
            "max_pivot_loss": float(pivot_l.max()), "max_dense_loss": float(max(pivot_l.max(), probe_l.max())),
            "max_excess": float(excess[j, k]), "inserted": None,
        }
        can_pay = cfg.budget is None or self.grad_evals + m + 1 <= cfg.budget
        if (self.stopped == "cycles" and cycle < cfg.cycles - 1 and m < cfg.max_pivots and can_pay
                and excess[j, k] > cfg.insert_tol):
            new = torch.lerp(pts[j], pts[j + 1], float(s_grid[k]))
            self.pivots = torch.cat([self.pivots.detach()[:j], new[None], self.pivots.detach()[j:]])
            rec["inserted"] = {"segment": int(j), "position": float(s_grid[k]), "excess": float(excess[j, k]),
                               "loss": float(probe_l[j, k])}
        return rec

    def _points(self, pts: torch.Tensor, t: np.ndarray) -> list[dict[str, torch.Tensor]]:
        """The pivots as CPU state dicts: exact copies of A and B at the ends, inner pivots with A's/B's buffers
        interpolated at their ``t``."""
        sd_a = self.sd_a
        points = [cpu_clone(sd_a)]
        for i in range(1, len(pts) - 1):
            sd = interpolate(sd_a, self.sd_b, float(t[i])) if 0 < t[i] < 1 else dict(sd_a)
            sd = cpu_clone(sd)
            for n, p in self.ch.params(pts[i].detach()).items():
                sd[n] = p.to("cpu", copy=True)
            points.append(sd)
        points.append(cpu_clone(self.sd_b))
        return points

    def finish(self) -> Path:
        """The :class:`Path` of the final chain (``t``: normalised cumulative arc length), info and compute."""
        cfg = self.cfg
        pts = self._chain()
        t = _arc_length_t(pts)
        points = self._points(pts, t)
        pivot_l, probe_l = self.last_check
        info = {
            **cfg.model_dump(), "batch_size": self.bs, "coordinates": "parameters", "n_parameters": int(self.a.numel()),
            "eval_examples": sum(int(x.shape[0]) for x, _ in self.eval_set), "records": self.records,
            "stopped": self.stopped, "budget_left": None if cfg.budget is None else cfg.budget - self.grad_evals,
            "n_pivots": len(pts) - 2, "pivot_losses": pivot_l.tolist(), "segment_peaks": probe_l.max(axis=1).tolist(),
            "max_dense_loss": float(max(pivot_l.max(), probe_l.max())),
            "reached_b": True,  # the chain's ends are fixed at A and B; completeness is the continuity check's
        }
        compute = {"grad_evals": self.grad_evals, "forward_evals": self.forward_evals,
                   "wall_time_s": time.perf_counter() - self.start}
        return Path(points, t, method="autoneb", info=info, compute=compute)


def _arc_length_t(pts: torch.Tensor) -> np.ndarray:
    """Normalised cumulative arc length of the chain ``pts`` (m+2, P) in [0, 1] (evenly spaced if it has none)."""
    seg = (pts[1:] - pts[:-1]).double().norm(dim=1).cpu().numpy()
    total = float(seg.sum())
    if total > 0:
        t = np.concatenate([[0.0], np.cumsum(seg) / total])
        t = np.clip(np.maximum.accumulate(t), 0.0, 1.0)
        t[-1] = 1.0
    else:
        t = np.linspace(0.0, 1.0, len(pts))
    return t


def autoneb(
    model: nn.Module,
    sd_a: StateDict,
    sd_b: StateDict,
    train_data: Any,
    config: AutoNEBConfig | Mapping[str, Any] | None = None,
    *,
    loss_fn: LossFn | None = None,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> Path:
    """AutoNEB path between two modes (Draxler et al. 2018): NEB steps with the force ``−∇L⊥ + F_spring`` of
    Henkelman & Jónsson 2000 (central or upwind tangent) and cycles of dense checks that insert pivots where a
    segment's loss rises above the interpolation of its pivots' losses — see the module docstring.

    Args:
        model: an instance of the architecture (copied; never mutated).
        sd_a, sd_b: endpoint state dicts (never mutated; one device — the run's device).
        train_data: a Dataset (TensorDataset preferred) or a DataLoader (its dataset and batch size; batches are
            drawn with the run's seeded generator, its own shuffling is ignored).
        config: an :class:`AutoNEBConfig`, a mapping of its fields, or None (defaults); ``**options`` override
            single fields: ``initial_pivots=3, max_pivots=10, cycles=4, steps_per_cycle=100, lr=0.01,
            optimizer="sgd", momentum=0.9, spring=1.0, tangent="central", insert_probe=9, insert_tol=0.05,
            eval_batches=4, budget=None, batch_size=None, seed=0``.
        loss_fn: ``loss_fn(logits, y)`` → mean loss (default cross-entropy).
        progress: ``progress(step, cycles · steps_per_cycle)`` after each NEB step.

    Returns: a :class:`Path` (method ``"autoneb"``) of the m+2 pivots (P = number of parameters each):
        point 0 is sd_a, the last sd_b (bit-identical copies), ``t`` the normalised cumulative arc length.
        ``info``: the settings (``batch_size`` resolved), ``records`` (per cycle: steps, cumulative grad evals,
        inner pivots during the cycle, first/last mean minibatch loss, max pivot / dense loss, largest excess,
        the inserted pivot ``{"segment", "position", "excess", "loss"}`` or None), the final dense check
        (``pivot_losses``, ``segment_peaks``, ``max_dense_loss``), ``stopped`` (``"cycles"``/``"budget"``),
        ``budget_left``. ``compute``: ``grad_evals``, ``forward_evals``, ``wall_time_s``.

    Raises: ConfigError (unknown option — named, with a "did you mean" hint — or a bad value, checked before
        any work; bad training data; a model without parameters), StateDictMismatchError (endpoints of different
        architectures), DeviceMismatchError, NonFiniteError (NaN/Inf in the endpoints, or the loss became NaN/Inf:
        step, cycle and pivot named).
    """
    cfg = AutoNEBConfig.from_any(config, **options).for_budget()
    run = _Run(model, sd_a, sd_b, train_data, cfg, loss_fn, progress)
    run.run()
    return run.finish()
