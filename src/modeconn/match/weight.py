"""Weight matching (git-re-basin, Ainsworth et al. 2023, Alg. 1) with restarts.

Maximise ``J(g) = Σ_k ⟨θ_A[k], (g·θ_B)[k]⟩`` over the spec's group by coordinate descent: for one space
at a time, with every other space fixed, the optimal element solves a LAP on the (n × n) score
``S = Σ_{(k, axis) on the space} A_k^{(axis)} · (B_k with the other spaces applied)^{(axis)ᵀ}``, where
``X^{(axis)}`` moves ``axis`` to the front and flattens the rest (n rows, one per unit). Sweeps repeat until
the relative gain of a whole sweep falls below ``rtol``. Coordinate descent stalls in local optima on
residual nets, so several restarts (random orders, random initial elements after the first) are run and
the best objective kept. The first run starts from a *greedy data-flow* element: spaces in spec order
(the traced data-flow order), each matched on its writer tensors only — those whose other axes read spaces
already matched — with the spaces before it applied (layer-wise matching, as in Singh & Jaggi 2020); on
independently trained or initialised nets it reaches a clearly better optimum than starting from the
identity. The second run starts from the identity, the others from random elements. ``J`` is bounded by
``‖θ_A‖·‖θ_B‖`` (Cauchy–Schwarz), reached exactly when ``g·θ_B = θ_A``; restarts stop early once it is reached.

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

The greedy start applies the same solvers to writer terms only. Planted elements of every group are recovered
exactly (up to fp32 error): ``S`` vanishes at the planted element and the solvers return its zero.
"""

from __future__ import annotations

import time
from typing import Mapping

import torch

from ..checks import check_compatible, check_finite, check_one_device
from ..errors import ConfigError
from ..symmetry import AxisBinding, Element, SymmetrySpec
from . import solvers
from .lap import LapTimer, solve_lap
from .result import Alignment

StateDict = Mapping[str, torch.Tensor]


def unit_matrix(t: torch.Tensor, b: AxisBinding, n: int) -> torch.Tensor:
    """The (n, -1) matrix of ``t`` with one row per unit of ``b``'s space (block entries kept together;
    row ``i`` is the unit's ``block`` entries along the axis, each followed by the rest of the tensor)."""
    if b.step != b.block:
        part = t.index_select(b.axis, b.indices(n, t.device))
    else:
        part = t.narrow(b.axis, b.offset, n * b.block)
    return part.movedim(b.axis, 0).reshape(n, -1)


def weight_matching(
    spec: SymmetrySpec,
    sd_a: StateDict,
    sd_b: StateDict,
    *,
    restarts: int = 4,
    max_iter: int = 100,
    rtol: float = 1e-9,
    seed: int = 0,
    init: Element | str = "greedy",
    keys: list[str] | None = None,
) -> Alignment:
    """Align ``sd_b`` to ``sd_a`` by weight matching.

    Args:
        spec: the symmetry spec of the architecture (``modeconn.symmetry_spec``).
        sd_a, sd_b: state dicts of the same architecture; any float dtype (computed in fp32); one device.
        restarts: number of coordinate-descent runs; the first starts at ``init``, the second at the
            identity, the others at random elements; the best objective is returned.
        max_iter: maximum sweeps over all spaces per run.
        rtol: a sweep that raises the objective by less than ``rtol·|J|`` ends the run (relative, so
            it behaves the same on small and billion-parameter models).
        seed: seeds the random orders and initial elements (same seed → same result).
        init: start of the first run: ``"greedy"`` (default, see module docstring), ``"identity"`` or
            an element (warm start).
        keys: restrict the objective to these tensors (default: every floating tensor bound to a space).
    Returns: :class:`Alignment` with ``element`` (apply to B), ``objective`` (``J``, or ``J̃`` when a space is
        not isometric — see the module docstring), ``history`` (objective per sweep per run) and ``stats``
        (iterations, seconds, lap_seconds, restart objectives, upper bound, isometric).
    Raises: ConfigError (bad option: restarts, max_iter, rtol, init, unknown keys), StateDictMismatchError,
        NonFiniteError, DeviceMismatchError, SpecError (all before any LAP).
    """
    if restarts < 1 or max_iter < 1:
        raise ConfigError(f"restarts and max_iter must be ≥ 1 (got restarts={restarts}, max_iter={max_iter})")
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not 0 <= rtol < 1:
        raise ConfigError(f"rtol is a relative tolerance in [0, 1), got {rtol!r}")
    unknown = [k for k in keys or () if k not in spec.tensors]
    if unknown:
        raise ConfigError(f"keys {unknown} are not tensors of the symmetry spec")
    start = time.perf_counter()
    spec.check_state_dict(sd_a, "state dict A")
    spec.check_state_dict(sd_b, "state dict B")
    check_compatible([sd_a, sd_b], ["A", "B"])
    device = check_one_device([sd_a, sd_b], ["A", "B"])
    if isinstance(init, str):
        if init not in ("greedy", "identity"):
            raise ConfigError(f"init must be 'greedy', 'identity' or a group element, got {init!r}")
    else:
        spec.check_element(init)
    keys = keys if keys is not None else [
        k for k, binds in spec.tensors.items() if binds and sd_a[k].is_floating_point()
    ]
    check_finite(sd_a, "A", keys)
    check_finite(sd_b, "B", keys)
    a = {k: sd_a[k].detach().to(device, torch.float32) for k in keys}
    b = {k: sd_b[k].detach().to(device, torch.float32) for k in keys}
    problem = _Problem(spec, a, b)
    if problem.isometric:
        bound = float(sum(t.norm() ** 2 for t in a.values()) ** 0.5 * sum(t.norm() ** 2 for t in b.values()) ** 0.5)
    else:
        bound = float(sum(t.norm() ** 2 for t in a.values()) + sum(t.norm() ** 2 for t in b.values())) / 2

    gen = torch.Generator().manual_seed(seed)
    best: tuple[float, Element] | None = None
    history, iterations = [], []
    starts = [init, "identity"] if init != "identity" else ["identity"]
    for r in range(restarts):
        g0 = problem.start(starts[r] if r < len(starts) else "random", gen)
        g, hist = problem.coordinate_descent(g0, gen, max_iter, rtol)
        history.append(hist)
        iterations.append(len(hist) - 1)
        if best is None or hist[-1] > best[0]:
            best = (hist[-1], g)
        if best[0] >= bound * (1 - 1e-6):
            break
    assert best is not None
    return Alignment(
        method="weight",
        spec=spec,
        element={s: p.cpu() for s, p in best[1].items()},
        objective=best[0],
        history=history,
        stats={
            "iterations": iterations,
            "restarts_run": len(history),
            "restart_objectives": [h[-1] for h in history],
            "upper_bound": bound,
            "seconds": time.perf_counter() - start,
            "lap_seconds": problem.timer.seconds,
            "lap_calls": problem.timer.calls,
            "isometric": problem.isometric,
        },
    )


