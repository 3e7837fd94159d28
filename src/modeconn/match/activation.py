"""Activation matching (Ainsworth et al. 2023 §3.1; Li et al. 2015; Jordan et al. 2023).

For every space, the Pearson cross-correlation between the units of model A and model B is accumulated
over a data loader (streaming sums in float64; each "sample" is one input position, so a conv feature
map contributes N·H·W samples), summed over the places the space is observed (its probes), and a LAP
picks the permutation of B's units maximising the total correlation. Units with zero variance (dead
ReLUs) get correlation 0 with everything, so no NaN ever reaches the LAP.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterable

import torch
import torch.nn as nn

from ..checks import check_one_device
from ..errors import ConfigError, SpecError
from ..nn_utils import batch_inputs, eval_mode, model_device
from ..symmetry import Probe, SymmetrySpec
from .lap import LapTimer, solve_lap
from .result import Alignment


class CorrelationStats:
    """Streaming Pearson cross-correlation between two (samples, n) activation streams (float64 sums)."""

    def __init__(self, n: int, device: torch.device) -> None:
        z = lambda *s: torch.zeros(*s, dtype=torch.float64, device=device)  # noqa: E731
        self.count = 0
        self.sa, self.sb, self.saa, self.sbb, self.sab = z(n), z(n), z(n), z(n), z(n, n)

    def update(self, xa: torch.Tensor, xb: torch.Tensor) -> None:
        """Add samples: ``xa``, ``xb`` of shape (samples, n)."""
        xa, xb = xa.double(), xb.double()
        self.count += xa.shape[0]
        self.sa += xa.sum(0)
        self.sb += xb.sum(0)
        self.saa += (xa * xa).sum(0)
        self.sbb += (xb * xb).sum(0)
        self.sab += xa.T @ xb

    def correlation(self) -> torch.Tensor:
        """(n, n) Pearson correlation corr[i, j] of A's unit i with B's unit j; 0 where a unit is dead."""
        c = max(self.count, 1)
        ma, mb = self.sa / c, self.sb / c
        cov = self.sab / c - torch.outer(ma, mb)
        va = (self.saa / c - ma * ma).clamp_min(0)
        vb = (self.sbb / c - mb * mb).clamp_min(0)
        sa, sb = va.sqrt(), vb.sqrt()
        dead_a, dead_b = sa <= 1e-12 * (1 + ma.abs()), sb <= 1e-12 * (1 + mb.abs())
        corr = cov / (torch.outer(sa, sb).clamp_min(1e-300))
        corr[dead_a, :] = 0
        corr[:, dead_b] = 0
        return corr.nan_to_num(0.0).clamp(-1, 1)


def probe_matrix(x: torch.Tensor, p: Probe, n: int) -> torch.Tensor:
    """Activations ``x`` at probe ``p`` as a (samples, n) matrix (block entries become extra samples)."""
    x = x.detach().movedim(p.dim, -1)
    x = x[..., p.offset : p.offset + n * p.block].reshape(*x.shape[:-1], n, p.block)
    return x.movedim(-1, -2).reshape(-1, n)


@contextmanager
def capture(model: nn.Module, probes: dict[str, tuple[Probe, ...]]):
    """Record, per (module, where), the input or output tensor of each probed module during forwards."""
    modules = dict(model.named_modules())
    store: dict[tuple[str, str], torch.Tensor] = {}
    handles = []
    wanted = {(p.module, p.where) for ps in probes.values() for p in ps}
    for name, where in wanted:
        if name not in modules:
            raise SpecError(f"probe module {name!r} not found in {type(model).__name__}")
        if where == "input":
            hook = lambda m, args, _n=name: store.__setitem__((_n, "input"), args[0])  # noqa: E731
            handles.append(modules[name].register_forward_pre_hook(hook))
        else:
            hook = lambda m, args, out, _n=name: store.__setitem__((_n, "output"), out)  # noqa: E731
            handles.append(modules[name].register_forward_hook(hook))
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


def activation_matching(
    spec: SymmetrySpec,
    model_a: nn.Module,
    model_b: nn.Module,
    loader: Iterable,
    *,
    max_batches: int | None = None,
) -> Alignment:
    """Align model B to model A by matching activations on ``loader``.

    Args:
        spec: from :func:`modeconn.symmetry_spec` (it records where each space is observed).
        model_a, model_b: the same architecture; run in eval mode under ``no_grad``; never modified
            (training flags restored, hooks removed).
        loader: iterable of batches ``x`` or ``(x, y, ...)``; ``x`` as the model takes it.
        max_batches: use only the first batches (default: the whole loader).
    Returns: :class:`Alignment` whose ``objective`` is the total matched correlation and ``stats`` hold
        per-space mean matched correlation, ``identity_ratio`` (objective of the identity permutation /
        optimal objective, per space: → 1 when the units are already aligned, the neuron-identifiability
        proxy), samples seen and timings.
    Raises: SpecError if a space has no probe (hand-written spec), StateDictMismatchError if the models
        do not fit the spec, DeviceMismatchError if they live on different devices, ConfigError for an
        empty loader or a bad ``max_batches`` (all before any forward pass).
    """
    if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1):
        raise ConfigError(f"max_batches must be a positive integer or None, got {max_batches!r}")
    continuous = {n: sp.group for n, sp in spec.spaces.items() if sp.group != "permutation"}
    if continuous:
        name, group = next(iter(continuous.items()))
        raise ConfigError(
            f"activation matching solves permutations only; {len(continuous)} space(s) have continuous groups "
            f"(e.g. {name!r}: {group}) — use weight_matching or dual_matching, or build the spec with "
            "permutation groups")
    start = time.perf_counter()
    spec.check_state_dict(model_a.state_dict(), "model A")
    spec.check_state_dict(model_b.state_dict(), "model B")
    check_one_device([model_a.state_dict(), model_b.state_dict()], ["model A", "model B"])
    missing = [s for s in spec.spaces if not spec.probes.get(s)]
    if missing:
        raise SpecError(
            f"spaces {missing} have no activation probes; build the spec with modeconn.symmetry_spec(model, x)"
        )
    device = model_device(model_a)
    stats = {(s, i): CorrelationStats(spec.spaces[s].size, device) for s in spec.spaces for i in range(len(spec.probes[s]))}
    batches = 0
    with eval_mode(model_a, model_b), torch.no_grad(), capture(model_a, spec.probes) as st_a, capture(
        model_b, spec.probes
    ) as st_b:
        for batch in loader:
            if max_batches is not None and batches >= max_batches:
                break
            x = batch_inputs(batch).to(device)
            model_a(x)
            model_b(x)
            for s, probes in spec.probes.items():
                n = spec.spaces[s].size
                for i, p in enumerate(probes):
                    key = (p.module, p.where)
                    stats[(s, i)].update(probe_matrix(st_a[key], p, n), probe_matrix(st_b[key], p, n))
            batches += 1
    if batches == 0:
        raise ConfigError("activation_matching got an empty loader")
    timer = LapTimer()
    element, objective, per_space, identity_ratio = {}, 0.0, {}, {}
    for s in spec.spaces:
        corr = sum(stats[(s, i)].correlation() for i in range(len(spec.probes[s])))
        perm = solve_lap(corr, s, timer)
        matched = float(corr[torch.arange(len(perm)), perm.to(corr.device)].sum())
        element[s] = perm
        objective += matched
        per_space[s] = matched / (len(perm) * len(spec.probes[s]))
        identity_ratio[s] = float(corr.diagonal().sum()) / matched if matched > 0 else None
    return Alignment(
        method="activation",
        spec=spec,
        element=element,
        objective=objective,
        history=[[objective]],
        stats={
            "mean_matched_correlation": per_space,
            "identity_ratio": identity_ratio,
            "batches": batches,
            "seconds": time.perf_counter() - start,
            "lap_seconds": timer.seconds,
        },
    )
