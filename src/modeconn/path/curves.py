"""Bezier and polygonal-chain curves between two modes (Garipov et al. 2018, "Loss Surfaces, Mode
Connectivity, and Fast Ensembling of DNNs").

"The path is a module": :class:`CurveModule` is one ``nn.Module`` whose ``controls`` (K control points, each
a flat fp32 vector over all parameters of the architecture) are its only trainable parameters; the
endpoints θ_A, θ_B are fixed buffers. The architecture is evaluated at φ(t) with
``torch.func.functional_call`` on a private copy of the model, so no architecture needs a curve-specific
class. Training minimises ``E_{t~U[0,1]} L(φ(t))`` with one t per minibatch (SGD or Adam).

- Bezier, K control points (degree n = K+1): ``φ(t) = Σ_{i=0}^{n} C(n,i) t^i (1−t)^{n−i} θ_i`` with
  θ_0 = θ_A, θ_n = θ_B (K = 1: the quadratic curve of the paper).
- Polygonal chain, K bends at ``t_j = j/(K+1)``: piecewise linear through θ_A, θ_1 … θ_K, θ_B.
Control points start on the segment (θ_j = θ_A + t_j·(θ_B − θ_A)), as the reference ``init_linear``.

Only the model's *parameters* are curve coordinates. BatchNorm runs in train mode (batch statistics) during
training; sampled points carry linearly interpolated running statistics, which :meth:`Path.evaluate`
re-estimates per t (``bn="reset"``). φ(0) and φ(1) are θ_A and θ_B exactly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn as nn
from pydantic import Field

from ..checks import check_compatible, check_finite, check_one_device
from ..config import StrictConfig
from ..errors import ConfigError, NonFiniteError
from ..nn_utils import mean_cross_entropy
from ._flat import FlatParams
from ._stream import BatchStream, resolve_dataset
from .evaluate import check_fixed_structure
from .interpolate import interpolate
from .pathobj import Path, cpu_clone

StateDict = Mapping[str, torch.Tensor]
CURVE_KINDS = ("bezier", "polychain")
OPTIMIZERS = ("sgd", "adam")


def _positive_int(name: str, v: Any, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"{name} must be an integer ≥ {minimum}, got {v!r}")
    return v


def check_endpoints(model: nn.Module, sd_a: StateDict, sd_b: StateDict) -> torch.device:
    """Same keys/shapes as the model, one device, finite, shared fixed structure; returns the device.
    Raises StateDictMismatchError, DeviceMismatchError, NonFiniteError, ConfigError."""
    check_compatible([model.state_dict(), sd_a, sd_b], ["model", "A", "B"])
    device = check_one_device([sd_a, sd_b], ["A", "B"])
    check_finite(sd_a, "A")
    check_finite(sd_b, "B")
    check_fixed_structure(model, [sd_a, sd_b], ["A", "B"])
    return device


class CurveModule(nn.Module):
    """A Bezier / polygonal-chain curve φ(t) in the parameter space of ``model`` (see the module docstring).

    Args:
        model: an instance of the architecture (copied; never mutated).
        sd_a, sd_b: endpoint state dicts (never mutated; copied to their device).
        kind: ``"bezier"`` or ``"polychain"``.
        control_points: K ≥ 1.

    Attributes:
        controls: ``nn.ParameterList`` of K flat fp32 vectors of length P (number of model parameters) —
            the only trainable parameters (``curve.controls.parameters()``).
        end_a, end_b: (P,) fp32 buffers, the fixed endpoints.
        names: parameter names in flattening order.

    Raises: ConfigError (kind, K), StateDictMismatchError, DeviceMismatchError, NonFiniteError.
    """

    def __init__(self, model: nn.Module, sd_a: StateDict, sd_b: StateDict, *, kind: str = "bezier",
                 control_points: int = 1) -> None:
        super().__init__()
        if kind not in CURVE_KINDS:
            raise ConfigError(f"unknown curve kind {kind!r}; valid: {', '.join(CURVE_KINDS)}")
        self.kind = kind
        self.K = _positive_int("control_points", control_points)
        device = check_endpoints(model, sd_a, sd_b)
        self._flat = FlatParams(model, sd_a, device, torch.float32)
        self.net, self.names = self._flat.net, self._flat.names
        flat = self._flat.flat
        self.register_buffer("end_a", flat(sd_a))
        self.register_buffer("end_b", flat(sd_b))
        self.controls = nn.ParameterList(
            [nn.Parameter(torch.lerp(self.end_a, self.end_b, (j + 1) / (self.K + 1))) for j in range(self.K)]
        )
        self._sd_a = cpu_clone(sd_a)
        self._sd_b = cpu_clone(sd_b)

    # ------------------------------------------------------------------ the curve
    def weights(self, t: float) -> list[float]:
        """The K+2 coefficients of (θ_A, θ_1 … θ_K, θ_B) at ``t`` ∈ [0, 1] (they sum to 1)."""
        t = float(t)
        if not 0.0 <= t <= 1.0:
            raise ConfigError(f"curve parameter t must be in [0, 1], got {t}")
        n = self.K + 1
        if self.kind == "bezier":
            return [math.comb(n, i) * t ** i * (1.0 - t) ** (n - i) for i in range(n + 1)]
        w = [0.0] * (n + 1)
        s = min(int(t * n), n - 1)
        u = t * n - s
        w[s], w[s + 1] = 1.0 - u, u
        return w

    def flat_at(self, t: float) -> torch.Tensor:
        """φ(t) as one (P,) fp32 vector (differentiable w.r.t. ``controls``)."""
        w = self.weights(t)
        nodes = [self.end_a, *self.controls, self.end_b]
        out = None
        for wi, node in zip(w, nodes, strict=False):
            if wi == 0.0:
                continue
            out = node * wi if out is None else out + node * wi
        return out

    def params_at(self, t: float) -> dict[str, torch.Tensor]:
        """``{parameter name: tensor}`` at ``t`` (differentiable; each in its parameter's dtype)."""
        return self._flat.params(self.flat_at(t))

    def forward(self, x: torch.Tensor, t: float) -> torch.Tensor:
        """The architecture's output at φ(t) (buffers from the private copy; BatchNorm in the copy's mode)."""
        return self._flat.forward(self.flat_at(t), x)

    @torch.no_grad()
    def state_dict_at(self, t: float) -> dict[str, torch.Tensor]:
        """The full state dict at ``t`` (CPU): exactly θ_A / θ_B at t = 0 / 1; elsewhere the curve's
        parameters plus buffers interpolated linearly in t (integer buffers from A)."""
        t = float(t)
        if t == 0.0:
            return cpu_clone(self._sd_a)
        if t == 1.0:
            return cpu_clone(self._sd_b)
        sd = interpolate(self._sd_a, self._sd_b, t)
        for n, v in self.params_at(t).items():
            sd[n] = v.detach().to("cpu", copy=True)
        return sd

    def to_path(self, n: int = 25, ts: Sequence[float] | None = None, *, info: Mapping[str, Any] | None = None,
                compute: Mapping[str, Any] | None = None) -> Path:
        """The curve sampled at ``ts`` (default ``n`` evenly spaced t, endpoints included) as a :class:`Path`."""
        grid = np.linspace(0.0, 1.0, _positive_int("n", n, 2)) if ts is None else np.asarray(list(ts), dtype=float)
        return Path([self.state_dict_at(float(t)) for t in grid], grid, method=f"{self.kind}-{self.K}",
                    info=info, compute=compute)


def _loss_fn(loss_fn):
    return loss_fn or mean_cross_entropy


class CurveConfig(StrictConfig):
    """Settings of :func:`train_curve` / :func:`bezier_curve`. Unknown fields and bad values raise ConfigError
    naming the field, before any work.

    Attributes:
        kind: ``"bezier"`` or ``"polychain"``.
        control_points: K ≥ 1 (Bezier degree K+1; polygonal chain with K bends).
        steps: optimizer steps (= gradient evaluations, one minibatch backward each).
        lr, optimizer (``"sgd"``: momentum/weight_decay; ``"adam"``: weight_decay), momentum, weight_decay.
        batch_size: minibatch size (default: the DataLoader's, else 128).
        seed: seeds the run's ``torch.Generator`` (minibatch order, t, dropout).
        n_points: evenly spaced t at which :func:`bezier_curve` samples the trained curve (≥ 2).
    """

    kind: Literal["bezier", "polychain"] = "bezier"
    control_points: int = Field(1, ge=1)
    steps: int = Field(1000, ge=0)
    lr: float = Field(0.01, gt=0, allow_inf_nan=False)
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False)
    batch_size: int | None = Field(None, ge=1)
    seed: int = Field(0, ge=0, lt=2**63)
    n_points: int = Field(25, ge=2)


