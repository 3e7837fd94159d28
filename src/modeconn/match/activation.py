"""Activation matching (Ainsworth et al. 2023 §3.1; Li et al. 2015; Jordan et al. 2023).

For every space, the Pearson cross-correlation between the units of model A and model B is accumulated
over a data loader (streaming sums in float64; each "sample" is one input position, so a conv feature
map contributes N·H·W samples), summed over the places the space is observed (its probes), and a LAP
picks the permutation of B's units maximising the total correlation. Units with zero variance (dead
ReLUs) get correlation 0 with everything, so no NaN ever reaches the LAP.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..checks import check_one_device
from ..config import StrictConfig
from ..errors import ConfigError, SpecError
from ..nn_utils import batch_inputs, eval_mode, model_device
from ..symmetry import Probe, SymmetrySpec
from .lap import LapTimer, solve_lap
from .options import PositiveInt
from .progress import reporter
from .result import Alignment


class CorrelationStats:
    """Streaming Pearson cross-correlation between two activation streams, (samples, n) and (samples, n_b)
    (``n_b`` defaults to ``n``; float64 sums)."""

    def __init__(self, n: int, device: torch.device, n_b: int | None = None) -> None:
        def z(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.float64, device=device)

        self.count = 0
        m = n if n_b is None else n_b
        self.sa, self.sb, self.saa, self.sbb, self.sab = z(n), z(m), z(n), z(m), z(n, m)

    def update(self, xa: torch.Tensor, xb: torch.Tensor) -> None:
        """Add samples: ``xa``, ``xb`` of shape (samples, n)."""
        xa, xb = xa.double(), xb.double()
        self.count += xa.shape[0]
        self.sa += xa.sum(0)
        self.sb += xb.sum(0)
        self.saa += (xa * xa).sum(0)
        self.sbb += (xb * xb).sum(0)
        self.sab += xa.T @ xb

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mean A, mean B, std A, std B)`` per unit."""
        c = max(self.count, 1)
        ma, mb = self.sa / c, self.sb / c
        va = (self.saa / c - ma * ma).clamp_min(0)
        vb = (self.sbb / c - mb * mb).clamp_min(0)
        return ma, mb, va.sqrt(), vb.sqrt()

    def constant_units(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dead_a, dead_b)``: (n,) bool masks of the units that are constant over the samples (no variance: their
        correlation with anything is 0/0)."""
        ma, mb, sa, sb = self._moments()
        return sa <= 1e-12 * (1 + ma.abs()), sb <= 1e-12 * (1 + mb.abs())

    def equal_constants(self) -> torch.Tensor:
        """(n, n_b) bool: A's unit i and B's unit j are both constant over the samples, with the same value (to
        ``1e-6`` relative): interchangeable on these samples, though their correlation is 0/0."""
        ma, mb, _, _ = self._moments()
        dead_a, dead_b = self.constant_units()
        same = (ma[:, None] - mb[None, :]).abs() <= 1e-6 * (1 + ma.abs()[:, None])
        return dead_a[:, None] & dead_b[None, :] & same

    def correlation(self) -> torch.Tensor:
        """(n, n_b) Pearson correlation corr[i, j] of A's unit i with B's unit j; 0 where a unit is dead
        (:meth:`constant_units`)."""
        c = max(self.count, 1)
        ma, mb, sa, sb = self._moments()
        cov = self.sab / c - torch.outer(ma, mb)
        dead_a, dead_b = self.constant_units()
        corr = cov / (torch.outer(sa, sb).clamp_min(1e-300))
        corr[dead_a, :] = 0
        corr[:, dead_b] = 0
        return corr.nan_to_num(0.0).clamp(-1, 1)


def probe_matrix(x: torch.Tensor, p: Probe, n: int) -> torch.Tensor:
    """Activations ``x`` at probe ``p`` as a (samples, n) matrix (block entries become extra samples)."""
    x = x.detach().movedim(p.dim, -1)
    x = x[..., p.offset : p.offset + n * p.block].reshape(*x.shape[:-1], n, p.block)
    return x.movedim(-1, -2).reshape(-1, n)


def _pre_hook(store: dict, name: str) -> Callable:
    def hook(module, args):
        store[(name, "input")] = args[0]
    return hook


def _hook(store: dict, name: str) -> Callable:
    def hook(module, args, out):
        store[(name, "output")] = out
    return hook


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
            handles.append(modules[name].register_forward_pre_hook(_pre_hook(store, name)))
        else:
            handles.append(modules[name].register_forward_hook(_hook(store, name)))
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


class ActivationMatchingConfig(StrictConfig):
    """Options of :func:`activation_matching` (bad values: ConfigError naming the field, before any forward pass).

    Attributes:
        max_batches: use only the first batches of the loader (≥ 1; default None: the whole loader).
    """

    max_batches: PositiveInt | None = None


def activation_matching(
    spec: SymmetrySpec,
    model_a: nn.Module,
    model_b: nn.Module,
    loader: Iterable,
    config: ActivationMatchingConfig | Mapping[str, Any] | None = None,
    *,
    progress: Callable[..., None] | bool = True,
    **options: Any,
) -> Alignment:
    """Align model B to model A by matching activations on ``loader``.

    Args:
        spec: from :func:`modeconn.symmetry_spec` (it records where each space is observed).
        model_a, model_b: the same architecture; run in eval mode under ``no_grad``; never modified
            (training flags restored, hooks removed).
        loader: iterable of batches ``x`` or ``(x, y, ...)``; ``x`` as the model takes it.
        config, options: an :class:`ActivationMatchingConfig` (or a dict of its fields) and keyword overrides:
            ``max_batches``.
        progress: ``progress("activation statistics", batches, total)`` after every batch (``total``: max_batches,
            else the loader's length when it has one, else None) and ``progress("assignment", spaces, total)``
            after every LAP (:mod:`modeconn.match.progress`); True (default): a tqdm bar on stderr; False: silent.
    Returns: :class:`Alignment` (``objective_sense="maximize"``) whose ``objective`` is the total matched
        correlation and ``stats`` hold per-space mean matched correlation, ``identity_ratio`` (objective of the
        identity permutation / optimal objective, per space: → 1 when the units are already aligned, the
        neuron-identifiability proxy), samples seen and timings.
    Raises: SpecError if a space has no probe (hand-written spec), StateDictMismatchError if the models
        do not fit the spec, DeviceMismatchError if they live on different devices, ConfigError for an
        empty loader, a bad ``max_batches`` or a spec with continuous groups (all before any forward pass).
    """
    cfg = ActivationMatchingConfig.from_any(config, **options)  # bad values fail here, before any work
    start = time.perf_counter()
    _check_inputs(spec, model_a, model_b)
    tick = reporter(progress)
    stats, batches = _correlations(spec, model_a, model_b, loader, cfg.max_batches, tick)
    element, objective, extra = _assign(spec, stats, tick)
    return Alignment(
        method="activation",
        spec=spec,
        element=element,
        objective=objective,
        history=[[objective]],
        stats={**extra, "batches": batches, "seconds": time.perf_counter() - start},
        objective_sense="maximize",
    )


def _check_inputs(spec: SymmetrySpec, model_a: nn.Module, model_b: nn.Module) -> None:
    """Permutation groups only, models fitting the spec on one device, a probe for every space."""
    continuous = {n: sp.group for n, sp in spec.spaces.items() if not spec.group_of(n).exact}
    if continuous:
        name, group = next(iter(continuous.items()))
        raise ConfigError(
            f"activation matching solves permutations only; {len(continuous)} space(s) have continuous groups "
            f"(e.g. {name!r}: {group}) — use weight_matching or dual_matching, or build the spec with "
            "permutation groups")
    spec.check_state_dict(model_a.state_dict(), "model A")
    spec.check_state_dict(model_b.state_dict(), "model B")
    check_one_device([model_a.state_dict(), model_b.state_dict()], ["model A", "model B"])
    missing = [s for s in spec.spaces if not spec.probes.get(s)]
    if missing:
        raise SpecError(
            f"spaces {missing} have no activation probes; build the spec with modeconn.symmetry_spec(model, x)"
        )


def paired_probe_activations(spec: SymmetrySpec, model_a: nn.Module, model_b: nn.Module, loader: Iterable,
                             max_batches: int | None = None, spec_b: SymmetrySpec | None = None,
                             ) -> Iterator[dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]]:
    """One pass of both models over ``loader`` (at most ``max_batches`` batches; eval mode, no grad): per batch,
    ``{(space, probe index): (A's activations, B's)}``, each ``(rows, n)`` with the space's ``n`` units as columns
    (:func:`probe_matrix`). ``spec_b``: B's own spec where B has other widths (the same spaces and probes by name;
    default ``spec``). The models' train/eval flags are restored when the iteration ends."""
    spec_b = spec if spec_b is None else spec_b
    device = model_device(model_a)
    batches = 0
    with eval_mode(model_a, model_b), torch.no_grad(), capture(model_a, spec.probes) as st_a, capture(
        model_b, spec_b.probes
    ) as st_b:
        for batch in loader:
            if max_batches is not None and batches >= max_batches:
                break
            x = batch_inputs(batch).to(device)
            model_a(x)
            model_b(x)
            yield {(s, i): (probe_matrix(st_a[(p.module, p.where)], p, spec.spaces[s].size),
                            probe_matrix(st_b[(q.module, q.where)], q, spec_b.spaces[s].size))
                   for s, probes in spec.probes.items() for i, (p, q) in enumerate(zip(probes, spec_b.probes[s],
                                                                                       strict=True))}
            batches += 1


