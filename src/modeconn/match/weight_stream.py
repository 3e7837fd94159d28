"""Streaming weight matching: A and B read tensor by tensor (:mod:`modeconn.match.weight`).

When A or B is read tensor by tensor — a :class:`~modeconn.io.lazy.LazyTensors`: a
:class:`~modeconn.io.lazy.LazyCheckpoint`, or the absorbed tensors of one
(:class:`~modeconn.symmetry.absorb_stream.AbsorbedView`) — the same
algorithm (same starts, orders, solvers and acceptance tests) runs without holding either model: every term reads
its tensors when it is formed and drops them after; tensors only permutations act on stay in their stored dtype
(fp16/bf16 gathers are exact) and only the chunk in use is gathered (:meth:`SymmetrySpec.permutation_gathers`);
each ``A_k B_kᵀ`` is accumulated in fp32 over chunks of ``chunk`` elements along the tensor's largest other axis,
in place, inside the buffer the LAP then reads (widened to fp64 in place for the dense solver; the spaces the sparse
certified solver takes stay fp32), so a space costs its n×n score plus one chunk. A tensor larger than a chunk whose
units are its rows (an FFN up-projection) is read as row blocks instead, ``S[I, J] += A_I · (g·B)_Jᵀ`` over spans of
about a chunk each (B re-read once per span of A, from the page cache): no such tensor is ever resident whole.
Objective and norms are summed chunk by chunk in fp64. With ``device`` (an accelerator) the chunks are copied there
and the products accumulate in an fp32 (n, n) score on the device (the LAP then copies it to the host once,
:func:`modeconn.match.lap.lap_method`).
Spaces of continuous groups (and permutations with children) read their whole fp32 unit matrices, one tensor at a
time (a tensor a block reads twice is read twice, not kept; a discrete unit-wise child, ``block_permutation``, holds
its terms' unit matrices together). The result equals the in-memory one up to the summation order of the products (same element unless two
candidates tie to fp32 rounding).
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable, Iterator, Mapping

import torch

from ..checks import check_finite
from ..io.lazy import LazyTensors, is_lazy
from ..symmetry import AxisBinding, Element, SymmetrySpec
from ..symmetry.spec import apply_gathers
from .lap import is_sparse, lap_method
from .score_terms import restrict

StateDict = Mapping[str, torch.Tensor]


class _Float32(Mapping[str, torch.Tensor]):
    """``src`` restricted to ``keys``, each tensor read as fp32 when it is looked up (never cached)."""

    def __init__(self, src: StateDict, keys: list[str]) -> None:
        self.src, self.keys_ = src, dict.fromkeys(keys)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.keys_:
            raise KeyError(key)
        return self.src[key].detach().float()

    def __contains__(self, key: object) -> bool:
        return key in self.keys_

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)


class _Stream:
    """A and B read tensor by tensor (lazy mappings) for streaming weight matching: products are formed chunk by
    chunk in fp32, pure-permutation tensors are gathered chunk by chunk in their stored dtype."""

    def __init__(self, spec: SymmetrySpec, a: StateDict, b: StateDict, keys: list[str], chunk: int,
                 device: torch.device | None = None) -> None:
        self.spec, self.a, self.b, self.keys, self.chunk = spec, a, b, list(keys), chunk
        self.device = device  # None: the CPU path (fp32 accumulation inside the fp64 buffer); else products there
        self.b_sq = 0.0

    def squared_norms(self) -> tuple[float, float]:
        """``(Σ‖A_k‖², Σ‖B_k‖²)`` over the keys in fp64, one pass; NonFiniteError naming the first tensor with
        NaN/Inf entries (a finite sum of squares means every entry is finite)."""
        out = []
        for name, src in (("A", self.a), ("B", self.b)):
            total = 0.0
            for k in self.keys:
                shape = _shape_in(src, k)
                sq = 0.0
                for block in self._blocks(src, k, shape):
                    flat = block.reshape(-1)
                    for i in range(0, flat.numel(), self.chunk):
                        c = flat[i:i + self.chunk].double()
                        sq += float(torch.dot(c, c))
                if not math.isfinite(sq):
                    check_finite({k: src[k]}, name)
                total += sq
            out.append(total)
        self.b_sq = out[1]
        return out[0], out[1]

    def _blocks(self, src: StateDict, key: str, shape: tuple[int, ...]) -> Iterator[torch.Tensor]:
        """Tensor ``key`` of ``src`` whole, or (larger than a chunk) in blocks of rows along its first axis."""
        numel = math.prod(shape)
        if not shape or numel <= self.chunk:
            yield src[key].detach()
            return
        for i, m in _spans(shape[0], numel, self.chunk):
            yield _row_block(src, key, i, m)

    def pieces(self, key: str, g: Element, bd: AxisBinding | None = None,
               cache: dict | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Matching chunks ``(A_k piece, g·B_k piece)`` of tensor ``key``. With ``bd``: both restricted to ``bd``'s
        units along ``bd.axis`` and ``g`` acting on every other binding (as ``apply_tensor(..., skip=bd)``), chunked
        along the largest other axis; without: ``g`` on every binding, chunked along the largest axis. A tensor only
        permutations act on keeps its stored dtype and only the chunk in use is gathered; a tensor a continuous
        group acts on is converted to fp32 and transformed whole, as in memory. Chunks along a tensor's first axis that
        no permutation gathers are read from a lazy checkpoint row block by row block
        (:meth:`LazyTensors.read_rows`), so that a tensor larger than a chunk (an embedding) is never resident
        whole."""
        shape = _shape_in(self.b, key)
        plan = self.spec.permutation_gathers(key, shape, g, skip=bd)
        if plan is not None and bd is not None:
            plan.pop(bd.axis, None)  # other bindings of bd's axis never move bd's own units
        other = [ax for ax in range(len(shape)) if bd is None or ax != bd.axis]
        if plan is not None and other and max(other, key=lambda i: shape[i]) == 0 and math.prod(shape):
            yield from self._row_pieces(key, shape, plan, bd)
            return
        a, b = self.a[key].detach(), self.b[key].detach()
        if plan is None:
            a = a.float()
            b = self.spec.apply_tensor(key, b.float(), g, skip=bd, cache=cache)
            plan = {}
        axes = list(range(a.dim()))
        if bd is not None:
            n = self.spec.spaces[bd.space].size
            a, b = restrict(a, bd, n), restrict(b, bd, n)
            axes.remove(bd.axis)
        if not axes or a.numel() == 0:
            yield a, apply_gathers(b, plan)
            return
        r = max(axes, key=lambda i: a.shape[i])
        rest = {ax: idx for ax, idx in plan.items() if ax != r}
        for i, m in _spans(a.shape[r], a.numel(), self.chunk):
            pb = b.index_select(r, plan[r][i:i + m]) if r in plan else b.narrow(r, i, m)
            yield a.narrow(r, i, m), apply_gathers(pb, rest)

    def _row_pieces(self, key: str, shape: tuple[int, ...], plan: dict[int, torch.Tensor],
                    bd: AxisBinding | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`pieces` of a tensor chunked along its first axis (the gathers ``plan`` of the other axes but
        ``bd``'s): row blocks read one at a time; B's rows where a permutation moves the first axis (a down-projection's
        residual rows) read as the rows that axis gathers."""
        rows = plan.pop(0, None)
        spans = _spans(shape[0], math.prod(shape), self.chunk) if math.prod(shape) > self.chunk else [(0, shape[0])]
        for i, m in spans:
            a = _row_block(self.a, key, i, m, shape)
            b = _row_block(self.b, key, i, m, shape) if rows is None else _row_set(self.b, key, rows[i:i + m], shape)
            if bd is not None:
                n = self.spec.spaces[bd.space].size
                a, b = restrict(a, bd, n), restrict(b, bd, n)
            yield a, apply_gathers(b, plan)

    def score(self, terms: list, g: Element, n: int) -> torch.Tensor:
        """Σ over ``terms`` of ``unit(A_k) · unit(g·B_k)ᵀ`` as an (n, n) tensor; the products accumulate in fp32
        (``addmm_``, no temporaries). A score the sparse certified LAP will solve (:func:`lap_method` ``"sparse"``, or
        ``"auto"`` from :data:`~modeconn.match.lap.SPARSE_MIN_N` units) stays fp32: that solver reads fp32 as it is,
        so the largest space costs n² fp32 bytes. Otherwise the sum lives in the first half of an fp64 buffer that
        is then widened in place for the dense solver: one n×n fp64 allocation in all, and its second half is not
        touched (not resident) while the terms are read. On an accelerator (``self.device``) the fp32 sum lives there
        and is returned widened to fp64 there."""
        if self.device is not None:
            acc = torch.zeros(n, n, dtype=torch.float32, device=self.device)
            for k, bd, _ in terms:
                self._accumulate(acc, k, bd, g)
            return acc.double()
        sparse = is_sparse(lap_method(None, n), n)
        big = n * n * 8 >= _TRIM_BYTES
        if big:
            _trim_heap()
        buf = torch.empty(n * n, dtype=torch.float32 if sparse else torch.float64)
        acc = buf.view(torch.float32)[: n * n].view(n, n).zero_()
        for k, bd, _ in terms:
            self._accumulate(acc, k, bd, g)
        if sparse:
            return acc
        if big:
            _trim_heap()  # the chunk temporaries just freed, before the second half of the buffer is touched
        return _widen(buf).view(n, n)

    def _accumulate(self, acc: torch.Tensor, key: str, bd: AxisBinding, g: Element) -> None:
        """``acc += unit(A_k) · unit(g·B_k)ᵀ`` chunk by chunk (a function of its own, so that the last chunk — a view
        of the memory-mapped tensor — is released before the caller goes on)."""
        n = acc.shape[0]
        plan = self._unit_rows_plan(key, g, bd)
        if plan is not None:
            self._accumulate_unit_rows(acc, key, bd, plan)
            return
        for pa, pb in self.pieces(key, g, bd):
            x, y = _rows(pa, bd, n), _rows(pb, bd, n)
            if self.device is not None:
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            acc.addmm_(x, y.T)

    def _unit_rows_plan(self, key: str, g: Element, bd: AxisBinding) -> dict[int, torch.Tensor] | None:
        """The gathers ``g`` makes on the other axes of ``key`` when its units are whole row blocks of a tensor larger
        than a chunk read lazily (an FFN up-projection: units along axis 0, contiguous, only
        permutations acting on it); else None."""
        if not (is_lazy(self.a) and is_lazy(self.b)):
            return None
        shape = _shape_in(self.b, key)
        if bd.axis != 0 or bd.unit_axis is not None or bd.step != bd.block or math.prod(shape) <= self.chunk:
            return None
        plan = self.spec.permutation_gathers(key, shape, g, skip=bd)
        if plan is not None:
            plan.pop(0, None)  # other bindings of bd's axis never move bd's own units
        return plan

    def _accumulate_unit_rows(self, acc: torch.Tensor, key: str, bd: AxisBinding,
                              plan: dict[int, torch.Tensor]) -> None:
        """``acc += unit(A_k) · unit(g·B_k)ᵀ`` block by block, ``acc[I, J] += A_I · (g·B)_Jᵀ`` for spans ``I``, ``J``
        of about a chunk of units each, read as row blocks (:meth:`LazyTensors.read_rows`): no tensor is mapped or
        resident whole (B is read once per span of A, from the page cache after the first pass).

        The gathers act on the axes the product sums over, so ``A_I · (g·B)_Jᵀ = (A_I gathered by their inverses) ·
        B_Jᵀ``: A's block is gathered once per span of A and B's blocks are used as read (gathering B's columns
        once per pair of spans cost as much as the products)."""
        n = acc.shape[0]
        shape = _shape_in(self.b, key)
        unit = bd.block * math.prod(shape[1:])
        inverse = {ax: _inverse(idx) for ax, idx in plan.items()}
        for i, m in _spans(n, n * unit, self.chunk):
            x = self._unit_block(self.a, key, bd, i, m, inverse)
            for j, k in _spans(n, n * unit, self.chunk):
                y = self._unit_block(self.b, key, bd, j, k, {})
                acc[i:i + m, j:j + k].addmm_(x, y.T)

    def _unit_block(self, src: LazyTensors, key: str, bd: AxisBinding, start: int, count: int,
                    plan: dict[int, torch.Tensor]) -> torch.Tensor:
        """Units ``start … start + count − 1`` of ``bd`` in tensor ``key`` of ``src``, ``plan`` applied, as a
        (count, -1) fp32 matrix (on the run's device)."""
        rows = src.read_rows(key, bd.offset + start * bd.block, count * bd.block)
        x = apply_gathers(rows, plan).to(torch.float32, memory_format=torch.contiguous_format).reshape(count, -1)
        return x if self.device is None else x.to(self.device, non_blocking=True)

    def objective(self, g: Element, isometric: bool, half_b_sq: float) -> float:
        """``J(g)`` (isometric) or ``J̃(g)`` summed chunk by chunk in fp64."""
        total, cache = (0.0 if isometric else half_b_sq), {}
        for k in self.keys:
            for pa, pb in self.pieces(k, g, cache=cache):
                x, y = pa.reshape(-1).float(), pb.reshape(-1).float()
                if self.device is not None:
                    x, y = x.to(self.device), y.to(self.device)
                if isometric:
                    total += float(torch.dot(x, y))
                else:
                    x, y = x.double(), y.double()
                    total += float(torch.dot(x, y) - torch.dot(y, y) / 2)
        return total


def _inverse(index: torch.Tensor) -> torch.Tensor:
    """The inverse of the permutation ``index`` of an axis (a gather of :meth:`SymmetrySpec.permutation_gathers`)."""
    inv = torch.empty_like(index)
    inv[index] = torch.arange(index.numel(), device=index.device)
    return inv


def _rows(piece: torch.Tensor, bd: AxisBinding, n: int) -> torch.Tensor:
    """The (n, -1) fp32 unit matrix of a restricted piece (one copy at most)."""
    return piece.movedim(bd.axis, 0).to(torch.float32, memory_format=torch.contiguous_format).reshape(n, -1)


def _shape_in(src: StateDict, key: str) -> tuple[int, ...]:
    """The shape of tensor ``key`` of a state dict or lazy tensors (:meth:`LazyTensors.shape_of`: no data)."""
    return src.shape_of(key) if is_lazy(src) else tuple(src[key].shape)


def _spans(length: int, numel: int, chunk: int) -> Iterator[tuple[int, int]]:
    """``(start, count)`` along an axis of ``length`` of a tensor of ``numel`` entries, each span about ``chunk``
    entries of it (at least one index)."""
    step = max(1, chunk * length // numel)
    for i in range(0, length, step):
        yield i, min(step, length - i)


def _row_block(src: StateDict, key: str, start: int, count: int, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Rows ``start … start + count − 1`` of tensor ``key`` along its first axis: read alone from a lazy checkpoint
    (the whole tensor as it is where that is all of it)."""
    if is_lazy(src) and (shape is None or count < shape[0]):
        return src.read_rows(key, start, count)
    return src[key].detach().narrow(0, start, count)


def _row_set(src: StateDict, key: str, rows: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``src[key][rows]``: only those rows read from a lazy checkpoint (the whole tensor gathered where ``rows``
    covers all of it)."""
    if is_lazy(src) and len(rows) < shape[0]:
        return src.read_rows_at(key, rows)
    return src[key].detach().index_select(0, rows)


_TRIM_BYTES = 32 << 20


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (AttributeError, OSError):
        return None


def _trim_heap() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``; a no-op elsewhere) before a large n×n buffer is
    allocated: glibc keeps the freed chunk temporaries of earlier terms resident (~60 MiB measured on Pythia-1B
    shapes), which would add to the buffer in the peak."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _widen(buf: torch.Tensor) -> torch.Tensor:
    """Convert in place the fp32 values stored in the first half of ``buf``'s bytes (fp64, m entries) to fp64,
    back to front in blocks: block ``[i0, i1)`` lands on the bytes of fp32 entries ``[2·i0, 2·i1)``, which were read
    already (later blocks) or are in the block itself (copied first)."""
    src, end, step = buf.view(torch.float32), buf.numel(), 1 << 20
    while end > 0:
        start = max(0, end - step)
        buf[start:end] = src[start:end].clone()
        end = start
    return buf
