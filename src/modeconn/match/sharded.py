"""Sharded dual matching: endpoints and learned transforms split over the ranks (``dual_matching(..., shard=True)``).

The data-parallel mode (:mod:`modeconn.match.distributed`) keeps both endpoints whole on every rank. The sharded
mode is the same computation (same batches split the same way, same λ, same Adam steps on the same global loss)
with ZeRO-3 / FSDP storage, built from PyTorch's own sharding:

* **Frozen endpoint tensors** are blocks in the layout of a ``DTensor`` with placement ``Shard(dim)``: rank r
  of W holds the block ``[r·c, min((r+1)·c, n))`` along ``dim`` of every tensor whose ``dim`` has ``n`` entries,
  ``c = ⌈n / W⌉`` (:func:`row_block`: ``torch.chunk`` semantics, which is DTensor's own split; the last ranks may
  hold fewer or none), in the stored dtype. ``dim`` is the tensor's first axis that no continuous transform acts on
  (its *free axis*: e.g. the rows of an embedding or FFN up-projection, the columns of a FFN down-projection), else
  the first axis whose continuous transforms are unit-wise (one matrix per attention head) and whose blocks all hold
  whole units (:func:`unit_range`: e.g. a fused QKV projection's rows or an attention output projection's columns
  split at head boundaries), else 0. They are read per rank from safetensors
  (``safe_open(...).get_slice(key)[start:stop]``, or ``[:, start:stop]``: only that block is read) — or sliced from an
  in-memory / lazy mapping. B's tensors that a discrete (weight-matching) part acts on are read whole one at a time,
  permuted, and sliced (one tensor transiently, never the model).
  Integer tensors and scalars are kept whole on every rank (the spec never acts on them).
* **Learned transforms** (Cayley / polar parameters of both sides) are wrapped with FSDP2
  (``torch.distributed.fsdp.fully_shard``): each rank stores ``1/W`` of every parameter and of its Adam state; the
  parameters are all-gathered when the transform's element is computed and the gradients reduce-scattered (summed,
  not averaged: each rank's loss is already its weighted share of the global mean). The trivialisation bases (the
  modules' floating buffers) are made frozen parameters first (:func:`freeze_buffers`), so FSDP shards them too.
  Each step computes the elements without autograd (:func:`detached_element`) and feeds them to the model as leaf
  tensors — of a per-head element only the heads this rank's blocks read; after the model's backward pass each
  module's element is recomputed with autograd and back-propagated from its gradient (:func:`element_gradient`: the
  rank's heads' share, zero elsewhere; FSDP sums the ranks' parameter gradients), one module at a time — the chain
  rule's gradients, without any transform's graph held while the activations are.
* **Use.** Every module of the working model that owns state-dict tensors (embeddings, linears) is a *lazy leaf*:
  its forward materialises ``θ_k(λ) = (1−λ)·π_A(a_k) + λ·π_B(b_k)`` in fp32 and runs the module on it, all inside
  ``torch.utils.checkpoint`` (non-reentrant), so that only the leaf's input is saved and the materialisation is
  recomputed in the backward pass — at any time one leaf's full tensors exist. A tensor sharded along its free axis
  or at unit boundaries is *block-local*: the continuous transforms act on the other axes whole and on the block's
  axis with the block's units only, so each rank transforms and interpolates its own block and all-gathers the
  result (:func:`gather_blocks`, whose backward all-reduces ``∂θ`` and keeps the
  rank's block — the sum over the ranks' losses that the block's share of the element gradients needs); only the
  interpolated tensor is ever whole. The other tensors (every axis coupled by a transform, e.g. a vector the
  residual rotation acts on, or attention projections whose blocks would cut a head) are all-gathered as endpoints
  (:meth:`ShardedEndpoints.full`) and transformed whole. The working model's own parameters
  live on the meta device (no memory).

Per-rank peak memory is modelled in :mod:`modeconn.match.memory`.

Errors: ConfigError for a backend that cannot carry the endpoints' device type natively (sharding needs NCCL for
CUDA tensors, gloo for CPU tensors), a non-persistent buffer left on the meta device that cannot be initialised,
a sharded run with ``checkpoint_dir``; DistributedError for a batch with fewer rows than ranks (sharded runs need
every rank in every collective); NonFiniteError for non-finite endpoint tensors (each rank checks its shard).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..checks import check_finite_stored
from ..errors import ConfigError, NonFiniteError

Source = Mapping[str, torch.Tensor] | str | os.PathLike
TheTheta = Callable[[str], torch.Tensor]


def row_block(rows: int, rank: int, world: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s rows of a tensor with ``rows`` rows split over ``world`` ranks, as
    ``torch.chunk`` (and DTensor's ``Shard(0)``) splits: ``c = ⌈rows / world⌉`` rows per rank, the last ranks fewer
    (possibly none)."""
    c = -(-rows // world) if rows else 0
    start = min(rank * c, rows)
    return start, min(start + c, rows)


# ------------------------------------------------------------------------------------------ reading endpoints
class RowReader:
    """Reads rows of the tensors of one endpoint: a checkpoint directory (safetensors, single file or shards + index;
    only the requested rows are read, ``get_slice``) or a mapping of tensors (``sd[key][start:stop]``).

    ``meta``: key → meta tensor (dtype and shape, no data). Raises CheckpointError as
    :class:`~modeconn.io.lazy.LazyCheckpoint` for an unreadable directory; NonFiniteError naming the file and tensor
    for rows read from it with NaN/Inf."""

    def __init__(self, source: Source) -> None:
        if isinstance(source, (str, os.PathLike)):
            from ..io.lazy import LazyCheckpoint

            self.ckpt = LazyCheckpoint(Path(source))
            self.mapping: Mapping[str, torch.Tensor] = self.ckpt
            self.meta = self.ckpt.meta()
        else:
            self.ckpt = None
            self.mapping = source
            self.meta = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in source.items()}

    def rows(self, key: str, start: int, stop: int, dim: int = 0) -> torch.Tensor:
        """Entries ``[start, stop)`` along axis ``dim`` (default: rows) of tensor ``key`` (a fresh contiguous tensor
        of the stored dtype in process memory, not a view of the file; scalars whole)."""
        index = (slice(None),) * dim + (slice(start, stop),)
        if self.ckpt is None:
            t = self.mapping[key].detach()
            return (t if t.dim() == 0 else t[index]).cpu().contiguous().clone()
        from safetensors import safe_open

        info = self.ckpt.infos[key]
        with safe_open(str(self.ckpt.path / info.shard), framework="pt", device="cpu") as f:
            sl = f.get_slice(key)
            # copied out of the file's memory map: a view would keep the map, whose resident pages (the kernel maps
            # cached neighbours of every page touched) can be several times the rows' bytes
            t = (sl[:] if not info.shape else sl[index]).contiguous().clone()
        return check_finite_stored(t, self.ckpt.path / info.shard, key, f" (entries {start}:{stop} of axis {dim})")

    def whole(self, key: str) -> torch.Tensor:
        return self.mapping[key].detach().cpu()


