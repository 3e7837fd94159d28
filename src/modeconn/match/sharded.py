"""Sharded dual matching: endpoints and learned transforms split over the ranks (``dual_matching(..., shard=True)``).

The data-parallel mode (:mod:`modeconn.match.distributed`) keeps both endpoints whole on every rank. The sharded
mode is the same computation (same batches split the same way, same λ, same Adam steps on the same global loss)
with ZeRO-3 / FSDP storage, built from PyTorch's own sharding:

* **Frozen endpoint tensors** are ``torch.distributed.tensor.DTensor`` shards with placement ``Shard(0)``: rank r of
  W holds rows ``[r·c, min((r+1)·c, n))`` of every tensor with ``n`` rows, ``c = ⌈n / W⌉`` (:func:`row_block`:
  ``torch.chunk`` semantics, which is DTensor's own split; the last ranks may hold fewer or no rows), in the stored
  dtype. They are read per rank from safetensors (``safe_open(...).get_slice(key)[start:stop]``: only those rows
  are read) — or sliced from an in-memory / lazy mapping. B's tensors that a discrete (weight-matching) part acts
  on are read whole one at a time, permuted, and sliced (one tensor transiently, never the model).
  Integer tensors and scalars are kept whole on every rank (the spec never acts on them).
* **Learned transforms** (Cayley / polar parameters of both sides) are wrapped with FSDP2
  (``torch.distributed.fsdp.fully_shard``): each rank stores ``1/W`` of every parameter and of its Adam state; the
  parameters are all-gathered when the transform's element is computed and the gradients reduce-scattered (summed,
  not averaged: each rank's loss is already its weighted share of the global mean). The trivialisation bases (the
  modules' floating buffers) are made frozen parameters first (:func:`freeze_buffers`), so FSDP shards them too.
  Each step computes the elements without autograd (:func:`detached_element`) and feeds them to the model as leaf
  tensors; after the model's backward pass each module's element is recomputed with autograd and back-propagated
  from its gradient, one module at a time — the chain rule's gradients, without any transform's graph held while
  the activations are.
* **Use.** Every module of the working model that owns state-dict tensors (embeddings, linears) is a *lazy leaf*:
  its forward all-gathers its endpoint tensors (``DTensor.full_tensor()``), applies the continuous transforms
  (``plan.act_key``), interpolates ``θ_k(λ) = (1−λ)·π_A(a_k) + λ·π_B(b_k)`` in fp32 and runs the module on it,
  all inside ``torch.utils.checkpoint`` (non-reentrant), so that only the leaf's input is saved and the
  materialisation is recomputed (all-gathered again) in the backward pass — at any time one leaf's full tensors
  exist. The working model's own parameters live on the meta device (no memory).

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
    :class:`~modeconn.io_stream.LazyCheckpoint` for an unreadable directory."""

    def __init__(self, source: Source) -> None:
        if isinstance(source, (str, os.PathLike)):
            from ..io_stream import LazyCheckpoint

            self.ckpt = LazyCheckpoint(Path(source))
            self.mapping: Mapping[str, torch.Tensor] = self.ckpt
            self.meta = self.ckpt.meta()
        else:
            self.ckpt = None
            self.mapping = source
            self.meta = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in source.items()}

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of tensor ``key`` (a fresh tensor of the stored dtype in process memory, not a view
        of the file; scalars whole)."""
        if self.ckpt is None:
            t = self.mapping[key].detach()
            return (t if t.dim() == 0 else t[start:stop]).cpu().clone()
        from safetensors import safe_open

        info = self.ckpt.infos[key]
        with safe_open(str(self.ckpt.path / info.shard), framework="pt", device="cpu") as f:
            sl = f.get_slice(key)
            # copied out of the file's memory map: a view would keep the map, whose resident pages (the kernel maps
            # cached neighbours of every page touched) can be several times the rows' bytes
            return (sl[:] if not info.shape else sl[start:stop]).clone()

    def whole(self, key: str) -> torch.Tensor:
        return self.mapping[key].detach().cpu()


# ------------------------------------------------------------------------------------------ the sharded store
class ShardedEndpoints:
    """The frozen tensors of one endpoint, rank ``rank`` of ``world`` holding its :func:`row_block` of each floating
    tensor with at least one dimension (stored dtype), the others whole.

    ``full(key)`` all-gathers tensor ``key`` (``DTensor.from_local(...).full_tensor()``; a collective: every rank
    calls it for the same keys in the same order) and returns it in fp32 on ``device``."""

    def __init__(self, local: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], mesh, device) -> None:
        self.local, self.shapes, self.mesh, self.device = local, shapes, mesh, device
        self.nonfinite = [k for k, t in local.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]

    @classmethod
    def load(cls, reader: RowReader, keys: Iterable[str], rank: int, world: int, mesh, device: torch.device,
             whole: Callable[[str], torch.Tensor | None] | None = None) -> ShardedEndpoints:
        """This rank's shards of ``keys``; ``whole(key)``, where it returns a tensor, supplies the full tensor to slice
        (B with its discrete part applied) instead of reading the rows. :attr:`nonfinite`: the keys whose shard holds
        a non-finite value (see :func:`check_finite_shards`)."""
        local, shapes = {}, {}
        for key in keys:
            meta = reader.meta[key]
            shapes[key] = tuple(meta.shape)
            start, stop = row_block(meta.shape[0], rank, world) if _sharded(meta) else (0, 0)
            full = whole(key) if whole is not None else None
            if full is not None:
                t = full[start:stop].clone() if _sharded(meta) else full.clone()
            else:
                t = reader.rows(key, start, stop) if _sharded(meta) else reader.whole(key).clone()
            local[key] = t.to(device)
        return cls(local, shapes, mesh, device)

    def full(self, key: str) -> torch.Tensor:
        t = self.local[key]
        if not _sharded(t) or self.mesh is None:
            return t.float() if t.is_floating_point() else t
        from torch.distributed.tensor import DTensor, Shard

        shape = torch.Size(self.shapes[key])
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(t, self.mesh, [Shard(0)], shape=shape, stride=stride).full_tensor().float()

    def nbytes(self) -> int:
        """Bytes this rank stores."""
        return sum(t.numel() * t.element_size() for t in self.local.values())


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


def detached_element(m: nn.Module) -> torch.Tensor:
    """``m()`` computed without autograd (FSDP all-gathers and frees the parameters around it), as a fresh leaf tensor
    that collects its gradient (``requires_grad``; never a view of the module's own storage)."""
    with torch.no_grad():
        return m().detach().clone().requires_grad_()


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