def train_curve(
    model: nn.Module,
    sd_a: StateDict,
    sd_b: StateDict,
    train_data: Any,
    config: CurveConfig | Mapping[str, Any] | None = None,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> CurveModule:
    """Fit a :class:`CurveModule` by minimising ``E_{t~U[0,1]} L(φ(t))`` (Garipov et al. 2018, eq. 3).

    Each step draws one minibatch and one ``t ~ U[0, 1]`` from ``torch.Generator().manual_seed(seed)`` and
    takes one optimizer step on the control points (endpoints fixed). Same seed → same bytes.

    Args:
        train_data: a Dataset (TensorDataset preferred) or a DataLoader (its dataset and batch size are used,
            batches are drawn with the seeded generator — its own shuffling is ignored).
        config: a :class:`CurveConfig`, a mapping of its fields, or None; ``**options`` override single fields.
        loss_fn: ``loss_fn(logits, y)`` → mean loss (default cross-entropy).
        progress: ``progress(step, steps)`` after each step.

    Returns: the trained curve; ``curve.history`` (per-step training losses) and ``curve.compute``
        (``grad_evals``, ``wall_time_s``).

    Raises:
        ConfigError: an unknown option or a bad value, named.
        StateDictMismatchError: the endpoints do not fit the model.
        DeviceMismatchError: tensors on different devices.
        NonFiniteError: the loss became NaN/Inf; the step is named.
    """
    cfg = CurveConfig.from_any(config, **options)
    kind, control_points, steps, lr = cfg.kind, cfg.control_points, cfg.steps, cfg.lr
    optimizer, momentum, weight_decay, batch_size, seed = (cfg.optimizer, cfg.momentum, cfg.weight_decay,
                                                            cfg.batch_size, cfg.seed)
    ds, bs = resolve_dataset(train_data, batch_size)
    curve = CurveModule(model, sd_a, sd_b, kind=kind, control_points=control_points)
    device = curve.end_a.device
    loss_fn = _loss_fn(loss_fn)
    gen = torch.Generator().manual_seed(seed)
    stream = BatchStream(ds, bs, gen)
    params = list(curve.controls.parameters())
    opt = (torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay) if optimizer == "sgd"
           else torch.optim.Adam(params, lr=lr, weight_decay=weight_decay))
    history: list[float] = []
    start = time.perf_counter()
    was_training = curve.net.training
    curve.net.train()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(torch.randint(0, 2 ** 62, (), generator=gen)))  # dropout etc.
            for step in range(steps):
                x, y = stream.next(device)[:2]
                t = float(torch.rand((), generator=gen, dtype=torch.float64))
                loss = loss_fn(curve(x, t), y)
                if not torch.isfinite(loss):
                    raise NonFiniteError(f"curve training loss became {loss.item()} at step {step} (t={t:.4f}); "
                                         "lower lr")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                history.append(loss.item())
                if progress is not None:
                    progress(step + 1, steps)
    finally:
        curve.net.train(was_training)
    curve.history = history
    curve.compute = {"grad_evals": steps, "wall_time_s": time.perf_counter() - start}
    curve.train_config = {"kind": kind, "control_points": control_points, "steps": steps, "lr": lr,
                          "optimizer": optimizer, "momentum": momentum, "weight_decay": weight_decay,
                          "batch_size": bs, "seed": seed}
    return curve


