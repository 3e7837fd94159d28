"""Weight matching (git-re-basin, Ainsworth et al. 2023, Alg. 1) with restarts.

Maximise ``J(g) = Σ_k ⟨θ_A[k], (g·θ_B)[k]⟩`` over the spec's group by coordinate descent: for one space at a time,
with every other space fixed, the optimal element solves a LAP on the (n × n) score ``S = Σ_{(k, axis) on the space}
A_k^{(axis)} · (B_k with the other spaces applied)^{(axis)ᵀ}``, where ``X^{(axis)}`` moves ``axis`` to the front and
flattens the rest (n rows, one per unit). Sweeps repeat until a sweep changes no element or its relative gain falls
below ``rtol``; a space whose score reads only elements unchanged since its last LAP is not solved again (same score,
same solution). In memory the terms of a score are kept between LAP steps, and updated by a low-rank product when a
neighbouring permutation moved a few units (:mod:`modeconn.match.score_terms`). On a space some tensor binds twice
the LAP score is a linearisation of ``J``; its solution is taken only when ``J`` rises, so ``J`` never falls within a
run. The first run starts from a *greedy data-flow* element: spaces in spec order (the traced data-flow order), each
matched on the terms of the tensors whose other axes are all on spaces already matched (writers and readers; its
writers when there are none), with the spaces before it applied (layer-wise matching, as in Singh & Jaggi 2020); on
independently trained or initialised nets it reaches a clearly better optimum than starting from the identity, so one
run is the default. Coordinate descent can stall in local optima (residual nets), so ``restarts > 1`` runs more and
keeps the best objective — until one fails to beat the best by ``restart_rtol`` (relative), or ``restarts`` runs.
Later runs start from *kicks* of the best element so far (iterated local search: a quarter of one permutation space's
units shuffled, see :meth:`_Problem.kick`), which return to the same optimum in a few sweeps of the kicked space's
neighbourhood when there is nothing better nearby — ``restart_init="perturb"``, the default — or from scratch
(``"scratch"``): the second run at the identity with the orders of a first run of the same seed, exactly the plain
git re-basin run (:mod:`modeconn.match.reference`), so that the result is never worse than it, the others at random
elements. ``J`` is bounded by ``‖θ_A‖·‖θ_B‖`` (Cauchy–Schwarz), reached exactly when ``g·θ_B = θ_A``; restarts stop
early once it is reached.

*Continuous groups and heads* (METHODS.md §0/§3, Theus et al. 2025). In general WM minimises the distance
``D(g) = Σ_k ‖θ_A[k] − (g·θ_B)[k]‖²`` and reports ``J̃(g) = J(g) − ½(‖g·θ_B‖² − ‖θ_B‖²) = ½(‖θ_A‖² + ‖θ_B‖² −
D(g))``. When every space is *isometric* (permutation, orthogonal, head_orthogonal) ``‖g·θ_B‖ = ‖θ_B‖`` and
``J̃ = J``: the objective, bound and code path above are unchanged. Otherwise the bound is
``½(‖θ_A‖² + ‖θ_B‖²)`` (reached iff ``g·θ_B = θ_A``). Per space (others fixed), with the statistics and solvers
of :mod:`modeconn.match.solvers`:

* ``permutation`` (no children): the LAP above (exact minimiser of ``D``);
* ``orthogonal``: Procrustes on the same cross-covariance ``S`` the LAP uses (exact);
* ``invertible``, ``scaling``, ``head_*`` without a parent: per unit (the whole space for ``invertible``)
  the best closed-form candidate by exact ``D`` (least-squares surrogate, orthogonal, scaled orthogonal;
  :func:`modeconn.match.solvers.solve`), kept per unit only where it lowers ``D``;
* a permutation with children (heads with per-head QK/OV transforms; FFN units with scalings) is solved
  jointly, two-level: for every pair (unit ``i`` of A, unit ``j`` of B) the best child transforms and the
  resulting ``D_ij`` (children's terms plus the parent's terms no child covers), then a LAP over
  ``−D_ij`` picks the permutation and each unit keeps its pair's transforms; kept if ``D`` decreases.

The greedy start applies the same solvers to the terms already exact (those whose other spaces are matched). Planted
elements of every group are recovered exactly (up to fp32 error): ``S`` vanishes at the planted element and the
solvers return its zero.

*Streaming* (checkpoints larger than memory): :mod:`modeconn.match.weight_stream`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

import torch
from pydantic import ConfigDict, Field, field_validator

from ..checks import check_compatible, check_finite, check_one_device
from ..config import StrictConfig
from .._util.device import is_cpu, resolve_device
from ..errors import ConfigError, DeviceMismatchError
from ..io.lazy import is_lazy
from ..symmetry import AxisBinding, Element, SymmetrySpec
from . import solvers
from .lap import LapTimer, lap_method, solve_lap
from .options import Int, PositiveInt, Real
from .progress import tqdm_progress
from .score_terms import ScoreTerms, assignment_score, unit_matrix
from .result import Alignment
from .weight_stream import _Float32, _Stream

StateDict = Mapping[str, torch.Tensor]
Progress = Callable[..., None]
"""``progress(stage, done, total)``: e.g. ``("run 1/4 sweep 2", 17, 40)`` after the 17th of 40 spaces (the one
progress protocol, :mod:`modeconn.match.progress`; weight matching passes no metrics)."""


KICK_FRACTION = 0.25
"""Share of a permutation space's units a restart's kick shuffles (``restart_init="perturb"``)."""


def _shuffle_some(perm: torch.Tensor, fraction: float, gen: torch.Generator) -> torch.Tensor:
    """``perm`` (n ≥ 2) with ``m = ⌈fraction·n⌉`` (at least 2) random entries moved along one random m-cycle, so that
    each of them changes (a new tensor)."""
    n = perm.numel()
    m = min(n, max(2, math.ceil(fraction * n)))
    picked = torch.randperm(n, generator=gen)[:m].to(perm.device)
    out = perm.clone()
    out[picked] = perm[picked.roll(1)]
    return out


def scored_keys(spec: SymmetrySpec, sd: StateDict) -> list[str]:
    """The tensors weight matching scores by default: every floating tensor bound to a space except the spec's
    ``buffers``. Buffers (BatchNorm running statistics) are data statistics, not weights — git re-basin matches
    parameters only (Ainsworth et al. 2023) — and move with the element anyway; scored, a running variance (positive,
    and large next to the weights) adds a near rank-one term that can dominate the score, so that the matching sorts
    channels by their variance instead of their weights. ``sd``: a state dict, or a view with the same keys and
    dtypes (meta tensors)."""
    return [k for k, binds in spec.tensors.items() if binds and k not in spec.buffers and sd[k].is_floating_point()]


class WeightMatchingConfig(StrictConfig):
    """Options of :func:`weight_matching` (unknown fields and bad values: ConfigError naming the field, before any
    work).

    Attributes:
        restarts: the most coordinate-descent runs (≥ 1; default 1: on trained pairs, kicks raise the objective by
            well under 1% when they raise it at all, and where spaces are coupled in a chain they take about as long
            again as the first run). The first starts at ``init``; each later one starts from a *kick*
            (``restart_init="perturb"``, default: the best element so far with :data:`KICK_FRACTION` of one random
            permutation space's units shuffled, or one continuous space re-drawn — iterated local search, Lourenço,
            Martin & Stützle 2003) or from scratch (``"scratch"``: the second at the identity with the first run's
            orders — the plain git re-basin run of the seed, so the result is never worse than that run —, the others
            at random elements; slower). The best objective is returned. Fewer runs happen when the objective reaches
            its upper bound, or (``restart_rtol``) when a run fails to beat the best.
        restart_rtol: stop the restarts once a run ``r ≥ 2`` ends at an objective that does not exceed the best of the
            runs before it by more than ``restart_rtol·|best|`` (≥ 0); ``None`` runs all ``restarts`` (up to the
            bound), as before this option existed.
        restart_init: how runs after the first start, ``"perturb"`` (default) or ``"scratch"`` (see ``restarts``).
        max_iter: the most sweeps over all spaces per run (≥ 1). A run ends earlier after a sweep that changes no
            element (nothing is left to gain: the next sweep would solve the same problems) or whose gain is below
            ``rtol``.
        rtol: a sweep that raises the objective by less than ``rtol·|J|`` ends the run, in [0, 1) (relative, so it
            behaves the same on small and billion-parameter models).
        seed: seeds the random orders, kicks and initial elements (same seed → same result).
        init: start of the first run: ``"greedy"`` (default, see the module docstring), ``"identity"`` or a group
            element (warm start; checked against the spec).
        keys: restrict the objective to these tensors (default: :func:`scored_keys` — every floating tensor bound to a
            space but the spec's ``buffers``, e.g. BatchNorm running statistics, which the element still moves).
        chunk: streaming only — elements per chunk of a tensor read, converted and multiplied at a time (≥ 1).
        device: where the score products run (``"cpu"``, ``"cuda"``, ``"cuda:1"`` …; checked by
            :func:`modeconn._util.device.resolve_device`, ConfigError naming ``device`` if it is not available).
            ``None`` (default): the state dicts' device, the CPU when streaming. In memory both models are copied
            there in fp32; streaming, each chunk is copied there for its product. The LAP solver follows
            :func:`modeconn.match.lap.lap_method` for the device; ``"cpu"`` computes exactly as ``None`` on CPU inputs.

    ``restart_rtol=None`` runs as many restarts from the same starts as before this option existed (runs after the
    second draw their orders and random starts from their own seeded generators).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    restarts: PositiveInt = 1
    restart_rtol: Annotated[Real, Field(ge=0)] | None = 1e-4
    restart_init: Literal["scratch", "perturb"] = "perturb"
    max_iter: PositiveInt = 100
    rtol: Annotated[Real, Field(ge=0, lt=1)] = 1e-9
    seed: Int = 0
    init: Any = "greedy"
    keys: list[str] | None = None
    chunk: PositiveInt = 1 << 20
    device: Any = None

    @field_validator("device", mode="before")
    @classmethod
    def _device_available(cls, v: Any) -> Any:
        dev = resolve_device(v, "device")
        return None if dev is None else str(dev)

    @field_validator("init", mode="before")
    @classmethod
    def _init_named_or_element(cls, v: Any) -> Any:
        if isinstance(v, str) and v in INITS:
            return v
        if isinstance(v, Mapping) and not isinstance(v, str):
            return dict(v)
        raise ValueError(f"init must be 'greedy', 'identity' or a group element, got {v!r}")


INITS = ("greedy", "identity")
DEFAULTS = WeightMatchingConfig()
"""The default options: the streaming entry points and the CLI read theirs here."""


def weight_matching(spec: SymmetrySpec, sd_a: StateDict, sd_b: StateDict,
                    config: WeightMatchingConfig | Mapping[str, Any] | None = None, *,
                    progress: Progress | bool | None = None, **options: Any) -> Alignment:
    """Align ``sd_b`` to ``sd_a`` by weight matching (module docstring; Ainsworth et al. 2023, Alg. 1, with restarts).

    Args:
        spec: the symmetry spec of the architecture (``modeconn.symmetry_spec``).
        sd_a, sd_b: state dicts of the same architecture; any float dtype (computed in fp32); one device. Either
            may be a :class:`~modeconn.io.lazy.LazyTensors` read tensor by tensor (a
            :class:`~modeconn.io.lazy.LazyCheckpoint`, or an :class:`~modeconn.symmetry.absorb_stream.AbsorbedView`):
            the match then *streams* on the CPU (module docstring) — peak memory is about the largest space's n×n score (fp32
            from 2048 units, fp64 below) plus a few ``chunk``-sized fp32 blocks, not the model size.
        config, options: a :class:`WeightMatchingConfig` (or a dict of its fields) and keyword overrides:
            ``restarts``, ``restart_rtol``, ``restart_init``, ``max_iter``, ``rtol``, ``seed``, ``init``, ``keys``,
            ``chunk``, ``device``.
        progress: called as ``progress(stage, done, total)`` after every space (``stage`` e.g. ``"run 1/4 sweep
            2"``; :mod:`modeconn.match.progress`); True: tqdm bars on stderr; None or False: silent.
    Returns: :class:`Alignment` (``objective_sense="maximize"``) with ``element`` (apply to B), ``objective`` (``J``,
        or ``J̃`` when a space is not isometric — see the module docstring), ``history`` (objective per sweep per
        run) and ``stats``: ``restarts_run``, ``restarts_stopped_by`` (``"bound"``, ``"no_gain"`` or
        ``"restarts"``), ``sweeps`` (= ``iterations``) per run, ``restart_objectives``, ``upper_bound``, ``seconds``,
        the LAP counts of :meth:`~modeconn.match.lap.LapTimer.stats` (``lap_seconds``, ``lap_calls``,
        ``lap_sparse_calls``, ``lap_certificate_failures``, ``lap_dense_fallbacks``), ``lap_skipped`` (LAP steps not
        needed: their score was unchanged), ``isometric``; ``streaming`` and ``chunk`` when streamed.
    Raises: ConfigError (bad option: restarts, max_iter, rtol, init, unknown keys, chunk), StateDictMismatchError,
        NonFiniteError, DeviceMismatchError (streaming: an in-memory partner off the CPU), SpecError (all before any
        LAP); CheckpointError if a lazy checkpoint's file changes while it is read.
    """
    cfg = WeightMatchingConfig.from_any(config, **options)  # typos and bad values fail here, before any work
    return _Run(spec, sd_a, sd_b, cfg, tqdm_progress() if progress is True else progress or None).run()


class _Run:
    """One weight-matching call: setup (checks, the :class:`_Problem`, the bound) → one step per restart → finish."""

    def __init__(self, spec: SymmetrySpec, sd_a: StateDict, sd_b: StateDict, cfg: WeightMatchingConfig,
                 progress: Progress | None) -> None:
        self.start_time = time.perf_counter()
        self.spec, self.cfg = spec, cfg
        unknown = [k for k in cfg.keys or () if k not in spec.tensors]
        if unknown:
            raise ConfigError(f"keys {unknown} are not tensors of the symmetry spec")
        self.streaming = is_lazy(sd_a) or is_lazy(sd_b)
        view_a = self._check_inputs(sd_a, sd_b)
        if not isinstance(cfg.init, str):
            spec.check_element(cfg.init)
        self.keys = cfg.keys if cfg.keys is not None else scored_keys(spec, view_a)
        self.problem, self.bound = self._problem(sd_a, sd_b)
        self.problem.progress = progress
        self.starts = [cfg.init, "identity"] if cfg.init != "identity" else ["identity"]
        self.best: tuple[float, Element] | None = None
        self.best_fixed = False  # whether the best run ended at a fixed point of the sweeps
        self.history: list[list[float]] = []

    def _check_inputs(self, sd_a: StateDict, sd_b: StateDict) -> dict[str, torch.Tensor]:
        """Shapes, compatibility and devices (no data read); sets ``self.device``; returns A's shapes and dtypes."""
        view_a, view_b = (_meta(sd_a), _meta(sd_b)) if self.streaming else (sd_a, sd_b)
        self.spec.check_state_dict(view_a, "state dict A")
        self.spec.check_state_dict(view_b, "state dict B")
        check_compatible([view_a, view_b], ["A", "B"])
        if not self.streaming:
            self.device = check_one_device([sd_a, sd_b], ["A", "B"])
            if self.cfg.device is not None:  # both copied there in fp32 by _problem
                self.device = torch.device(self.cfg.device)
            return view_a
        for sd, name in ((sd_a, "A"), (sd_b, "B")):
            if not is_lazy(sd) and check_one_device([sd], [name]).type != "cpu":
                raise DeviceMismatchError(f"streaming weight matching runs on the CPU; move state dict {name} there")
        self.device = torch.device("cpu")
        return view_a

    def _problem(self, sd_a: StateDict, sd_b: StateDict) -> tuple[_Problem, float]:
        """The problem over ``self.keys`` (fp32 in memory, or lazy) and the objective's upper bound."""
        keys = self.keys
        if self.streaming:
            dev = None if self.cfg.device is None else torch.device(self.cfg.device)
            stream = _Stream(self.spec, sd_a, sd_b, keys, self.cfg.chunk, None if is_cpu(dev) else dev)
            a_sq, b_sq = stream.squared_norms()  # one pass over A and B; NonFiniteError naming the tensor
            problem = _Problem(self.spec, _Float32(sd_a, keys), _Float32(sd_b, keys), stream)
        else:
            check_finite(sd_a, "A", keys)
            check_finite(sd_b, "B", keys)
            a = {k: sd_a[k].detach().to(self.device, torch.float32) for k in keys}
            b = {k: sd_b[k].detach().to(self.device, torch.float32) for k in keys}
            a_sq, b_sq = sum(t.norm() ** 2 for t in a.values()), sum(t.norm() ** 2 for t in b.values())
            problem = _Problem(self.spec, a, b)
        bound = float(a_sq ** 0.5 * b_sq ** 0.5) if problem.isometric else float(a_sq + b_sq) / 2
        return problem, bound

    def step(self, r: int) -> bool:
        """Run restart ``r`` (coordinate descent from its start); True when no further restart should run: the
        bound is reached, or (``restart_rtol``) run ``r ≥ 2`` did not beat the best of the runs before it."""
        cfg = self.cfg
        self.problem.run = f"run {r + 1}/{cfg.restarts}"
        # the first two runs draw their orders from ``seed`` itself: the identity run (second by default) is then
        # exactly the plain git re-basin run of that seed (reference.py), so the result is never worse than it
        self.gen = torch.Generator().manual_seed(cfg.seed if r < 2 else cfg.seed * 1_000_003 + r)
        start, dirty = self._start_of(r)
        self.problem.first_dirty = None
        g0 = self.problem.start(start, self.gen)  # the greedy start sets first_dirty itself
        if dirty is not None:
            self.problem.first_dirty = dirty
        self.problem.fixed_point = False
        g, hist = self.problem.coordinate_descent(g0, self.gen, cfg.max_iter, cfg.rtol)
        self.history.append(hist)
        prev = self.best[0] if self.best is not None else None
        if prev is None or hist[-1] > prev:
            self.best, self.best_fixed = (hist[-1], g), self.problem.fixed_point
        assert self.best is not None
        if self.best[0] >= self.bound * (1 - 1e-6):
            self.stopped = "bound"
            return True
        if prev is not None and cfg.restart_rtol is not None and hist[-1] <= prev + cfg.restart_rtol * abs(prev):
            self.stopped = "no_gain"
            return True
        return False

    def _start_of(self, r: int) -> tuple[Element | str, set[str] | None]:
        """The start of run ``r`` — ``init``; then a kick of the best element, or the identity and random elements —
        and the spaces to solve first (None: all). A kick of a fixed point of the sweeps (a run that ended with a
        sweep changing nothing) leaves every LAP solution in place except the kicked spaces' and their dependents'."""
        if r == 0:
            return self.starts[0], None
        if self.cfg.restart_init == "perturb":
            assert self.best is not None
            g, kicked = self.problem.kick(self.best[1], self.gen)
            return g, (set(kicked).union(*(self.problem.dependents[s] for s in kicked)) if self.best_fixed else None)
        return (self.starts[r] if r < len(self.starts) else "random"), None

    def run(self) -> Alignment:
        self.stopped = "restarts"
        for r in range(self.cfg.restarts):
            if self.step(r):
                break
        return self.finish()

    def finish(self) -> Alignment:
        assert self.best is not None
        history, problem = self.history, self.problem
        return Alignment(
            method="weight",
            spec=self.spec,
            element={s: p.cpu() for s, p in self.best[1].items()},
            objective=self.best[0],
            history=history,
            stats={
                "iterations": [len(h) - 1 for h in history],
                "sweeps": [len(h) - 1 for h in history],
                "restarts_run": len(history),
                "restarts_stopped_by": self.stopped,
                "restart_objectives": [h[-1] for h in history],
                "upper_bound": self.bound,
                "seconds": time.perf_counter() - self.start_time,
                **problem.timer.stats(),
                "lap_skipped": problem.skipped,
                **(problem.score_terms.stats() if problem.score_terms is not None else {}),
                "isometric": problem.isometric,
                **({"streaming": True, "chunk": self.cfg.chunk} if self.streaming else {}),
            },
            objective_sense="maximize",
        )


def _meta(sd: StateDict) -> dict[str, torch.Tensor]:
    """Shapes and dtypes of a (lazy) state dict as meta tensors, for the checks that read no data."""
    return sd.meta() if is_lazy(sd) else {k: t.detach().to("meta") for k, t in sd.items()}


class _Problem:
    """The weight-matching problem for fixed A and B: fp32 tensors in memory, or — with ``stream`` — lazy tensors
    read when needed (``a``/``b`` then load fp32 tensors on access, for :meth:`solve_block`; everything else goes
    through the :class:`_Stream`)."""

    def __init__(self, spec: SymmetrySpec, a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
                 stream: _Stream | None = None) -> None:
        self.spec, self.a, self.b, self.stream = spec, a, b, stream
        self.timer = LapTimer()
        self.progress: Progress | None = None
        self.run = ""
        # (tensor, binding, A unit matrix); streaming: the unit matrix is formed when needed (None here)
        self.terms = {
            s: [(k, bd, unit_matrix(a[k], bd, spec.spaces[s].size) if stream is None else None)
                for k, bd in spec.bindings_by_space[s] if k in a]
            for s in spec.spaces
        }
        self.groups = solvers.groups_of(spec)  # SpecError naming a space whose group has no solver
        # spaces solved by the plain LAP path (git re-basin); everything else goes through ``solve_block``
        self.plain = {s for s in spec.spaces if solvers.is_assignment(self.groups[s]) and not spec.children[s]}
        self.isometric = all(gr.isometric for gr in self.groups.values())
        # plain spaces whose LAP score gain is the objective's exact change: no tensor binds them twice
        self.exact_gain = {s for s in self.plain if all(sum(b.space == s for b in spec.tensors[k]) == 1
                                                         for k, _ in spec.bindings_by_space[s])}
        if self.isometric:
            self.half_b_sq = 0.0
        elif stream is not None:
            self.half_b_sq = stream.b_sq / 2
        else:
            self.half_b_sq = float(sum((t.double() ** 2).sum() for t in b.values())) / 2
        self.dependents = self._dependents()
        self.score_terms = ScoreTerms(spec, a, b) if stream is None else None
        self.skipped = 0  # LAP steps skipped because their score could not have changed
        self.first_dirty: set[str] | None = None
        self.fixed_point = False

    def _dependents(self) -> dict[str, set[str]]:
        """``{t: spaces whose solve reads t's element}``: plain space ``s`` reads the elements of every space bound to
        one of its tensors other than through the binding being scored (``s`` itself when a tensor binds it twice)."""
        out: dict[str, set[str]] = {t: set() for t in self.spec.spaces}
        for s, terms in self.terms.items():
            for k, bd, _ in terms:
                for b in self.spec.tensors[k]:
                    if b is not bd:
                        out[b.space].add(s)
        return out

    def _lap(self, score: torch.Tensor, space: str, hint: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`solve_lap` of ``score`` by the solver :func:`lap_method` picks for the device it was computed on."""
        method = lap_method(score.device, score.shape[0])
        return solve_lap(score, space, self.timer, method=method, hint=hint)

    def _amat(self, k: str, bd: AxisBinding, a_mat: torch.Tensor | None) -> torch.Tensor:
        """The A unit matrix of a term: precomputed in memory; streaming: read (fp32) now."""
        return a_mat if a_mat is not None else unit_matrix(self.a[k], bd, self.spec.spaces[bd.space].size)

    def _tick(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(f"{self.run} {stage}".strip(), done, total)

    def score(self, s: str, g: Element, terms: list | None = None) -> torch.Tensor:
        """The (n, n) LAP score of plain space ``s`` with every other space at ``g``, summed over ``terms``
        (default: all of the space's terms). In memory fp32; streaming accumulated in fp32 per chunk, fp64 where the
        dense LAP solver reads it (:meth:`_Stream.score`)."""
        n = self.spec.spaces[s].size
        terms = self.terms[s] if terms is None else terms
        if self.stream is not None:
            return self.stream.score(terms, g, n)
        total = None
        for k, bd, a_mat in terms:
            term = self.score_terms.term(k, bd, a_mat, g, n)
            total = term if total is None else total + term
        return total if total is not None else torch.zeros(n, n)

    def start(self, how: Element | str, gen: torch.Generator) -> Element:
        """The initial element of one run: a given element, ``greedy``, ``identity`` or ``random``."""
        if not isinstance(how, str):
            return dict(how)
        if how == "greedy":
            return self.greedy()
        return self.spec.identity() if how == "identity" else self.spec.random_element(gen)

    def greedy(self) -> Element:
        """Layer-wise matching in spec order on the terms that are already exact: those of tensors whose other
        bindings are all on spaces matched before (writers and readers alike: a block's second conv reads its hidden
        space and writes the stream matched before it).

        A term that reads a space not matched yet (e.g. the second Linear of a residual block, which writes the
        stream but reads the block's hidden space) only adds noise to the score, enough to pick a wrong stream
        permutation on small nets; when a space has no exact term, its writers (output-side tensors) are used.
        Continuous spaces and parent permutations with their children use :meth:`solve_block` on the same
        choice of terms (children are solved with their parent, where the first of them comes in spec order).

        A plain space solved on all of its terms holds the LAP solution of the score coordinate descent would form
        next (the spaces it reads were matched before it and keep their elements), so it is left out of the first
        sweep's solves (:attr:`first_dirty`) until a space it reads changes.
        """
        g = self.spec.identity()
        done: set[str] = set()
        complete: set[str] = set()
        for i, s in enumerate(self.spec.spaces):
            self._tick("greedy start", i, len(self.spec.spaces))
            if s not in self.plain:
                root = self.spec.spaces[s].parent or s
                if root not in done:
                    self.solve_block(root, g, greedy_done=done)
                    done.update((root, *self.spec.children[root]))
                continue
            ready = [(k, bd, a_mat) for k, bd, a_mat in self.terms[s]
                     if all(b.space in done for b in self.spec.tensors[k] if b is not bd)]
            terms = ready or [(k, bd, a_mat) for k, bd, a_mat in self.terms[s] if bd.side == "out"]
            if terms:
                g[s] = self._lap(self.score(s, g, terms), s)
                if len(ready) == len(self.terms[s]):
                    complete.add(s)
            done.add(s)
        self._tick("greedy start", len(self.spec.spaces), len(self.spec.spaces))
        self.first_dirty = set(self.spec.spaces) - complete
        return g

    def objective(self, g: Element) -> float:
        if self.stream is not None:
            return self.stream.objective(g, self.isometric, self.half_b_sq)
        if self.isometric:
            return float(sum(self._share(k, g) for k in self.a))
        total, cache = self.half_b_sq, {}
        for k in self.a:
            gb = self.spec.apply_tensor(k, self.b[k], g, cache=cache).double()
            total += float((self.a[k].double() * gb).sum() - (gb * gb).sum() / 2)
        return total

    def _share(self, k: str, g: Element) -> float:
        """``⟨A_k, (g·B)_k⟩`` (in memory): read off a kept score term where one holds it, else formed."""
        kept = self.score_terms.contribution(k, g)
        if kept is not None:
            return kept
        return float(torch.vdot(self.a[k].reshape(-1), self.spec.apply_tensor(k, self.b[k], g).reshape(-1)))

    def kick(self, best: Element, gen: torch.Generator) -> tuple[Element, tuple[str, ...]]:
        """``best`` perturbed on one random space without parent: the perturbation of iterated local search
        (Lourenço, Martin & Stützle 2003) — a restart near the best optimum so far, which converges in few sweeps when
        there is nothing better nearby. A permutation space without children has a random :data:`KICK_FRACTION` of
        its units shuffled among themselves; any other root (a continuous group, or a permutation with per-unit
        children) and its children are re-drawn at random. Returns it and the perturbed spaces."""
        roots = [s for s, sp in self.spec.spaces.items() if sp.parent is None]
        root = roots[int(torch.randint(len(roots), (), generator=gen))]
        g, kicked = dict(best), (root, *self.spec.children[root])
        if root in self.plain and self.spec.spaces[root].size > 1:
            g[root] = _shuffle_some(best[root], KICK_FRACTION, gen)
            return g, kicked
        for s in kicked:
            g[s] = self.spec.group_of(s).random(self.spec.spaces[s].size, gen)
        return g, kicked

    def coordinate_descent(self, g: Element, gen: torch.Generator, max_iter: int,
                           rtol: float) -> tuple[Element, list[float]]:
        """Sweeps over the spaces in random order from ``g``; ``(g, objective after every sweep)``. Reads
        ``first_dirty`` (the plain spaces whose LAP solution may differ from their element in ``g``; None: all; reset
        to None) and sets ``fixed_point`` (whether the last sweep changed nothing).

        A plain space whose score reads only elements unchanged since its last LAP is not solved again (the same
        score gives the same LAP solution, which was already taken or refused), and a sweep in which no element
        changes ends the run with the objective unchanged (appended without recomputing it). Otherwise a run ends
        after ``max_iter`` sweeps or a sweep gaining less than ``rtol·|J|``.

        A sweep of LAP steps only adds their gains to the objective instead of recomputing it (:meth:`lap_step`: each
        gain is J's exact change); the run's last entries are then replaced by one full computation, so the objective
        a run reports is never a running sum."""
        spaces = list(self.spec.spaces)
        hist = [self.objective(g)]
        dirty = set(spaces) if self.first_dirty is None else set(self.first_dirty)
        self.first_dirty = None
        changed, summed = True, False
        for it in range(max_iter):
            changed, gain = False, 0.0
            for j, i in enumerate(torch.randperm(len(spaces), generator=gen).tolist()):
                self._tick(f"sweep {it + 1}", j, len(spaces))
                moved, d = self._visit(spaces[i], g, dirty)
                changed |= moved
                gain = None if gain is None or d is None else gain + d
            self._tick(f"sweep {it + 1}", len(spaces), len(spaces))
            if not changed:
                hist.append(hist[-1])
                break
            summed = gain is not None
            hist.append(hist[-1] + gain if summed else self.objective(g))
            if hist[-1] - hist[-2] <= rtol * max(abs(hist[-2]), 1e-30):
                break
        if summed:  # the element's objective, computed: the last sweep's entry (and its unchanged copy)
            exact = self.objective(g)
            hist[-1] = exact
            if not changed:
                hist[-2] = exact
        self.fixed_point = not changed
        return g, hist

    def _visit(self, s: str, g: Element, dirty: set[str]) -> tuple[bool, float | None]:
        """Solve space ``s`` (its block, for a continuous space or a parent) in place in ``g``: whether an element
        changed, and the objective's gain when it is known exactly (0.0 when nothing changed; None after a block
        solve that changed an element). Updates ``dirty``, the plain spaces whose score
        may have changed since their last solve."""
        gain: float | None = 0.0
        if s not in self.plain:
            if self.spec.spaces[s].parent is not None:  # children are solved with their parent
                return False, 0.0
            members = (s, *self.spec.children[s])
            before = [g[m] for m in members]
            self.solve_block(s, g)
            moved = [m for m, old in zip(members, before, strict=True) if g[m] is not old]
            gain = None if moved else 0.0
        else:
            if s not in dirty:
                self.skipped += 1
                return False, 0.0
            dirty.discard(s)
            new, gain = self.lap_step(s, g)
            moved = [s] if new is not g[s] else []
            g[s] = new
        for m in moved:
            dirty.update(self.dependents[m])
        return bool(moved), gain

    def lap_step(self, s: str, g: Element) -> tuple[torch.Tensor, float]:
        """The LAP solution for plain space ``s`` (others at ``g``) and J's gain over ``g[s]`` if positive, else
        ``(g[s], 0.0)``. Where no tensor binds ``s`` twice the gain is the score's (``J = Σ_i S_s[i, g_s(i)] + terms
        without s``, exactly). Otherwise the score is a linearisation — a twice-bound tensor's other binding is held at
        ``g[s]`` — so J's change is computed on the tensors bound to ``s`` (:meth:`local_objective`) and the solution
        is refused unless J rises: coordinate descent never lowers J. A method of its own so that the n×n score is
        freed before the next space allocates its own."""
        score = self.score(s, g)
        new = self._lap(score, s, hint=g[s])
        gain = assignment_score(score, new) - assignment_score(score, g[s])
        del score
        if gain > 0 and s not in self.exact_gain:
            gain = self.local_objective(s, g | {s: new}) - self.local_objective(s, g)
        return (new, gain) if gain > 0 else (g[s], 0.0)

    def local_objective(self, s: str, g: Element) -> float:
        """``Σ_k ⟨A_k, (g·B)_k⟩`` in fp64 over the tensors bound to space ``s``: the part of J that ``g[s]`` changes
        (``‖g·B_k‖`` does not depend on a permutation, so the non-isometric J changes by as much)."""
        keys = dict.fromkeys(k for k, _ in self.spec.bindings_by_space[s] if k in self.a)
        return float(sum(torch.vdot(self.a[k].reshape(-1).double(), self.spec.apply_tensor(k, self.b[k], g).reshape(-1).double())
                         for k in keys))

    # ------------------------------------------------------------------ continuous spaces and parents
    def _views(self, s: str, mat: torch.Tensor) -> torch.Tensor:
        """A unit matrix (n, m) as the (batch, d, m) stack the solvers act on."""
        group, n = self.groups[s], self.spec.spaces[s].size
        if not group.unitwise:
            return mat[None]
        return mat.reshape(n, getattr(group, "dim", 1), -1)

    def _blocks(self, s: str, el: torch.Tensor) -> torch.Tensor:
        """An element as (batch, d, d) fp64 matrices."""
        group = self.groups[s]
        if hasattr(group, "matrices"):  # a discrete unit-wise group (block_permutation): its one-hot matrices
            return group.matrices(el.to(self.device_of()))
        el = el.to(self.device_of(), torch.float64)
        if not group.unitwise:
            return el[None]
        return el[:, None, None] if el.dim() == 1 else el

    def _element(self, s: str, m: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        group = self.groups[s]
        if hasattr(group, "from_matrices"):
            return group.from_matrices(m).to(like.device)
        if not group.unitwise:
            m = m[0]
        elif m.shape[-1] == 1 and like.dim() == 1:
            m = m[..., 0, 0]
        return m.to(like.device, torch.float32 if like.dtype != torch.float64 else like.dtype)

    def device_of(self) -> torch.device:
        if self.stream is not None or not self.a:
            return torch.device("cpu")
        return next(iter(self.a.values())).device

    def _terms_for(self, s: str, members: set[str], greedy_done: set[str] | None):
        """(tensor, binding, A unit matrix) of space ``s``; for the greedy start only the terms whose other
        bindings (outside the block ``members``) are on spaces already matched — writers and readers alike,
        since a continuous transform fitted on writers alone can be near-singular for the readers — or, when
        there are none, the writers."""
        terms = self.terms[s]
        if greedy_done is None:
            return terms
        ready = [t for t in terms
                 if all(b.space in greedy_done for b in self.spec.tensors[t[0]] if b.space not in members)]
        return ready or [t for t in terms if t[1].side == "out"]

    def _stats(self, s: str, terms, b_of, pairs: bool) -> solvers.Stats | None:
        """Statistics of ``s``'s terms against B (``b_of(key)``: B with the other spaces applied). For
        isometric groups only the cross terms ``K`` (the Gram matrices only add constants to ``D``)."""
        n = self.spec.spaces[s].size
        grams = not self.groups[s].isometric
        acc: dict[str, torch.Tensor] = {}

        def add(name, x):
            acc[name] = x if name not in acc else acc[name] + x

        for k, bd, a_mat in terms:
            x = self._views(s, self._amat(k, bd, a_mat))
            y = self._views(s, unit_matrix(b_of(k), bd, n))
            if pairs:
                bsz, d, m = x.shape
                kk = (x.reshape(bsz * d, m) @ y.reshape(bsz * d, m).T).reshape(bsz, d, bsz, d).permute(0, 2, 1, 3)
            else:
                kk = x @ y.transpose(-1, -2)
            add("k_out" if bd.side == "out" else "k_in", kk)
            if grams:
                add("yy_out" if bd.side == "out" else "yy_in", y @ y.transpose(-1, -2))
                if bd.side == "in":
                    add("xx_in", x @ x.transpose(-1, -2))
        if not acc:
            return None
        ref = next(iter(acc.values()))
        bsz, d = ref.shape[0], ref.shape[-1]
        zero = torch.zeros((), dtype=torch.float64, device=ref.device)
        zero_b = zero.expand(bsz, d, d)
        zero_k = zero.expand(bsz, bsz, d, d) if pairs else zero_b

        def get(name: str, zero: torch.Tensor) -> torch.Tensor:
            return acc[name].double() if name in acc else zero

        if pairs:
            return solvers.Stats(get("k_out", zero_k), get("k_in", zero_k), get("xx_in", zero_b)[:, None],
                                 get("yy_out", zero_b)[None], get("yy_in", zero_b)[None])
        return solvers.Stats(*(get(f, zero_b) for f in ("k_out", "k_in", "xx_in", "yy_out", "yy_in")))

    def solve_block(self, root: str, g: Element, greedy_done: set[str] | None = None) -> None:
        """Update ``g`` (in place) on ``root`` — a continuous space without parent, or a permutation with
        its children — minimising ``D`` with every other space fixed (see the module docstring); the new
        value is kept only where it lowers ``D`` (on the terms used). With ``greedy_done`` (the greedy start)
        only the terms of :meth:`_terms_for` are used."""
        spec = self.spec
        members = {root, *spec.children[root]}
        cache: dict[str, torch.Tensor] = {}
        inverses: dict = {}  # M^{-T} of the fixed spaces, computed once per block

        def b_of(key: str) -> torch.Tensor:
            if key in cache:
                return cache[key]
            skip = [b for b in spec.tensors[key] if b.space in members]
            out = spec.apply_tensor(key, self.b[key], g, skip=skip, cache=inverses)
            if self.stream is None:  # streaming holds one tensor at a time: one read twice is formed twice
                cache[key] = out
            return out

        if not spec.children[root]:  # one continuous space, units independent (or one whole-space matrix)
            self._solve_space(root, g, self._terms_for(root, members, greedy_done), b_of)
        else:
            self._solve_parent(root, g, members, greedy_done, b_of)

    def _solve(self, s: str, st: solvers.Stats) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's closed-form minimiser of ``D`` on ``s`` and its cost (the one call into the solvers)."""
        return solvers.solve(self.groups[s], st)

    def _cost(self, s: str, el: torch.Tensor, st: solvers.Stats) -> torch.Tensor:
        """``D`` (up to constants) of the (batch, d, d) element blocks ``el`` of ``s`` under ``st``."""
        return solvers.cost(self.groups[s], el, st)

    def _solve_space(self, s: str, g: Element, terms, b_of) -> None:
        """One continuous space without children: the solver's element, kept per unit where it lowers ``D``."""
        st = self._stats(s, terms, b_of, pairs=False)
        if st is None:
            return
        new, new_cost = self._solve(s, st)
        cur = self._blocks(s, g[s])
        keep = new_cost < self._cost(s, cur, st)
        if bool(keep.any()):
            g[s] = self._element(s, torch.where(keep[:, None, None], new, cur), g[s])

    def _solve_parent(self, root: str, g: Element, members: set[str], greedy_done, b_of) -> None:
        """A permutation with children: for every unit pair the children's best transforms and ``D_ij``, then a LAP
        over ``−D_ij``; kept (with each unit's pair transforms) if ``D`` decreases."""
        n, device = self.spec.spaces[root].size, self.device_of()
        total = torch.zeros(n, n, dtype=torch.float64, device=device)
        idx, cur = torch.arange(n, device=device), g[root].to(device)
        cur_cost, picks = torch.zeros((), dtype=torch.float64, device=device), {}
        for c in self.spec.children[root]:
            pairs = self._pair_solution(c, self._terms_for(c, members, greedy_done), b_of, g[c], cur)
            if pairs is not None:
                total += pairs[0]
                cur_cost = cur_cost + pairs[1]
                picks[c] = pairs[2]
        plain = self._plain_score(root, b_of, greedy_done, members)
        if plain is not None:
            total -= 2 * plain
            cur_cost = cur_cost - 2 * plain[idx, cur].sum()
        if not picks and plain is None:
            return
        total = _finite_costs(total, n)
        perm = self._lap(-total, root)
        if not bool(total[idx, perm.to(device)].sum() < cur_cost):
            return
        g[root] = perm
        for c, pick in picks.items():
            g[c] = pick(perm.to(device))

    def _pair_solution(self, c: str, terms, b_of, current: torch.Tensor, cur: torch.Tensor):
        """``(cost (n, n), cost of the current element on the pairs (i, cur[i]), pick)`` of child ``c`` under its
        parent, ``pick(perm)`` giving the child's element for the parent's ``perm``; ``None`` without terms. A
        discrete unit-wise child (``block_permutation``: a group with ``from_matrices``) is solved one A-unit at a
        time, so only one row of pair statistics (n, d, d) is held, not all (n, n, d, d)."""
        group, idx = self.groups[c], torch.arange(len(cur), device=cur.device)
        if hasattr(group, "from_matrices"):
            return self._pair_rows(c, terms, b_of, current, cur)
        st = self._stats(c, terms, b_of, pairs=True)
        if st is None:
            return None
        m, cm = self._solve(c, st)
        now = self._cost(c, self._blocks(c, current), st.take_pairs(cur)).sum()
        return cm, now, lambda perm: self._element(c, m[idx, perm], current)

    def _pair_rows(self, c: str, terms, b_of, current: torch.Tensor, cur: torch.Tensor):
        """:meth:`_pair_solution` of an isometric discrete child, row by row: ``K_ij = Σ_terms X_i Y_jᵀ``."""
        n = self.spec.spaces[c].size
        mats = [(self._views(c, self._amat(k, bd, a_mat)), self._views(c, unit_matrix(b_of(k), bd, n)))
                for k, bd, a_mat in terms]
        if not mats:
            return None
        d = mats[0][0].shape[1]
        zero = torch.zeros(1, d, d, dtype=torch.float64, device=mats[0][0].device)
        cost = torch.zeros(n, n, dtype=torch.float64, device=zero.device)
        chosen, now, blocks = [], torch.zeros((), dtype=torch.float64, device=zero.device), self._blocks(c, current)
        for i in range(n):
            k = sum((x[i] @ y.reshape(n * d, -1).T).double() for x, y in mats).reshape(d, n, d).transpose(0, 1)
            m, cost[i] = self._solve(c, solvers.Stats(k, zero, zero, zero, zero))
            chosen.append(self.groups[c].from_matrices(m))
            j = int(cur[i])
            now = now + self._cost(c, blocks[i:i + 1], solvers.Stats(k[j:j + 1], zero, zero, zero, zero)).sum()
        elements = torch.stack(chosen)  # (n, n, d): A-unit i, B-unit j
        return cost, now, lambda perm: elements[torch.arange(n), perm.to(elements.device)].to(current.device)

    def _plain_score(self, root: str, b_of, greedy_done, members) -> torch.Tensor | None:
        """Σ over the parent's own bindings of ⟨A unit i, B unit j⟩ on the entries no child binding covers."""
        n = self.spec.spaces[root].size
        kids = set(self.spec.children[root])
        total = None
        for k, pb, a_mat in self._terms_for(root, members, greedy_done):
            covered = self._covered(k, pb, kids)
            if bool(covered.all()):
                continue
            a_mat = self._amat(k, pb, a_mat)
            keep = (~covered).reshape(-1).to(a_mat.device)
            x = a_mat.reshape(n, keep.numel(), -1)[:, keep].reshape(n, -1)
            y = unit_matrix(b_of(k), pb, n).reshape(n, keep.numel(), -1)[:, keep].reshape(n, -1)
            term = (x @ y.T).double()
            total = term if total is None else total + term
        return total


    def _covered(self, k: str, pb: AxisBinding, kids: set[str]) -> torch.Tensor:
        """Which entries of a unit of the parent binding ``pb`` of tensor ``k`` a child binding covers: a mask over
        the unit's ``block`` entries (children on ``pb``'s axis), or over the unit's whole slice of the tensor
        (children with ``unit_axis = pb.axis``; ``pb.block = 1``)."""
        binds = [cb for cb in self.spec.tensors[k] if cb.space in kids]
        if any(cb.unit_axis == pb.axis for cb in binds):
            shape = list(self.spec.shapes.get(k) or self.a[k].shape)
            del shape[pb.axis]
            covered = torch.zeros(shape, dtype=torch.bool)
            for cb in binds:
                if cb.unit_axis == pb.axis:
                    axis = cb.axis - (cb.axis > pb.axis)
                    covered.narrow(axis, cb.offset, cb.block).fill_(True)
            return covered
        covered = torch.zeros(pb.block, dtype=torch.bool)
        for cb in binds:
            if cb.axis == pb.axis and cb.step == pb.step and pb.offset <= cb.offset < pb.offset + pb.block:
                covered[cb.offset - pb.offset: cb.offset - pb.offset + cb.block] = True
        return covered


def _finite_costs(total: torch.Tensor, n: int) -> torch.Tensor:
    """``total`` with non-finite pair costs (a singular pair transform) replaced by one larger than any finite
    total of ``n`` pairs: never chosen by the LAP."""
    finite = torch.isfinite(total)
    if bool(finite.all()):
        return total
    big = (float(total[finite].abs().max()) + 1.0) * 4 * n if bool(finite.any()) else 1.0
    return torch.where(finite, total, torch.full_like(total, big))


def align_to_first(spec: SymmetrySpec, ckpts: list[Mapping[str, torch.Tensor]], names: list[str],
                   wm: WeightMatchingConfig | None, progress: Callable[[str, int, int], None] | None):
    """Weight matching of every model of ``ckpts`` (state dicts, lazy checkpoints or other lazy tensor sources) to the
    first: per model the element aligning it (``None`` for the first, and for every model where ``wm`` is None: no
    alignment) and the alignment records (name from ``names``, objective, stats). ``progress(stage, done, total)``
    gets each stage prefixed with ``"model i"``."""
    elements: list[Element | None] = [None]
    alignments = []
    for i, c in enumerate(ckpts[1:], 1):
        if wm is None:
            elements.append(None)
            continue
        tick = (lambda s, d, t, i=i: progress(f"model {i + 1}: {s}", d, t)) if progress is not None else None
        res = weight_matching(spec, ckpts[0], c, wm, progress=tick)
        elements.append(res.element)
        alignments.append({"model": names[i], "objective": res.objective, "stats": res.stats})
    return elements, alignments