# ------------------------------------------------------------------------------------------ the sharded store
class ShardedEndpoints:
    """The frozen tensors of one endpoint, rank ``rank`` of ``world`` holding its :func:`row_block` along axis
    ``dims[key]`` (default 0) of each floating tensor with at least one dimension (stored dtype), the others whole.

    ``full(key)`` all-gathers tensor ``key`` (one buffer of the stored dtype; a collective: every rank calls it for
    the same keys in the same order) and returns it in fp32 on ``device``; ``block(key)`` is this rank's
    block in fp32 (no collective)."""

    def __init__(self, local: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], mesh, device,
                 dims: Mapping[str, int] | None = None) -> None:
        self.local, self.shapes, self.mesh, self.device = local, shapes, mesh, device
        self.dims = {k: (dims or {}).get(k, 0) for k in local}
        self.nonfinite = [k for k, t in local.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]

    @classmethod
    def load(cls, reader: RowReader, keys: Iterable[str], rank: int, world: int, mesh, device: torch.device,
             whole: Callable[[str], torch.Tensor | None] | None = None,
             dims: Mapping[str, int] | None = None) -> ShardedEndpoints:
        """This rank's shards of ``keys``, split along axis ``dims[key]`` (default 0); ``whole(key)``, where it returns
        a tensor, supplies the full tensor to slice (B with its discrete part applied) instead of reading the block.
        :attr:`nonfinite`: the keys whose shard holds a non-finite value (see :func:`check_finite_shards`)."""
        local, shapes, dims = {}, {}, dict(dims or {})
        for key in keys:
            meta = reader.meta[key]
            shapes[key] = tuple(meta.shape)
            dim = dims.get(key, 0) if _sharded(meta) else 0
            dims[key] = dim
            start, stop = row_block(meta.shape[dim], rank, world) if _sharded(meta) else (0, 0)
            full = whole(key) if whole is not None else None
            if full is not None:
                t = full.narrow(dim, start, stop - start).contiguous().clone() if _sharded(meta) else full.clone()
            else:
                t = reader.rows(key, start, stop, dim) if _sharded(meta) else reader.whole(key).clone()
            local[key] = t.to(device)
        return cls(local, shapes, mesh, device, dims)

    def full(self, key: str) -> torch.Tensor:
        t = self.local[key]
        if not _sharded(t) or self.mesh is None:
            return t.float() if t.is_floating_point() else t
        dim = self.dims[key]
        with torch.no_grad():  # frozen: one gathered buffer (a view of it), not DTensor's padded output and copy
            return _GatherBlocks.apply(t, dim, self.shapes[key][dim], self.mesh.get_group()).float()

    def block(self, key: str) -> torch.Tensor:
        """This rank's block of tensor ``key`` in fp32 (floating tensors; the others as stored)."""
        t = self.local[key]
        return t.float() if t.is_floating_point() else t

    def nbytes(self) -> int:
        """Bytes this rank stores."""
        return sum(t.numel() * t.element_size() for t in self.local.values())


