"""Data parallelism for learned matching: the process group seen from one rank (``torch.distributed`` underneath).

:func:`init_distributed` starts the default process group from the environment ``torchrun`` sets (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``): NCCL with ``cuda:LOCAL_RANK`` where CUDA is
available, gloo on the CPU otherwise. :class:`Ranks` is what :func:`modeconn.match.dual_matching` uses: rank r's
contiguous shard of every global batch, the all-reduce of the flattened gradient, the per-step consistency check
of batches and λ, and a digest comparison of tensors that must be identical on every rank. One rank
(``world_size == 1``) is the single-process case: every operation is then the identity, with no communication.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .._util.digest import update_tensor
from ..errors import ConfigError, DistributedError

#: the device types each plain backend name communicates (a "cpu:gloo,cuda:nccl" string names them itself)
_BACKEND_DEVICES = {"gloo": ("cpu",), "mpi": ("cpu",), "nccl": ("cuda",), "ucc": ("cpu", "cuda"), "xccl": ("xpu",)}


@dataclass(frozen=True)
class DistributedInfo:
    """Where this process stands: ``rank`` of ``world_size`` (0 of 1 without ``torchrun``), ``local_rank`` on its
    node, the ``device`` it computes on, and ``initialized_here``: whether :func:`init_distributed` created the
    default process group (then the caller destroys it with ``torch.distributed.destroy_process_group()``)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    initialized_here: bool


def is_initialized() -> bool:
    """Whether a default ``torch.distributed`` process group exists in this process."""
    return dist.is_available() and dist.is_initialized()


def launched_world_size() -> int:
    """The number of processes: the default group's size if one exists, else ``torchrun``'s ``WORLD_SIZE``
    (known before the group is created, so callers can check options against it first), else 1."""
    if is_initialized():
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def current_rank() -> int:
    """This process's rank in the default process group (0 without one)."""
    return dist.get_rank() if is_initialized() else 0


def barrier() -> None:
    """Wait until every rank of the default process group gets here (nothing without one)."""
    if is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def init_distributed(device: str | torch.device | None = None, backend: str | None = None) -> DistributedInfo:
    """Create the default process group from ``torchrun``'s environment (idempotent; nothing to do without it).

    Args:
        device: where this rank computes; default ``cuda:LOCAL_RANK`` where CUDA is available, else ``cpu``
            (a CUDA device becomes the current device).
        backend: default ``"nccl"`` for a CUDA device, ``"gloo"`` for the CPU.
    Returns: :class:`DistributedInfo`. Without ``torchrun`` (no ``WORLD_SIZE`` > 1 in the environment) and without
        an existing group: rank 0 of 1 on ``device``, no group created. With an existing group: its rank and size.
    Raises: ConfigError for a ``LOCAL_RANK`` beyond the visible CUDA devices, or a backend that cannot communicate
        tensors of ``device``'s type (e.g. ``backend="nccl"`` with ``device="cpu"``).
    """
    local_rank = _env_int("LOCAL_RANK", 0)
    dev = torch.device(device) if device is not None else _default_device(local_rank)
    if dev.type == "cuda":
        _check_cuda_index(dev, local_rank)
        torch.cuda.set_device(dev)
    if is_initialized():
        return DistributedInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev, False)
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return DistributedInfo(0, 1, local_rank, dev, False)
    backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
    comm_device(backend, dev)  # ConfigError before the group is created
    dist.init_process_group(backend=backend, device_id=dev if dev.type == "cuda" else None)
    return DistributedInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev, True)


def comm_device(backend: str, device: torch.device) -> torch.device:
    """The device a group with ``backend`` communicates ``device``'s tensors on: ``device`` itself where the backend
    handles its type, else the CPU where it handles the CPU (gloo with CUDA tensors: staged through host memory).
    ``backend``: a plain name (``"gloo"``, ``"nccl"``, ...) or torch's ``"cpu:gloo,cuda:nccl"`` form.
    Raises: ConfigError naming the backend and the device type it cannot serve (e.g. NCCL with CPU tensors)."""
    types = _backend_device_types(backend)
    if types is None or device.type in types:
        return device
    if "cpu" in types:
        return torch.device("cpu")
    raise ConfigError(
        f"the process group's backend {backend!r} communicates {', '.join(types)} tensors, but the endpoints are on "
        f"{device.type}: move the endpoints to {types[0]} or create the group with a backend for {device.type} "
        "(gloo for the CPU: init_distributed(device='cpu'))"
    )