def bezier_curve(
    model: nn.Module,
    sd_a: StateDict,
    sd_b: StateDict,
    train_data: Any,
    config: CurveConfig | Mapping[str, Any] | None = None,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> Path:
    """Train a Bezier (``kind="bezier"``) or polygonal-chain (``kind="polychain"``) curve with
    ``control_points`` K (see :func:`train_curve`; settings: :class:`CurveConfig`) and sample it at
    ``n_points`` evenly spaced t.

    Returns: a :class:`Path` (method ``"bezier-K"`` / ``"polychain-K"``; first/last point exactly sd_a/sd_b);
        ``info`` holds the training settings and the loss history (first/last/mean of the last 10 %),
        ``compute`` the gradient evaluations (= steps) and wall time.
    Raises: as :func:`train_curve`.
    """
    cfg = CurveConfig.from_any(config, **options)
    curve = train_curve(model, sd_a, sd_b, train_data, cfg, loss_fn=loss_fn, progress=progress)
    h = curve.history
    tail = h[-max(1, len(h) // 10):] if h else []
    info = {**curve.train_config, "train_loss_first": h[0] if h else None, "train_loss_last": h[-1] if h else None,
            "train_loss_tail_mean": float(np.mean(tail)) if tail else None, "reached_b": True}  # φ(1) = θ_B
    return curve.to_path(cfg.n_points, info=info, compute=curve.compute)