class _GatherBlocks(torch.autograd.Function):
    """Forward: the ranks' :func:`row_block` blocks along ``dim`` all-gathered into the whole tensor. Backward: the
    whole gradient summed over the ranks (all-reduce), this rank's block of it."""

    @staticmethod
    def forward(ctx, block: torch.Tensor, dim: int, size: int, group) -> torch.Tensor:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        c = -(-size // world)
        moved = block.movedim(dim, 0)
        if moved.shape[0] < c:  # the last ranks' shorter (or empty) blocks, padded to the common block
            moved = torch.cat([moved, moved.new_zeros((c - moved.shape[0], *moved.shape[1:]))])
        out = moved.new_empty((world * c, *moved.shape[1:]))
        dist.all_gather_single(out, moved.contiguous(), group=group)
        ctx.dim, ctx.size, ctx.group, ctx.c, ctx.start, ctx.len = dim, size, group, c, rank * c, block.shape[dim]
        return out.narrow(0, 0, size).movedim(0, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        moved = grad.movedim(ctx.dim, 0)
        total = moved.new_zeros((dist.get_world_size(ctx.group) * ctx.c, *moved.shape[1:]))
        total[:ctx.size].copy_(moved)
        del moved
        dist.all_reduce(total, group=ctx.group)
        mine = total[min(ctx.start, ctx.size):min(ctx.start, ctx.size) + ctx.len].clone()
        return mine.movedim(0, ctx.dim), None, None, None


def gather_blocks(block: torch.Tensor, dim: int, size: int, group=None) -> torch.Tensor:
    """The whole tensor (``size`` entries along ``dim``) from every rank's :func:`row_block` block along ``dim`` (a
    collective of ``group``: every rank calls it in the same order), differentiable: the gradient of ``block`` is this
    rank's block of the whole tensor's gradient *summed over the ranks* — what a block needs when each rank's loss
    is its share of a global loss and every rank uses the whole tensor. (``DTensor.full_tensor``'s backward keeps the
    local block of a gradient it takes to be the same on every rank, i.e. one rank's share only.) The result is a
    view of the gathered buffer (non-contiguous for ``dim > 0``)."""
    return _GatherBlocks.apply(block, dim, size, group)


def check_finite_shards(stores: Mapping[str, ShardedEndpoints], ranks) -> None:
    """NonFiniteError on every rank (naming the endpoint and keys this rank found) when any rank's shard of any store
    holds a non-finite value (one all-reduce of the count)."""
    bad = [f"{name}: {k!r}" for name, store in stores.items() for k in store.nonfinite]
    count = ranks.all_reduce_(torch.tensor([float(len(bad))]))
    if float(count[0]):
        where = ", ".join(bad) if bad else "in another rank's rows"
        raise NonFiniteError(f"endpoint tensors with non-finite values ({where}); check the checkpoints")


def _sharded(t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.dim() > 0


def device_mesh(ranks, device: torch.device):
    """A 1-D ``DeviceMesh`` over ``ranks``' group (None for one process). ConfigError where the group's backend
    cannot carry ``device``'s tensors natively (DTensor collectives run on the tensors' own device)."""
    if ranks.world == 1:
        return None
    if ranks.device != device:
        raise ConfigError(f"sharded dual matching needs a process group whose backend carries {device.type} tensors "
                          f"(NCCL for CUDA, gloo for the CPU); this group stages them through {ranks.device}")
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(ranks.group or dist.group.WORLD, device.type)


# ------------------------------------------------------------------------------------------ transforms (FSDP2)
def shard_transforms(mods: Iterable[nn.Module], mesh) -> None:
    """Wrap every transform module with ``fully_shard`` (its parameters become ``Shard(0)`` DTensors; all-gathered
    in its forward, gradients reduce-scattered as sums; empty parameters stay plain). Its floating buffers — the
    trivialisation bases ``M₀`` and the orthogonal maps' bases — are first made frozen parameters
    (:func:`freeze_buffers`), so that FSDP shards them too. Nothing for one process."""
    if mesh is None:
        return
    from torch.distributed.fsdp import fully_shard

    for m in mods:
        freeze_buffers(m)
        empty = {p for p in m.parameters() if p.numel() == 0}  # e.g. no rotary pairs: FSDP cannot reduce-scatter them
        fully_shard(m, mesh=mesh, reshard_after_forward=True, ignored_params=empty or None)
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)


def freeze_buffers(m: nn.Module) -> None:
    """Every non-empty floating buffer of ``m`` and its submodules re-registered, under the same name, as a parameter
    with ``requires_grad=False`` (the same tensor: values, the module's forward and its state-dict keys unchanged) —
    state that ``fully_shard`` shards and all-gathers with the trainable parameters, and that no optimiser updates."""
    for mod in m.modules():
        for name, buf in list(mod._buffers.items()):
            if buf is not None and buf.is_floating_point() and buf.numel():
                del mod._buffers[name]
                mod.register_parameter(name, nn.Parameter(buf, requires_grad=False))


def unit_range(b, n: int, start: int, stop: int) -> tuple[int, int] | None:
    """The units ``[u0, u1)`` of binding ``b`` (an :class:`~modeconn.symmetry.spec.AxisBinding` of ``n`` units) whose
    entries lie in the block ``[start, stop)`` of its axis (``u0 == u1``: none); None when a unit straddles the block's
    boundary (the block cannot be transformed on its own)."""
    if start >= stop:
        return 0, 0
    first = lambda i: b.offset + i * b.step  # noqa: E731 (unit i's first entry)
    u0 = min(n, max(0, -(-(start - b.offset) // b.step)))
    u1 = max(u0, min(n, (stop - b.offset - b.block) // b.step + 1))
    if u0 > 0 and first(u0 - 1) + b.block > start:
        return None
    if u1 < n and first(u1) < stop:  # the next unit starts inside the block (at or after its start) but ends past it
        return None
    return u0, u1


def detached_element(m: nn.Module, units: tuple[int, int] | None = None) -> torch.Tensor:
    """``m()`` computed without autograd (FSDP all-gathers and frees the parameters around it), as a fresh leaf tensor
    that collects its gradient (``requires_grad``; never a view of the module's own storage) — only its units
    ``[u0, u1)`` (entries along dim 0) where ``units`` is given: the rank's share of a unit-wise element."""
    with torch.no_grad():
        e = m().detach()
        return (e if units is None else e[units[0]:units[1]]).clone().requires_grad_()


def element_gradient(grad: torch.Tensor | None, like: torch.Tensor, units: tuple[int, int] | None) -> torch.Tensor:
    """The gradient of the whole element ``like`` from the gradient of its units ``[u0, u1)`` (:func:`detached_element`;
    ``units=None``: the whole element), zero elsewhere and where ``grad`` is None (this rank's loss did not reach it):
    each rank back-propagates its own units' share and FSDP sums the ranks' parameter gradients."""
    if units is None and grad is not None:
        return grad
    out = torch.zeros_like(like)
    if grad is not None:
        out[units[0]:units[1]] = grad
    return out


def unsharded_element(m: nn.Module) -> torch.Tensor:
    """``m.element()`` of a transform module, with its parameters all-gathered first if it is sharded."""
    if not hasattr(m, "unshard"):
        return m.element()
    m.unshard()
    try:
        return m.element()
    finally:
        m.reshard()


# ------------------------------------------------------------------------------------------ the working model
def meta_work_model(model: nn.Module, keys: Iterable[str], device: torch.device) -> nn.Module:
    """A frozen fp32 eval-mode copy of ``model`` whose state-dict tensors (``keys``) live on the meta device (no
    memory; the lazy leaves supply them) and whose other buffers (e.g. rotary frequencies) are real, on ``device``.

    ``model`` may itself be on the meta device (e.g. built from a config): its non-persistent buffers are then
    initialised by the model's own ``_init_weights`` (Hugging Face models); ConfigError naming the buffer where
    that leaves one on the meta device."""
    keys = set(keys)
    memo: dict[int, Any] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if name in keys:
            ghost = torch.empty(t.shape, dtype=torch.float32 if t.is_floating_point() else t.dtype, device="meta")
            memo[id(t)] = nn.Parameter(ghost, requires_grad=False) if isinstance(t, nn.Parameter) else ghost
    work = copy.deepcopy(model, memo)
    _materialise_buffers(work, keys, device)
    work.requires_grad_(False)
    return work.eval()


def _materialise_buffers(work: nn.Module, keys: set[str], device: torch.device) -> None:
    for mod_name, mod in work.named_modules():
        names = [n for n, b in mod.named_buffers(recurse=False) if f"{mod_name}.{n}".lstrip(".") not in keys]
        if any(getattr(mod, n).is_meta for n in names):
            init = getattr(work, "_init_weights", None)
            if init is None:
                raise ConfigError(f"buffers {[f'{mod_name}.{n}' for n in names]} of the working model are on the meta "
                                  "device and the model cannot initialise them (no _init_weights); pass a model whose "
                                  "non-persistent buffers are real")
            for n in names:
                setattr(mod, n, torch.empty_like(getattr(mod, n), device=device))
            init(mod)
        for n, b in mod.named_buffers(recurse=False):
            if not b.is_meta and f"{mod_name}.{n}".lstrip(".") not in keys:
                setattr(mod, n, b.to(device, torch.float32) if b.is_floating_point() else b.to(device))


class LazyLeaves:
    """Installs lazy leaves on a :func:`meta_work_model`: every module owning state-dict tensors computes them with
    ``theta(key)`` inside its (checkpointed) forward. Set :attr:`theta` before each forward; ``theta=None`` runs
    the modules without recomputation (no autograd: verification)."""

    def __init__(self, work: nn.Module, keys: Iterable[str], aliases: Mapping[str, str]) -> None:
        keys = set(keys)
        self.theta: TheTheta | None = None
        self.checkpointed = True
        for prefix, mod in work.named_modules():
            own = [(n, f"{prefix}.{n}".lstrip(".")) for n, _ in [*mod.named_parameters(recurse=False),
                                                                  *mod.named_buffers(recurse=False)]]
            own = [(n, aliases.get(k, k)) for n, k in own if k in keys]
            if own:
                mod.forward = self._wrap(mod, own)

    def _wrap(self, mod: nn.Module, own: list[tuple[str, str]]) -> Callable[..., Any]:
        orig = type(mod).forward.__get__(mod)

        def run(*args, **kwargs):
            tensors = {n: self.theta(k) for n, k in own}
            with _swapped(mod, tensors):
                return orig(*args, **kwargs)

        def forward(*args, **kwargs):
            if not self.checkpointed or not torch.is_grad_enabled():
                return run(*args, **kwargs)
            from torch.utils.checkpoint import checkpoint

            return checkpoint(run, *args, use_reentrant=False, **kwargs)

        return forward


@contextlib.contextmanager
def _swapped(mod: nn.Module, tensors: Mapping[str, torch.Tensor]):
    """``mod``'s own parameters / buffers replaced by ``tensors`` for the duration (as ``functional_call`` does)."""
    saved = {}
    for n, t in tensors.items():
        table = mod._parameters if n in mod._parameters else mod._buffers
        saved[n] = (table, table[n])
        table[n] = t
    try:
        yield
    finally:
        for n, (table, t) in saved.items():
            table[n] = t
