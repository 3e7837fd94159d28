"""Learned matching with the straight-through estimator (Ainsworth et al. 2023, §3.3, Alg. 2).

A free proxy ``θ̃`` (initialised at θ_A) is trained. In each step the exact permutation ``g`` aligning
θ_B to ``θ̃`` is found by weight matching (warm-started from the previous one); the forward pass uses
the projected weights ``g·θ_B`` while the gradient flows to ``θ̃`` (straight-through:
``θ̃ + stopgrad(g·θ_B − θ̃)``). The loss is that of the interpolated model
``(1−λ)θ_A + λ·STE(θ̃)`` on a training batch, with λ drawn per step by ``lambda_schedule`` (uniform on [0, 1] by
default, or fixed at ½ as in the paper's midpoint variant). The models' weights are never changed; the result is
the final projected permutation.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from pydantic import field_validator, model_validator
from torch import nn
from torch.func import functional_call

from .._util.batches import endless
from ..checks import check_compatible, check_finite, check_one_device
from ..nn_utils import mean_cross_entropy
from ..symmetry import Element, SymmetrySpec
from .options import Int, LambdaSchedule, PositiveInt, PositiveReal, draw_lambda
from .progress import reporter, step_loss_legacy
from .result import Alignment
from .weight import weight_matching

StateDict = Mapping[str, torch.Tensor]
LAMBDA_SAMPLING = ("uniform", "midpoint")
"""The deprecated ``lambda_sampling`` values (``"midpoint"`` is ``lambda_schedule="fixed", lambda_value=0.5``)."""
INITS = ("weight", "identity")


class LearnedMatchingConfig(LambdaSchedule):
    """Options of :func:`learned_matching` (unknown fields and bad values: ConfigError naming the field, before any
    work).

    Attributes:
        steps: Adam steps on the proxy, one batch each (≥ 1); ``lr``: their learning rate (> 0).
        lambda_schedule, lambda_value, lambda_width: λ per step (:mod:`modeconn.match.options`; default uniform).
            The former ``lambda_sampling="uniform" | "midpoint"`` is accepted with a DeprecationWarning.
        init: the initial permutation: ``"weight"`` (default: weight matching of (θ_A, θ_B)), ``"identity"`` or a
            group element (None means ``"weight"``).
        seed: seeds weight matching and the λ draws.
        wm_iters: weight-matching sweeps per step (warm-started, so a few suffice; ≥ 1).
    """

    model_config = LambdaSchedule.model_config | {"arbitrary_types_allowed": True}

    steps: PositiveInt = 200
    lr: PositiveReal = 1e-3
    init: Any = "weight"
    seed: Int = 0
    wm_iters: PositiveInt = 5

    @model_validator(mode="before")
    @classmethod
    def _lambda_sampling(cls, data: Any) -> Any:
        """The deprecated ``lambda_sampling`` → ``lambda_schedule`` (+ ``lambda_value``)."""
        if not isinstance(data, Mapping) or "lambda_sampling" not in data:
            return data
        data = dict(data)
        old = data.pop("lambda_sampling")
        if old not in LAMBDA_SAMPLING:
            raise ValueError(f"unknown lambda_sampling {old!r}; valid: {', '.join(LAMBDA_SAMPLING)} (deprecated: use "
                             "lambda_schedule='uniform' or 'fixed')")
        if "lambda_schedule" in data:
            raise ValueError("give lambda_schedule or the deprecated lambda_sampling, not both")
        warnings.warn("learned matching: lambda_sampling is deprecated; use lambda_schedule='uniform', or "
                      "lambda_schedule='fixed' with lambda_value=0.5 for 'midpoint'", DeprecationWarning, stacklevel=2)
        if old == "midpoint":
            data.update(lambda_schedule="fixed", lambda_value=0.5)
        else:
            data["lambda_schedule"] = "uniform"
        return data

    @field_validator("init", mode="before")
    @classmethod
    def _init_named_or_element(cls, v: Any) -> Any:
        if v is None:
            return "weight"
        if isinstance(v, str) and v in INITS:
            return v
        if isinstance(v, Mapping):
            return dict(v)
        raise ValueError(f"init must be 'weight', 'identity' or a group element, got {v!r}")


def learned_matching(
    spec: SymmetrySpec,
    model: nn.Module,
    sd_a: StateDict,
    sd_b: StateDict,
    loader: Iterable,
    config: LearnedMatchingConfig | Mapping[str, Any] | None = None,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = mean_cross_entropy,
    progress: Callable[..., None] | None = None,
    **options: Any,
) -> Alignment:
    """Align ``sd_b`` to ``sd_a`` by STE learned matching.

    Args:
        spec, model: the architecture's spec and an instance (used through a private copy; BatchNorm
            uses batch statistics during training).
        sd_a, sd_b: endpoint state dicts (never mutated).
        loader: training batches ``(x, y)``; re-iterated epoch after epoch (a shuffling loader reshuffles) for
            ``steps`` Adam steps.
        config, options: a :class:`LearnedMatchingConfig` (or a dict of its fields) and keyword overrides:
            ``steps``, ``lr``, ``lambda_schedule``, ``lambda_value``, ``lambda_width``, ``init``, ``seed``,
            ``wm_iters`` (and the deprecated ``lambda_sampling``).
        loss_fn: ``loss_fn(logits, y)`` → mean loss.
        progress: ``progress("learned matching", step, steps, loss=…, lam=…)`` after each step
            (:mod:`modeconn.match.progress`; a callback without ``**metrics`` is called the deprecated way,
            ``progress(step, steps, loss)``).
    Returns: :class:`Alignment` (``objective_sense="minimize"``; ``objective``: mean training loss over the last 10%
        of steps; ``history[0]``: the loss per step).
    Raises: ConfigError for bad options or an empty loader; SpecError for an invalid ``init`` element; the
        state-dict errors of weight matching.
    """
    cfg = LearnedMatchingConfig.from_any(config, **options)  # typos and bad values fail here, before any work
    return _Run(spec, model, sd_a, sd_b, loader, cfg, loss_fn, progress).run()


class _Run:
    """One STE learned-matching call: setup (checks, proxy, initial permutation) → one :meth:`step` per Adam step →
    finish (the final projection)."""

    def __init__(self, spec: SymmetrySpec, model: nn.Module, sd_a: StateDict, sd_b: StateDict, loader: Iterable,
                 cfg: LearnedMatchingConfig, loss_fn: Callable, progress: Callable[..., None] | None) -> None:
        self.start = time.perf_counter()
        self.spec, self.sd_a, self.sd_b, self.cfg, self.loss_fn = spec, sd_a, sd_b, cfg, loss_fn
        check_compatible([model.state_dict(), sd_a, sd_b], ["model", "A", "B"])
        self.device = check_one_device([sd_a, sd_b], ["A", "B"])
        check_finite(sd_a, "A")
        check_finite(sd_b, "B")
        if not isinstance(cfg.init, str):
            spec.check_element(cfg.init)
        self.progress = reporter(progress, step_loss_legacy, what="learned matching")
        self.work = copy.deepcopy(model).to(self.device).train()
        param_keys = [k for k, _ in self.work.named_parameters()]
        self.a = {k: v.detach().to(torch.float32) if v.is_floating_point() else v.detach().clone() for k, v in sd_a.items()}
        self.b = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in sd_b.items()}
        self.aliases = spec.aliases_in(self.a)  # tied weights (a masked LM's decoder and embeddings)
        self.proxy = {k: self.a[k].clone().requires_grad_(True) for k in param_keys}
        self.opt = torch.optim.Adam(self.proxy.values(), lr=cfg.lr)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.g = self._initial()
        self.losses: list[float] = []
        self.batches = endless(loader, what="learned_matching")

    def _initial(self) -> Element:
        init = self.cfg.init
        if init == "weight":
            return weight_matching(self.spec, self.sd_a, self.sd_b, seed=self.cfg.seed).element
        return self.spec.identity() if init == "identity" else dict(init)

    def _project(self) -> Element:
        """The permutation aligning θ_B to the current proxy (weight matching, warm-started at ``g``)."""
        target = {k: (self.proxy[k].detach() if k in self.proxy else self.a[k]) for k in self.a}
        return weight_matching(self.spec, target, self.b, restarts=1, max_iter=self.cfg.wm_iters, init=self.g,
                               seed=self.cfg.seed).element

    def _path_point(self, lam: float) -> dict[str, torch.Tensor]:
        """``(1−λ)θ_A + λ·STE(θ̃)`` with B projected by the current permutation (buffers: lerp, integers: A's)."""
        b_aligned = self.spec.apply(self.sd_b, self.g)
        theta = {}
        for k, t in self.a.items():
            bk = b_aligned[k].to(self.device)
            if k in self.proxy:
                ste = self.proxy[k] + (bk.to(torch.float32) - self.proxy[k]).detach()
                theta[k] = (1 - lam) * t + lam * ste
            elif k not in self.aliases:
                theta[k] = torch.lerp(t, bk.to(torch.float32), lam) if t.is_floating_point() else t.clone()
        theta.update({alias: theta[k] for alias, k in self.aliases.items()})  # tied: one tensor, one gradient
        return theta

    def step(self, step: int) -> None:
        """Project, then one Adam step on the proxy on the next batch (index ``step``, from 0)."""
        cfg = self.cfg
        self.g = self._project()
        lam = draw_lambda(cfg.lambda_schedule, cfg.lambda_value, cfg.lambda_width, self.gen, torch.float32)
        theta = self._path_point(lam)
        x, y, *_ = next(self.batches)
        loss = self.loss_fn(functional_call(self.work, theta, (x.to(self.device),), tie_weights=False),
                            y.to(self.device))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.losses.append(float(loss.detach()))
        self.progress("learned matching", step + 1, cfg.steps, loss=self.losses[-1], lam=lam)

    def finish(self) -> Alignment:
        cfg = self.cfg
        self.g = self._project()
        tail = self.losses[-max(1, cfg.steps // 10):]
        return Alignment(
            method="learned",
            spec=self.spec,
            element={s: p.cpu() for s, p in self.g.items()},
            objective=sum(tail) / len(tail),
            history=[self.losses],
            stats={"steps": cfg.steps, "lr": cfg.lr, "lambda_schedule": cfg.lambda_schedule,
                   "lambda_value": cfg.lambda_value, "seconds": time.perf_counter() - self.start},
            objective_sense="minimize",
        )

    def run(self) -> Alignment:
        for step in range(self.cfg.steps):
            self.step(step)
        return self.finish()