class Ranks:
    """The process group ``group`` (None: the default group) as one rank of dual matching sees it.

    ``rank`` / ``world``: this rank and the group size (0 / 1 for :meth:`single`); ``device``: the device the
    collectives run on (:func:`comm_device`). Every collective is the identity for one rank."""

    def __init__(self, group, rank: int, world: int, device: torch.device | None) -> None:
        self.group, self.rank, self.world, self.device = group, rank, world, device

    @classmethod
    def single(cls) -> Ranks:
        """One process, no communication."""
        return cls(None, 0, 1, None)

    @classmethod
    def resolve(cls, distributed: bool | None, process_group, device: torch.device) -> Ranks:
        """The ranks of a call with options ``distributed`` (None: use the default group if one exists; True:
        require one; False: single process) and ``process_group`` (a group to use instead of the default one).
        Raises ConfigError naming the option for a contradiction, a missing group, a process outside
        ``process_group`` or a backend that cannot communicate ``device``'s tensors."""
        if distributed is not None and not isinstance(distributed, bool):
            raise ConfigError(f"distributed must be None, True or False, got {distributed!r}")
        if process_group is not None and distributed is False:
            raise ConfigError("distributed=False contradicts process_group= (pass one or the other)")
        wanted = distributed is True or process_group is not None
        if not is_initialized():
            if wanted:
                raise ConfigError(
                    "distributed=True / process_group= need an initialised torch.distributed process group: launch "
                    "with torchrun and call modeconn.match.dual.init_distributed() first"
                )
            return cls.single()
        if distributed is False:
            return cls.single()
        rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
        if rank < 0:
            raise ConfigError(f"process_group: this process (global rank {dist.get_rank()}) is not a member of it")
        if world == 1:
            return cls.single()
        return cls(process_group, rank, world, comm_device(dist.get_backend(process_group), device))

    # ------------------------------------------------------------------ data
    def shard(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous block of rows of a global batch ``t`` (N, ...): ``torch.tensor_split(t, world)``,
        whose first ``N mod world`` blocks have one row more."""
        return t if self.world == 1 else torch.tensor_split(t, self.world)[self.rank]

    # ------------------------------------------------------------------ collectives (identities for one rank)
    def all_reduce_(self, t: torch.Tensor, op=None) -> torch.Tensor:
        """``t`` replaced in place by its sum (or ``op``, a ``torch.distributed.ReduceOp``) over ranks."""
        if self.world > 1:
            buf = t.to(self.device)
            dist.all_reduce(buf, op=op or dist.ReduceOp.SUM, group=self.group)
            t.copy_(buf)
        return t

    def gather(self, v: torch.Tensor) -> torch.Tensor:
        """The 1-D tensors ``v`` of every rank stacked: (world, len(v)), row r from rank r."""
        if self.world == 1:
            return v[None]
        parts = [torch.empty_like(v, device=self.device) for _ in range(self.world)]
        dist.all_gather(parts, v.to(self.device), group=self.group)
        return torch.stack(parts).to(v.device)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.world > 1:
            self.all_reduce_(torch.zeros(1, device=self.device))

    def all_reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over ranks (one all-reduce of the flattened vector; a missing gradient
        counts as zeros), so that each rank holds the gradient of the global loss."""
        if self.world == 1:
            return
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        self.all_reduce_(flat)
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad = g.view_as(p)

    def check_same(self, what: str, tensors: Iterable[torch.Tensor], extra: bytes = b"") -> None:
        """DistributedError naming ``what`` unless the bytes of ``tensors`` (and ``extra``) are identical on every
        rank (a sha256 digest per rank is compared)."""
        if self.world == 1:
            return
        h = hashlib.sha256(extra)
        for t in tensors:
            update_tensor(h, t, f"{t.dtype}/{tuple(t.shape)}")
        digest = torch.tensor([int.from_bytes(h.digest()[:7], "big")], dtype=torch.int64)
        got = self.gather(digest)[:, 0].tolist()
        if len(set(got)) > 1:
            differ = [r for r, d in enumerate(got) if d != got[0]]
            raise DistributedError(
                f"{what} differ between ranks (rank 0 vs ranks {differ}): every rank must get the same endpoints, "
                "options and loader, and run the same torch build"
            )


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer (set by torchrun)") from None


def _default_device(local_rank: int) -> torch.device:
    return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")


def _check_cuda_index(dev: torch.device, local_rank: int) -> None:
    index = dev.index if dev.index is not None else 0
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device {dev} (LOCAL_RANK={local_rank}) does not exist: {torch.cuda.device_count()} CUDA "
                          "device(s) visible; start at most that many processes per node")


def _backend_device_types(backend: str) -> tuple[str, ...] | None:
    """The device types ``backend`` communicates; None for an unknown plain name (assumed to serve any)."""
    backend = str(backend).lower()
    if ":" in backend:
        return tuple(part.split(":")[0].strip() for part in backend.split(",") if ":" in part)
    return _BACKEND_DEVICES.get(backend)
