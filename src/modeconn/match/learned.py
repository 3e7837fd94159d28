"""Learned matching with the straight-through estimator (Ainsworth et al. 2023, §3.3, Alg. 2).

A free proxy ``θ̃`` (initialised at θ_A) is trained. In each step the exact permutation ``g`` aligning
θ_B to ``θ̃`` is found by weight matching (warm-started from the previous one); the forward pass uses
the projected weights ``g·θ_B`` while the gradient flows to ``θ̃`` (straight-through:
``θ̃ + stopgrad(g·θ_B − θ̃)``). The loss is that of the interpolated model
``(1−λ)θ_A + λ·STE(θ̃)`` on a training batch, with λ fixed at ½ or drawn from U(0, 1) per step. The
models' weights are never changed; the result is the final projected permutation.
"""

from __future__ import annotations

import copy
import itertools
import time
from typing import Callable, Iterable, Mapping

import torch
import torch.nn as nn
from torch.func import functional_call

from ..checks import check_compatible, check_finite, check_one_device
from ..errors import ConfigError
from ..nn_utils import mean_cross_entropy
from ..symmetry import Element, SymmetrySpec
from .result import Alignment
from .weight import weight_matching

StateDict = Mapping[str, torch.Tensor]
LAMBDA_SAMPLING = ("uniform", "midpoint")


def learned_matching(
    spec: SymmetrySpec,
    model: nn.Module,
    sd_a: StateDict,
    sd_b: StateDict,
    loader: Iterable,
    *,
    steps: int = 200,
    lr: float = 1e-3,
    lambda_sampling: str = "uniform",
    init: Element | None = None,
    seed: int = 0,
    wm_iters: int = 5,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = mean_cross_entropy,
    progress: Callable[[int, int, float], None] | None = None,
) -> Alignment:
    """Align ``sd_b`` to ``sd_a`` by STE learned matching.

    Args:
        spec, model: the architecture's spec and an instance (used through a private copy; BatchNorm
            uses batch statistics during training).
        sd_a, sd_b: endpoint state dicts (never mutated).
        loader: training batches ``(x, y)``; cycled for ``steps`` Adam steps with learning rate ``lr``.
        lambda_sampling: ``"uniform"`` (λ ~ U(0,1) per step) or ``"midpoint"`` (λ = ½).
        init: initial permutation (default: weight matching of (θ_A, θ_B)).
        wm_iters: weight-matching sweeps per step (warm-started, so a few suffice).
    Returns: :class:`Alignment` (``objective``: mean training loss over the last 10% of steps;
        ``history[0]``: the loss per step).
    Raises: ConfigError for bad options or an empty loader; the state-dict errors of weight matching.
    """
    if lambda_sampling not in LAMBDA_SAMPLING:
        raise ConfigError(f"unknown lambda_sampling {lambda_sampling!r}; valid: {', '.join(LAMBDA_SAMPLING)}")
    if steps < 1:
        raise ConfigError(f"steps must be ≥ 1, got {steps}")
    start = time.perf_counter()
    check_compatible([model.state_dict(), sd_a, sd_b], ["model", "A", "B"])
    device = check_one_device([sd_a, sd_b], ["A", "B"])
    check_finite(sd_a, "A")
    check_finite(sd_b, "B")
    work = copy.deepcopy(model).to(device).train()
    param_keys = [k for k, _ in work.named_parameters()]
    a = {k: v.detach().to(torch.float32) for k, v in sd_a.items()}
    proxy = {k: a[k].clone().requires_grad_(True) for k in param_keys}
    opt = torch.optim.Adam(proxy.values(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    g = init if init is not None else weight_matching(spec, sd_a, sd_b, seed=seed).element
    losses: list[float] = []
    batches = itertools.cycle(loader)
    for step in range(steps):
        g = _project(spec, a, proxy, sd_b, g, seed, wm_iters)
        b_aligned = spec.apply(sd_b, g)
        lam = 0.5 if lambda_sampling == "midpoint" else float(torch.rand((), generator=gen))
        theta = {}
        for k, t in a.items():
            bk = b_aligned[k].to(device)
            if k in proxy:
                ste = proxy[k] + (bk.to(torch.float32) - proxy[k]).detach()
                theta[k] = (1 - lam) * t + lam * ste
            else:
                theta[k] = torch.lerp(t, bk.to(torch.float32), lam) if t.is_floating_point() else sd_a[k]
        try:
            x, y, *_ = next(batches)
        except StopIteration:
            raise ConfigError("learned_matching got an empty loader") from None
        loss = loss_fn(functional_call(work, theta, (x.to(device),)), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step + 1, steps, losses[-1])
    g = _project(spec, a, proxy, sd_b, g, seed, wm_iters)
    tail = losses[-max(1, steps // 10):]
    return Alignment(
        method="learned",
        spec=spec,
        element={s: p.cpu() for s, p in g.items()},
        objective=sum(tail) / len(tail),
        history=[losses],
        stats={"steps": steps, "lr": lr, "lambda_sampling": lambda_sampling, "seconds": time.perf_counter() - start},
    )


def _project(spec, a, proxy, sd_b, g, seed, wm_iters) -> Element:
    """The permutation aligning θ_B to the current proxy (weight matching, warm-started at ``g``)."""
    target = {k: (proxy[k].detach() if k in proxy else a[k]) for k in a}
    b = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in sd_b.items()}
    return weight_matching(spec, target, b, restarts=1, max_iter=wm_iters, init=g, seed=seed).element