class _Problem:
    """The weight-matching problem for fixed (fp32) A and B tensors."""

    def __init__(self, spec: SymmetrySpec, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
        self.spec, self.a, self.b = spec, a, b
        self.timer = LapTimer()
        self.terms = {
            s: [(k, bd, unit_matrix(a[k], bd, spec.spaces[s].size)) for k, bd in spec.bindings_by_space[s] if k in a]
            for s in spec.spaces
        }
        self.groups = {s: spec.group_of(s) for s in spec.spaces}
        # spaces solved by the plain LAP path (git re-basin); everything else goes through ``solve_block``
        self.plain = {s for s, sp in spec.spaces.items() if sp.group == "permutation" and not spec.children[s]}
        self.isometric = all(gr.isometric for gr in self.groups.values())
        self.half_b_sq = 0.0 if self.isometric else float(sum((t.double() ** 2).sum() for t in b.values())) / 2

    def score(self, s: str, g: Element) -> torch.Tensor:
        n = self.spec.spaces[s].size
        total = None
        for k, bd, a_mat in self.terms[s]:
            b_k = self.spec.apply_tensor(k, self.b[k], g, skip=bd)
            term = a_mat @ unit_matrix(b_k, bd, n).T
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
        """Layer-wise matching in spec order on writer (output-side) tensors only.

        A writer whose other axes read spaces not matched yet (e.g. the second Linear of a residual block,
        which writes the stream but reads the block's hidden space) only adds noise to the score, enough to
        pick a wrong stream permutation on small nets; it is used only when a space has no other writer.
        Continuous spaces and parent permutations with their children use :meth:`solve_block` on the same
        writer terms (children are solved with their parent, where the first of them comes in spec order).
        """
        g = self.spec.identity()
        done: set[str] = set()
        for s in self.spec.spaces:
            if s not in self.plain:
                root = self.spec.spaces[s].parent or s
                if root not in done:
                    self.solve_block(root, g, greedy_done=done)
                    done.update((root, *self.spec.children[root]))
                continue
            n = self.spec.spaces[s].size
            writers = [(k, bd, a_mat) for k, bd, a_mat in self.terms[s] if bd.side == "out"]
            ready = [(k, bd, a_mat) for k, bd, a_mat in writers
                     if all(b.space in done for b in self.spec.tensors[k] if b is not bd)]
            terms = [a_mat @ unit_matrix(self.spec.apply_tensor(k, self.b[k], g, skip=bd), bd, n).T
                     for k, bd, a_mat in ready or writers]
            if terms:
                g[s] = solve_lap(sum(terms), s, self.timer)
            done.add(s)
        return g

    def objective(self, g: Element) -> float:
        if self.isometric:
            return float(sum((self.a[k] * self.spec.apply_tensor(k, self.b[k], g)).sum() for k in self.a))
        total, cache = self.half_b_sq, {}
        for k in self.a:
            gb = self.spec.apply_tensor(k, self.b[k], g, cache=cache).double()
            total += float((self.a[k].double() * gb).sum() - (gb * gb).sum() / 2)
        return total

    def coordinate_descent(self, g: Element, gen: torch.Generator, max_iter: int, rtol: float):
        spaces = list(self.spec.spaces)
        hist = [self.objective(g)]
        for _ in range(max_iter):
            for i in torch.randperm(len(spaces), generator=gen).tolist():
                s = spaces[i]
                if s not in self.plain:
                    if self.spec.spaces[s].parent is None:  # children are solved with their parent
                        self.solve_block(s, g)
                    continue
                score = self.score(s, g)
                new = solve_lap(score, s, self.timer)
                idx = torch.arange(len(new), device=score.device)
                if score[idx, new.to(score.device)].sum() > score[idx, g[s].to(score.device)].sum():
                    g[s] = new
            hist.append(self.objective(g))
            if hist[-1] - hist[-2] <= rtol * max(abs(hist[-2]), 1e-30):
                break
        return g, hist

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
        el = el.to(self.device_of(), torch.float64)
        if not group.unitwise:
            return el[None]
        return el[:, None, None] if el.dim() == 1 else el

    def _element(self, s: str, m: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        group = self.groups[s]
        if not group.unitwise:
            m = m[0]
        elif m.shape[-1] == 1 and like.dim() == 1:
            m = m[..., 0, 0]
        return m.to(like.device, torch.float32 if like.dtype != torch.float64 else like.dtype)

    def device_of(self) -> torch.device:
        return next(iter(self.a.values())).device if self.a else torch.device("cpu")

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
            x = self._views(s, a_mat)
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
            if key not in cache:
                skip = [b for b in spec.tensors[key] if b.space in members]
                cache[key] = spec.apply_tensor(key, self.b[key], g, skip=skip, cache=inverses)
            return cache[key]

        if not spec.children[root]:  # one continuous space, units independent (or one whole-space matrix)
            group = self.groups[root]
            st = self._stats(root, self._terms_for(root, members, greedy_done), b_of, pairs=False)
            if st is None:
                return
            new, new_cost = solvers.solve(group, st)
            cur = self._blocks(root, g[root])
            keep = new_cost < solvers.cost(group, cur, st)
            if bool(keep.any()):
                g[root] = self._element(root, torch.where(keep[:, None, None], new, cur), g[root])
            return

        # a permutation with children: two-level solve over unit pairs
        n = spec.spaces[root].size
        device = self.device_of()
        total = torch.zeros(n, n, dtype=torch.float64, device=device)
        solved = {}
        for c in spec.children[root]:
            st = self._stats(c, self._terms_for(c, members, greedy_done), b_of, pairs=True)
            if st is None:
                continue
            m, cm = solvers.solve(self.groups[c], st)
            total += cm
            solved[c] = (m, st)
        plain = self._plain_score(root, b_of, greedy_done, members)
        if plain is not None:
            total -= 2 * plain
        if not solved and plain is None:
            return
        finite = torch.isfinite(total)
        if not bool(finite.all()):  # a singular pair transform: never chosen
            big = (float(total[finite].abs().max()) + 1.0) * 4 * n if bool(finite.any()) else 1.0
            total = torch.where(finite, total, torch.full_like(total, big))
        perm = solve_lap(-total, root, self.timer)
        idx = torch.arange(n, device=device)
        cur = g[root].to(device)
        cur_cost = -2 * plain[idx, cur].sum() if plain is not None else torch.zeros((), dtype=torch.float64)
        for c, (m, st) in solved.items():
            cur_cost = cur_cost + solvers.cost(self.groups[c], self._blocks(c, g[c]), st.take_pairs(cur)).sum()
        if not bool(total[idx, perm.to(device)].sum() < cur_cost):
            return
        g[root] = perm
        for c, (m, _) in solved.items():
            g[c] = self._element(c, m[idx, perm.to(device)], g[c])

    def _plain_score(self, root: str, b_of, greedy_done, members) -> torch.Tensor | None:
        """Σ over the parent's own bindings of ⟨A unit i, B unit j⟩ on the entries no child binding covers."""
        n = self.spec.spaces[root].size
        kids = set(self.spec.children[root])
        total = None
        for k, pb, a_mat in self._terms_for(root, members, greedy_done):
            covered = torch.zeros(pb.block, dtype=torch.bool)
            for cb in self.spec.tensors[k]:
                if cb.space in kids and cb.axis == pb.axis and cb.step == pb.step and pb.offset <= cb.offset < pb.offset + pb.block:
                    covered[cb.offset - pb.offset: cb.offset - pb.offset + cb.block] = True
            if bool(covered.all()):
                continue
            keep = (~covered).to(a_mat.device)
            x = a_mat.reshape(n, pb.block, -1)[:, keep].reshape(n, -1)
            y = unit_matrix(b_of(k), pb, n).reshape(n, pb.block, -1)[:, keep].reshape(n, -1)
            term = (x @ y.T).double()
            total = term if total is None else total + term
        return total