def _correlations(spec: SymmetrySpec, model_a: nn.Module, model_b: nn.Module, loader: Iterable,
                  max_batches: int | None, tick) -> tuple[dict[tuple[str, int], CorrelationStats], int]:
    """Streaming correlation statistics per (space, probe) over the loader's batches, and the batches seen."""
    device = model_device(model_a)
    stats = {(s, i): CorrelationStats(spec.spaces[s].size, device) for s in spec.spaces for i in range(len(spec.probes[s]))}
    total = max_batches if max_batches is not None else (len(loader) if hasattr(loader, "__len__") else None)
    batches = 0
    for pairs in paired_probe_activations(spec, model_a, model_b, loader, max_batches):
        for key, (xa, xb) in pairs.items():
            stats[key].update(xa, xb)
        batches += 1
        tick("activation statistics", batches, total)
    if batches == 0:
        raise ConfigError("activation_matching got an empty loader")
    return stats, batches


def _assign(spec: SymmetrySpec, stats: dict[tuple[str, int], CorrelationStats], tick):
    """Per space the LAP on the summed probe correlations: (element, objective, stats)."""
    timer = LapTimer()
    element, objective, per_space, identity_ratio = {}, 0.0, {}, {}
    for j, s in enumerate(spec.spaces):
        corr = sum(stats[(s, i)].correlation() for i in range(len(spec.probes[s])))
        perm = solve_lap(corr, s, timer)
        matched = float(corr[torch.arange(len(perm)), perm.to(corr.device)].sum())
        element[s] = perm
        objective += matched
        per_space[s] = matched / (len(perm) * len(spec.probes[s]))
        identity_ratio[s] = float(corr.diagonal().sum()) / matched if matched > 0 else None
        tick("assignment", j + 1, len(spec.spaces))
    extra = {"mean_matched_correlation": per_space, "identity_ratio": identity_ratio, "lap_seconds": timer.seconds}
    return element, objective, extra
