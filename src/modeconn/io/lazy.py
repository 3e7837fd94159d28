"""Checkpoints larger than memory: lazy (memory-mapped) reading and shard-by-shard writing of safetensors weights.

The weights of a checkpoint directory are either one ``model.safetensors`` or Hugging Face shards listed by
``model.safetensors.index.json``::

    {"metadata": {"total_size": 2023862272}, "weight_map": {"gpt_neox.embed_in.weight": "model-00001-of-00002.safetensors", ...}}

(Absorbed checkpoints store the same under the stem :data:`ABSORBED_STEM` instead of ``model``.)

:class:`LazyCheckpoint` is a read-only ``Mapping[str, Tensor]`` over them. Opening it reads only the headers and
checks them (every listed shard exists and is complete, every key sits in the shard the index names, dtypes are
known); a tensor is read when it is looked up: its shard is opened with ``safetensors.safe_open`` for that one
access and the tensor is returned backed by a private (copy-on-write) memory map of the file, so its pages are
read from disk as they are touched and given back when the tensor is dropped. Peak memory therefore follows the
tensors alive at a time, not the checkpoint size; the files are never written to.

:func:`write_like` writes new tensors in the layout of an existing lazy checkpoint — the same shard file names
holding the same keys, the same index (``weight_map`` and ``metadata``), each shard's safetensors metadata — one
tensor at a time (the safetensors header is computed from the known shapes and dtypes and written first), into a
temporary directory renamed into place (:func:`modeconn.io.atomic_directory`): a failure leaves no partial output.

*Overlapping I/O with compute.* :class:`ReadAhead` runs ``load(key)`` for the next keys of a known order on one
background thread (``concurrent.futures``), at most ``depth`` keys ahead of the caller, and re-raises a load's
exception in the caller when that key is reached. :func:`write_like` produces the tensors that way, up to
:data:`WRITE_BEHIND` ahead of the file writes, so computing tensor ``i + 1`` overlaps writing tensor ``i``; the
streaming recipes (:mod:`modeconn.stream`) read their inputs with :meth:`LazyCheckpoint.read` (plain sequential
reads into memory) up to :data:`READ_AHEAD` keys ahead of the arithmetic, along :func:`write_order`. Memory stays
bounded by those depths: about ``(READ_AHEAD + 1)`` keys' input tensors plus ``(WRITE_BEHIND + 1)`` produced
tensors, whatever the model size.

Layering: this module sits with :mod:`modeconn.io` (no imports from symmetry/match/path); streaming weight
matching lives in :mod:`modeconn.match.weight`, streaming apply/merge and Hugging Face directories in
:mod:`modeconn.stream`.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from safetensors import SafetensorError, safe_open

from .._util.atomic import atomic_write_bytes
from .._util.jsonio import to_json
from ..checks import check_finite_stored
from ..errors import CheckpointError, ConfigError, StateDictMismatchError
from .checkpoint import WEIGHTS_NAME, atomic_directory
from .safe import PICKLE_SUFFIXES, SAFETENSORS_DTYPES, check_in_checkpoint, read_json_object, safetensors_dtype

INDEX_NAME = "model.safetensors.index.json"
"""The Hugging Face index of a sharded safetensors checkpoint (``weight_map``: key → shard file name)."""
ABSORBED_STEM = "modeconn-absorbed"
"""The file-name stem of an absorbed checkpoint's weights (:mod:`modeconn.symmetry.absorb`):
``modeconn-absorbed.safetensors``, or shards ``modeconn-absorbed-0000i-of-0000n.safetensors`` listed by
``modeconn-absorbed.safetensors.index.json``. These are not names transformers' ``from_pretrained`` looks for, so a
stock loader refuses the directory instead of loading it as a stock model that computes another function."""
WEIGHT_STEMS = ("model", ABSORBED_STEM)
"""The weights-file stems a :class:`LazyCheckpoint` looks for, in this order (``model``: Hugging Face's own)."""
INDEX_SUFFIX = ".safetensors.index.json"
"""How the name of every safetensors shard index ends (``<stem>.safetensors.index.json``)."""


def weight_names(stem: str) -> tuple[str, str]:
    """``(single weights file, shard index)`` names of the weights with file-name stem ``stem``."""
    return f"{stem}.safetensors", f"{stem}{INDEX_SUFFIX}"

READ_AHEAD = 2
"""Keys whose inputs the streaming recipes read ahead of the one being computed (:class:`ReadAhead`)."""
WRITE_BEHIND = 2
"""Tensors :func:`write_like` produces ahead of the one being written (each waits, finished, for the writer)."""
SYNC_BYTES = 128 << 20
"""Bytes :func:`write_like` writes to a shard between the flushes to disk it starts in the background."""

DTYPES: dict[str, torch.dtype] = SAFETENSORS_DTYPES
"""safetensors dtype names → torch dtypes (the dtypes a lazy checkpoint can hold)."""
_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor of a lazy checkpoint lives and what it is, from the safetensors header."""

    key: str
    shard: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.dtype.itemsize


@dataclass(frozen=True)
class ShardLayout:
    """How a checkpoint's tensors are laid out on disk: ``infos`` (key → :class:`TensorInfo`, in index order),
    ``shards`` (shard file name → its keys), ``shard_metadata`` (shard → safetensors ``__metadata__``) and ``index``
    (the index JSON object; ``None`` for a single ``model.safetensors``), ``stem`` (the weights' file-name stem,
    :data:`WEIGHT_STEMS`: the index is written as :attr:`index_name`). :attr:`LazyCheckpoint.layout` gives an
    existing checkpoint's; :meth:`plan` lays out new tensors the way ``save_pretrained`` does."""

    infos: Mapping[str, TensorInfo]
    shards: Mapping[str, tuple[str, ...]]
    shard_metadata: Mapping[str, Mapping[str, str] | None]
    index: Mapping[str, Any] | None
    stem: str = "model"

    @property
    def index_name(self) -> str:
        return weight_names(self.stem)[1]

    @classmethod
    def plan(cls, tensors: Mapping[str, tuple[torch.dtype, tuple[int, ...]]], max_shard_bytes: int,
             metadata: Mapping[str, str] | None = None, stem: str = "model") -> ShardLayout:
        """Tensors ``{key: (dtype, shape)}`` packed in order into shards of at most ``max_shard_bytes`` (a larger
        tensor gets a shard of its own): one ``<stem>.safetensors`` if everything fits, else
        ``<stem>-0000i-of-0000n.safetensors`` and an index with ``total_size``. ``metadata``: every shard's
        safetensors metadata (default ``{"format": "pt"}``). Raises ConfigError for a non-positive size."""
        if max_shard_bytes < 1:
            raise ConfigError(f"max_shard_bytes must be ≥ 1, got {max_shard_bytes}")
        groups: list[list[TensorInfo]] = [[]]
        size = 0
        for key, (dtype, shape) in tensors.items():
            info = TensorInfo(key, "", dtype, tuple(shape))
            if groups[-1] and size + info.nbytes > max_shard_bytes:
                groups.append([])
                size = 0
            groups[-1].append(info)
            size += info.nbytes
        n = len(groups)
        names = [weight_names(stem)[0]] if n == 1 else [f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        infos = {i.key: TensorInfo(i.key, name, i.dtype, i.shape) for name, grp in zip(names, groups, strict=False) for i in grp}
        meta = dict(metadata) if metadata is not None else {"format": "pt"}
        index = None if n == 1 else {"metadata": {"total_size": sum(i.nbytes for i in infos.values())},
                                     "weight_map": {k: i.shard for k, i in infos.items()}}
        return cls(infos, {name: tuple(i.key for i in grp) for name, grp in zip(names, groups, strict=False)},
                   dict.fromkeys(names, meta), index, stem)


class LazyTensors(Mapping[str, torch.Tensor]):
    """A read-only mapping of tensors read or computed when looked up, never held: what streaming weight matching
    (:mod:`modeconn.match.weight_stream`) reads tensor by tensor and row block by row block. Besides the mapping it
    gives each tensor's shape and dtype without reading it and reads rows along the first axis alone.
    :class:`LazyCheckpoint` (stored tensors) and :class:`~modeconn.symmetry.absorb_stream.AbsorbedView` (absorbed
    tensors, computed from stored ones) are the two; :func:`is_lazy` is the test the streaming code uses."""

    @abstractmethod
    def shape_of(self, key: str) -> tuple[int, ...]:
        """The shape of tensor ``key`` (no data read); KeyError for an unknown key."""

    @abstractmethod
    def meta(self) -> dict[str, torch.Tensor]:
        """``{key: meta tensor}`` with every tensor's shape and dtype (no data): for key/shape checks."""

    @abstractmethod
    def read_rows(self, key: str, start: int, count: int) -> torch.Tensor:
        """``self[key][start:start + count]`` (rows along the first axis), reading no more than those rows where it
        can. ValueError naming the key for rows outside the tensor (or a 0-d tensor)."""

    @abstractmethod
    def read_rows_at(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        """``self[key][rows]`` (``rows``: 1-D integer indices along the first axis, any order), reading no more than
        those rows where it can. ValueError naming the key for a row outside the tensor."""


def is_lazy(sd: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``sd`` is read tensor by tensor (a :class:`LazyTensors`), so that weight matching streams it."""
    return isinstance(sd, LazyTensors)


class LazyCheckpoint(LazyTensors):
    """The weights of a checkpoint directory (``model.safetensors`` or shards + ``model.safetensors.index.json``),
    read tensor by tensor.

    ``ckpt[key]`` is a CPU tensor of the stored dtype and shape, backed by a private memory map of its shard (read
    lazily by the OS, released when the tensor is dropped; writing to it never reaches the file). ``ckpt.meta()``
    gives the same keys as meta tensors (shapes and dtypes, no data) for cheap checks. The mapping is read-only.

    Layout: a single ``model.safetensors`` is used when present (as transformers does), else the index; a directory
    with neither is read under the next stem of :data:`WEIGHT_STEMS` (an absorbed checkpoint's
    ``modeconn-absorbed.safetensors`` / its index). Also accepts the path of one ``.safetensors`` file.

    Attributes: ``path`` (the directory), ``infos`` (key → :class:`TensorInfo`, in index/header order), ``shards``
    (shard file name → its keys), ``index`` (the parsed index JSON, ``None`` for a single file), ``shard_metadata``
    (shard → its safetensors ``__metadata__`` or ``None``), ``stem`` (the weights' file-name stem found,
    :data:`WEIGHT_STEMS`) and ``index_name``.

    Raises (on opening, before any tensor is read): CheckpointError naming the directory or file — no weights
    (pickle-only weights are refused), an invalid index (not JSON, no ``weight_map``, a shard name with a path in
    it), shards listed in the index but missing on disk (named, with how many keys and one key they should hold),
    a truncated or corrupt shard, a key of the index absent from its shard or a shard holding keys the index does
    not list, a tensor in two shards, a dtype modeconn cannot read, a shard or the index that is a symlink leaving
    the checkpoint's tree (:func:`modeconn.io.check_in_checkpoint`; Hugging Face cache blobs are allowed).
    On access: KeyError for an unknown key,
    CheckpointError naming the file and key if the shard changed or vanished since opening; NonFiniteError naming the
    file and key when a floating tensor (or the rows read of it) holds NaN/Inf — every read checks, before the tensor
    is returned to anything that would compute with it.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        # a setup in steps, each check in the same order as ever (the first problem found is the one reported):
        # locate the files, refuse symlinks out of the tree, read the index, read the shard headers, cross-check
        self.path, single = self._locate(Path(path))
        self.stem = single.name.removesuffix(".safetensors")
        self.index_name = weight_names(self.stem)[1]
        self.index: dict[str, Any] | None = None
        self._check_side_links(single)
        weight_map, shards = self._read_layout(single)
        self.infos: dict[str, TensorInfo] = {}
        self.shards: dict[str, tuple[str, ...]] = {}
        self.shard_metadata: dict[str, dict[str, str] | None] = {}
        found = self._read_headers(shards)
        self.infos = found if weight_map is None else self._check_against_index(weight_map, found)
        self._finite: set[str] = set()  # keys read whole and found finite (weight matching re-reads them every sweep)

    # ------------------------------------------------------------------ opening (steps of __init__)
    @staticmethod
    def _locate(path: Path) -> tuple[Path, Path]:
        """``(checkpoint directory, its single-file weights path)`` for a directory or one ``.safetensors`` file."""
        if path.is_file() and path.suffix == ".safetensors":
            return path.parent, path
        if path.is_dir():
            names = [weight_names(stem) for stem in WEIGHT_STEMS]
            found = [single for single, index in names if (path / single).is_file() or (path / index).is_file()]
            return path, path / (found[0] if found else WEIGHTS_NAME)
        raise CheckpointError(f"{path}: checkpoint directory not found")

    def _check_side_links(self, single: Path) -> None:
        """The single weights file and the index, where present: symlinked out of the checkpoint, refused before
        any read."""
        for file in (single, self.path / self.index_name):
            if file.is_file():
                check_in_checkpoint(file, self.path)

    def _read_layout(self, single: Path) -> tuple[dict[str, str] | None, list[str]]:
        """``(weight_map, shard names)``: ``(None, [single])`` for one file, else from the index (checked)."""
        if single.is_file():
            return None, [single.name]
        if (self.path / self.index_name).is_file():
            weight_map = self._read_index()
            shards = list(dict.fromkeys(weight_map.values()))
            self._check_shard_names(shards)
            self._check_shards_present(weight_map, shards)
            return weight_map, shards
        raise self._no_weights_error()

    def _read_index(self) -> dict[str, str]:
        """Parse the index into ``self.index``; return its ``weight_map`` (tensor name → shard file name)."""
        self.index = read_json_object(self.path / self.index_name, "safetensors index")
        weight_map = self.index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise CheckpointError(f"{self.path / self.index_name}: 'weight_map' must map tensor names to shard file names")
        return weight_map

    def _check_shard_names(self, shards: list[str]) -> None:
        bad = [s for s in shards if Path(s).name != s or not s.endswith(".safetensors")]
        if bad:
            raise CheckpointError(f"{self.path / self.index_name}: shard names must be plain *.safetensors file names "
                                  f"in the checkpoint directory, got {bad}")

    def _check_shards_present(self, weight_map: dict[str, str], shards: list[str]) -> None:
        missing = [s for s in shards if not (self.path / s).is_file()]
        if missing:
            listed = {s: [k for k, v in weight_map.items() if v == s] for s in missing}
            raise CheckpointError(
                f"{self.path}: shard(s) listed in {self.index_name} but missing on disk: "
                + "; ".join(f"{s} ({len(ks)} tensors, e.g. {ks[0]!r})" for s, ks in listed.items())
            )

    def _no_weights_error(self) -> CheckpointError:
        pickles = sorted(p.name for p in self.path.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
        hint = (f"; only pickle weights ({', '.join(pickles)}), which are not loaded because unpickling can "
                "execute arbitrary code — convert them to safetensors") if pickles else ""
        return CheckpointError(f"{self.path}: no {WEIGHTS_NAME} and no {INDEX_NAME}{hint}")

    def _read_headers(self, shards: list[str]) -> dict[str, TensorInfo]:
        """Every shard's header (all shards' symlinks checked first), filling ``shards`` and ``shard_metadata``;
        returns key → :class:`TensorInfo` in shard and header order. A tensor in two shards is refused."""
        found: dict[str, TensorInfo] = {}
        for shard in shards:
            check_in_checkpoint(self.path / shard, self.path)
        for shard in shards:
            header, meta = _read_header(self.path / shard)
            self.shard_metadata[shard] = meta
            for key, (dtype, shape) in header.items():
                if key in found:
                    raise CheckpointError(f"{self.path}: tensor {key!r} is stored twice, in {found[key].shard} and {shard}")
                found[key] = TensorInfo(key, shard, dtype, shape)
            self.shards[shard] = tuple(header)
        return found

    def _check_against_index(self, weight_map: dict[str, str], found: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
        """The headers agree with the index (every listed key in its shard, no unlisted key); returns the infos
        in index order."""
        absent = [k for k, s in weight_map.items() if found.get(k) is None or found[k].shard != s]
        if absent:
            k = absent[0]
            where = f"it is in {found[k].shard}" if k in found else "no shard listed in the index holds it"
            raise CheckpointError(f"{self.path / self.index_name}: {len(absent)} tensor(s) not in the shard the index "
                                  f"names, e.g. {k!r} → {weight_map[k]} ({where})")
        unlisted = [k for k in found if k not in weight_map]
        if unlisted:
            raise CheckpointError(f"{self.path}: shard {found[unlisted[0]].shard} holds tensors {unlisted[:5]} that "
                                  f"{self.index_name} does not list (index and shards out of sync)")
        return {k: found[k] for k in weight_map}

    # ------------------------------------------------------------------ Mapping
    def __getitem__(self, key: str) -> torch.Tensor:
        info = self.infos[key]  # KeyError for unknown keys, as a dict
        file = self.path / info.shard
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                t = f.get_tensor(key)
        except (SafetensorError, OSError, RuntimeError) as err:
            raise CheckpointError(f"{file}: reading tensor {key!r} failed (file changed, truncated or removed since "
                                  f"the checkpoint was opened?): {err}") from None
        if t.dtype != info.dtype or tuple(t.shape) != info.shape:
            raise CheckpointError(f"{file}: tensor {key!r} is {t.dtype} {tuple(t.shape)} but the header read at opening "
                                  f"said {info.dtype} {info.shape} (file changed since?)")
        return self._checked(t, key)

    def read(self, key: str) -> torch.Tensor:
        """``self[key]`` read into memory with plain sequential reads (no memory map; what :class:`ReadAhead` loads
        on its thread: the read releases the GIL, and the pages are not faulted in later by whoever computes).
        Same dtype, shape and values as ``self[key]``. Raises KeyError for an unknown key, CheckpointError naming
        the file and key if the shard changed (its header no longer places the tensor as at opening) or vanished."""
        info = self.infos[key]
        if sys.byteorder != "little":  # safetensors data is little-endian: let safetensors convert
            return self[key]
        return self._checked(self._read_span(info, 0, info.nbytes).view(info.dtype).reshape(info.shape), key)

    def read_rows(self, key: str, start: int, count: int) -> torch.Tensor:
        """Rows ``start … start + count − 1`` of ``self[key]`` along its first axis (contiguous in the file), read
        into memory like :meth:`read` without touching the rest of the tensor: shape ``(count, *shape[1:])``, same
        dtype and values as ``self[key][start:start + count]``. Raises ValueError for rows outside the tensor (or a
        0-d tensor), otherwise as :meth:`read`."""
        info = self.infos[key]
        if not info.shape or start < 0 or count < 0 or start + count > info.shape[0]:
            raise ValueError(f"rows {start}:{start + count} of tensor {key!r} of shape {info.shape}")
        if sys.byteorder != "little":
            return self[key][start:start + count].clone()
        row = info.nbytes // info.shape[0] if info.shape[0] else 0
        t = self._read_span(info, start * row, count * row).view(info.dtype).reshape(count, *info.shape[1:])
        return self._checked(t, key, f" (rows {start}:{start + count})")

    def _checked(self, t: torch.Tensor, key: str, rows: str = "") -> torch.Tensor:
        """``t`` (tensor ``key``, or its ``rows``) once checked finite (:func:`modeconn.checks.check_finite_stored`:
        NonFiniteError naming the file and tensor); a whole tensor found finite is not scanned again."""
        if key not in self._finite:
            check_finite_stored(t, self.path / self.infos[key].shard, key, rows)
            if not rows:
                self._finite.add(key)
        return t

    def read_rows_at(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        """``self[key][rows]`` (``rows``: 1-D integer indices along the first axis, any order) read into memory like
        :meth:`read_rows`, each run of consecutive rows with one read, without touching the other rows. Raises
        ValueError for a row outside the tensor, otherwise as :meth:`read`."""
        info = self.infos[key]
        idx = rows.tolist()
        if not info.shape or any(not 0 <= r < info.shape[0] for r in idx):
            raise ValueError(f"rows outside tensor {key!r} of shape {info.shape}")
        if sys.byteorder != "little":
            return self[key].index_select(0, rows.long()).clone()
        row = info.nbytes // info.shape[0] if info.shape[0] else 0
        runs, i = [], 0
        while i < len(idx):
            j = i + 1
            while j < len(idx) and idx[j] == idx[j - 1] + 1:
                j += 1
            runs.append((idx[i] * row, (j - i) * row))
            i = j
        t = self._read_runs(info, runs).view(info.dtype).reshape(len(idx), *info.shape[1:])
        return self._checked(t, key, f" ({len(idx)} rows)")

    def _read_span(self, info: TensorInfo, offset: int, nbytes: int) -> torch.Tensor:
        """``nbytes`` bytes of tensor ``info`` from byte ``offset`` of its data, as a uint8 tensor (plain reads)."""
        return self._read_runs(info, [(offset, nbytes)])

    def _read_runs(self, info: TensorInfo, runs: Sequence[tuple[int, int]]) -> torch.Tensor:
        """The bytes of tensor ``info`` at each ``(offset, nbytes)`` of ``runs`` (offsets into its data), one after
        the other in a uint8 tensor: one open of the shard, plain reads."""
        file = self.path / info.shard
        try:
            with open(file, "rb", buffering=0) as fh:
                start, end = _data_offsets(fh).get(info.key, (0, -1))
                if end - start != info.nbytes:
                    raise CheckpointError(f"{file}: tensor {info.key!r} is not where the header read at opening "
                                          "placed it (file changed since?)")
                buf = torch.empty(sum(n for _, n in runs), dtype=torch.uint8)
                view, done = memoryview(buf.numpy()), 0
                for offset, nbytes in runs:
                    fh.seek(start + offset)
                    stop = done + nbytes
                    while done < stop:
                        got = fh.readinto(view[done:stop])
                        if not got:
                            raise CheckpointError(f"{file}: tensor {info.key!r} is truncated (file changed since "
                                                  "opening?)")
                        done += got
        except (OSError, ValueError, KeyError, struct.error) as err:
            raise CheckpointError(f"{file}: reading tensor {info.key!r} failed (file changed, truncated or removed "
                                  f"since the checkpoint was opened?): {err}") from None
        return buf

    def check_finite(self) -> None:
        """Read every tensor once, one at a time (:meth:`read`): NonFiniteError naming the file and the first tensor
        with NaN/Inf. For weights that another library (transformers' ``from_pretrained``) will load."""
        for key in self.infos:
            self.read(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.infos)

    def __len__(self) -> int:
        return len(self.infos)

    def __contains__(self, key: object) -> bool:
        return key in self.infos

    def __repr__(self) -> str:
        return (f"LazyCheckpoint({str(self.path)!r}, {len(self)} tensors in {len(self.shards)} shard(s), "
                f"{self.nbytes / 2**30:.2f} GiB)")

    # ------------------------------------------------------------------ header information
    @property
    def dtypes(self) -> dict[str, torch.dtype]:
        """``{key: dtype}`` from the headers (for dtype-kind checks, :func:`modeconn.io.check_dtype_kinds`)."""
        return {k: i.dtype for k, i in self.infos.items()}

    def meta(self) -> dict[str, torch.Tensor]:
        """``{key: meta tensor}`` with every tensor's shape and dtype (no data): for key/shape checks."""
        return {k: torch.empty(i.shape, dtype=i.dtype, device="meta") for k, i in self.infos.items()}

    def shape_of(self, key: str) -> tuple[int, ...]:
        """The shape of tensor ``key`` from the header read at opening; KeyError for an unknown key."""
        return self.infos[key].shape

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data in the checkpoint."""
        return sum(i.nbytes for i in self.infos.values())

    @property
    def layout(self) -> ShardLayout:
        """The checkpoint's :class:`ShardLayout` (to write new tensors the same way, :func:`write_like`)."""
        return ShardLayout(self.infos, self.shards, self.shard_metadata, self.index, self.stem)

    @property
    def sharded(self) -> bool:
        """Whether the weights are Hugging Face shards with an index (else one ``model.safetensors``)."""
        return self.index is not None


def _data_offsets(fh) -> dict[str, tuple[int, int]]:
    """``{key: (start, end)}`` byte offsets in the open safetensors file ``fh`` (from its JSON header)."""
    (size,) = struct.unpack("<Q", fh.read(8))
    header = json.loads(fh.read(size))
    base = 8 + size
    return {k: (base + v["data_offsets"][0], base + v["data_offsets"][1]) for k, v in header.items()
            if k != "__metadata__"}


T = TypeVar("T")


class ReadAhead(Generic[T]):
    """``load(key)`` for ``keys`` in their order, computed up to ``depth`` keys ahead of the caller on one background
    thread (a ``concurrent.futures`` executor), so that reading (or producing) the next keys overlaps the caller's
    work on the current one.

    :meth:`get` returns ``load(key)``: for the next key of the order the value loaded ahead (an exception its load
    raised is re-raised here, in the caller), for any other key a load run now in the caller. Memory: at most
    ``depth`` values loaded ahead plus those the caller holds. ``depth`` 0 loads everything in the caller. Use it as
    a context manager (or call :meth:`close`): loads not started are cancelled and the running one is waited for.
    ``load`` runs on one thread at a time, in the order of ``keys``, so it needs no locking of its own.
    """

    def __init__(self, keys: Iterable[str], load: Callable[[str], T], depth: int = READ_AHEAD) -> None:
        if depth < 0:
            raise ConfigError(f"read-ahead depth must be ≥ 0, got {depth}")
        self._keys, self._load = iter(keys), load
        self._pending: deque[tuple[str, Future]] = deque()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modeconn-io") if depth else None
        for _ in range(depth):
            self._submit()

    def _submit(self) -> None:
        key = next(self._keys, None)
        if key is not None and self._pool is not None:
            self._pending.append((key, self._pool.submit(self._load, key)))

    def get(self, key: str) -> T:
        if self._pending and self._pending[0][0] == key:
            _, future = self._pending.popleft()
            self._submit()
            return future.result()
        return self._load(key)

    def close(self) -> None:
        for _, future in self._pending:
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ReadAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_order(like: LazyCheckpoint | ShardLayout) -> list[str]:
    """The order in which :func:`write_like` produces the keys of ``like``: shard by shard, in each shard the widest
    dtype first (so that every tensor is aligned), header order among equals."""
    like = like.layout if isinstance(like, LazyCheckpoint) else like
    return [k for keys in like.shards.values() for k in sorted(keys, key=lambda k: -like.infos[k].dtype.itemsize)]


def _read_header(file: Path) -> tuple[dict[str, tuple[torch.dtype, tuple[int, ...]]], dict[str, str] | None]:
    """``({key: (dtype, shape)}, metadata)`` of one safetensors file; opening it validates that the file is complete.
    Raises CheckpointError naming the file (missing, pickle, truncated/corrupt, unknown dtype)."""
    if file.suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(f"{file}: pickle-based weight files are not loaded (unpickling can execute code)")
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            meta, keys = f.metadata(), f.keys()
            entries = {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in keys}
    except (SafetensorError, OSError, RuntimeError) as err:
        raise CheckpointError(f"{file}: not a valid safetensors file (truncated or corrupt?): {err}") from None
    return {k: (safetensors_dtype(name, file, k), shape) for k, (name, shape) in entries.items()}, meta


# --------------------------------------------------------------------------------------------- writing


def write_like(
    out: str | os.PathLike,
    like: LazyCheckpoint | ShardLayout,
    produce: Callable[[str], torch.Tensor],
    *,
    files: Mapping[str, str | os.PathLike | bytes | Mapping] | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
    inputs: Sequence[str | os.PathLike] = (),
    command: str = "",
) -> Path:
    """Write a checkpoint directory holding ``produce(key)`` for every key of ``like`` (a lazy checkpoint, or a
    :class:`ShardLayout` e.g. from :meth:`ShardLayout.plan`), in ``like``'s layout.

    Same shard file names with the same keys (a single ``model.safetensors`` stays single), each shard's safetensors
    metadata kept, the index rewritten with the same ``weight_map`` and ``metadata``. Tensors are produced and
    written one at a time, in :func:`write_order` (each shard's widest dtype first, so every tensor is aligned);
    ``produce`` runs on a background thread up to :data:`WRITE_BEHIND` tensors ahead of the writes (one call at a
    time, in that order; its exceptions are re-raised here), so peak memory is about ``WRITE_BEHIND + 1`` produced
    tensors plus what ``produce`` holds. ``files`` adds other files: name → a path to copy, bytes, or a JSON object.
    ``progress(done, total)`` is called after every tensor. ``out`` may not be, contain or lie inside ``inputs`` (the
    checkpoints it is made from; ``like``'s own directory is always one); ``command`` goes into its ownership marker.

    Returns: ``out``. The directory appears complete or not at all (:func:`modeconn.io.atomic_directory`).
    Raises: StateDictMismatchError if a produced tensor's shape or dtype differs from ``like``'s (names the key);
        CheckpointError if ``out`` exists and is not empty (without ``overwrite``) or writing fails, or a file of
        ``files`` to copy is a symlink leaving its directory (checked before anything is written); whatever
        ``produce`` raises (the output is then not created).
    """
    sources = [*inputs, like.path] if isinstance(like, LazyCheckpoint) else list(inputs)
    like = like.layout if isinstance(like, LazyCheckpoint) else like
    files = dict(files or {})
    reserved = {like.index_name, *like.shards}
    clash = [n for n in files if n in reserved or Path(n).name != n]
    if clash:
        raise CheckpointError(f"{out}: extra files {clash} would overwrite weights or are not plain file names")
    # a file copied in must not be a symlink out of its own directory (the checkpoint of a side file): refused
    # before anything is written; the real path checked is the one copied
    files = {n: check_in_checkpoint(v, Path(v).parent) if isinstance(v, (str, os.PathLike)) else v
             for n, v in files.items()}
    payloads = {n: to_json(v, f"{out}/{n}", nan="null").encode() if isinstance(v, Mapping) else v for n, v in files.items()}
    total, done = len(like.infos), 0

    def checked(key: str) -> torch.Tensor:  # runs on the producing thread, WRITE_BEHIND tensors ahead
        t = produce(key)
        info = like.infos[key]
        if not isinstance(t, torch.Tensor) or t.dtype != info.dtype or tuple(t.shape) != info.shape:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise StateDictMismatchError(f"tensor {key!r}: produced {got}, expected {info.dtype} {info.shape}")
        return t.detach().to("cpu").contiguous()

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    order = write_order(like)
    with atomic_directory(out, overwrite, "checkpoint", inputs=sources, command=command) as tmp, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="modeconn-sync") as syncer, \
            ReadAhead(order, checked, WRITE_BEHIND) as produced:
        synced = []
        for shard, keys in like.shards.items():
            infos = [like.infos[k] for k in sorted(keys, key=lambda k: -like.infos[k].dtype.itemsize)]
            synced.append(_write_safetensors(tmp / shard, infos, produced.get, like.shard_metadata[shard], tick, syncer))
        for future in synced:  # every shard on disk before the directory is renamed into place
            future.result()
        if like.index is not None:
            index = {**like.index, "weight_map": {k: i.shard for k, i in like.infos.items()}}
            atomic_write_bytes(tmp / like.index_name, to_json(index, str(tmp / like.index_name)).encode())
        for name, payload in payloads.items():
            if isinstance(payload, bytes):
                atomic_write_bytes(tmp / name, payload)
            else:
                shutil.copyfile(payload, tmp / name)
    return Path(out)


def _write_safetensors(file: Path, infos: list[TensorInfo], produce: Callable[[str], torch.Tensor],
                       metadata: Mapping[str, str] | None, tick: Callable[[], None],
                       syncer: ThreadPoolExecutor) -> Future:
    """A safetensors file written tensor by tensor: the header (offsets from the known shapes) first, then each
    tensor's bytes as it is produced (little-endian, C order, as the format prescribes).

    Flushing to disk is behind the writes, on ``syncer`` (one thread): every :data:`SYNC_BYTES` written an
    ``fdatasync`` is started (at most one in flight), so the disk writes while the next tensors are produced, and the
    returned future closes the file after its ``fsync`` — the caller waits for it before the directory is renamed
    into place (atomic outputs are complete on disk)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for i in infos:
        header[i.key] = {"dtype": _NAMES[i.dtype], "shape": list(i.shape), "data_offsets": [offset, offset + i.nbytes]}
        offset += i.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # pad the header so that the data starts 8-byte aligned
    fh = open(file, "wb")  # noqa: SIM115 (closed by _close_synced, on the syncer thread, or below on error)
    pending: Future | None = None
    try:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        unsynced = 0
        for i in infos:
            t = produce(i.key).reshape(-1)
            fh.write(memoryview(t.view(torch.uint8).numpy()))
            unsynced += i.nbytes
            del t
            if unsynced >= SYNC_BYTES and (pending is None or pending.done()):
                if pending is not None:
                    pending.result()  # an OSError of the last flush, here
                fh.flush()
                pending, unsynced = syncer.submit(os.fdatasync, fh.fileno()), 0
            tick()
        fh.flush()
    except BaseException:
        if pending is not None:
            pending.exception()  # wait: the descriptor must outlive the flush
        fh.close()
        raise
    return syncer.submit(_close_synced, fh, pending)


def _close_synced(fh, pending: Future | None) -> None:
    """After the last periodic flush, ``fsync`` and close (on the syncer thread)."""
    try:
        if pending is not None:
            pending.result()
        os.fsync(fh.fileno())
    finally:
        fh.close()
