"""Normalization absorption of a checkpoint directory, one tensor at a time (checkpoints larger than memory).

Absorption (:mod:`modeconn.symmetry.absorb`) is tensor-local, so it needs no model in memory: every output tensor
is a function of one stored tensor and the (small) norm vectors —

* a residual writer (embedding rows, attention-output and MLP-output rows and biases, position embeddings) minus
  its mean along the stream axis (LayerNorm families: ``center``);
* a linear layer reading a norm's output: ``W diag(γ)`` with ``γ = offset + w`` (Gemma: ``1 + w``), and a bias
  ``b + W β`` (created where the layer had none and ``β`` exists: ``fold``);
* a tied alias (an LM head sharing the embedding) gets its own copy of the primary's stored tensor, then folded
  (``untie``); norm parameters are dropped (the norms become :class:`~modeconn.symmetry.hf.ScaleFreeRMSNorm`).

:class:`AbsorbedView` is a read-only mapping of the absorbed tensors (model state-dict names), computed when looked
up — what streaming weight matching reads; :func:`stream_absorb` writes it as an absorbed checkpoint
(``config.json`` with ``modeconn_absorbed`` + safetensors shards) that :func:`~modeconn.symmetry.absorb.load_absorbed`
and :func:`modeconn.stream.hf_checkpoint_spec` read. Arithmetic as in memory: the stored tensor in fp32, the fold
in fp64, cast to fp32 and then to the stored dtype — equal to :func:`~modeconn.symmetry.absorb.absorb_normalization`
followed by the same cast (tested on every pre-norm family). Unlike the in-memory version no output check runs here
(it would need the model in memory); the construction is the same, step by step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import UnsupportedOperationError
from ..io.lazy import LazyTensors
from .absorb import ABSORBED_FORMAT, ABSORBED_KEY, absorbed_config_json, absorption_record, check_absorbable, recorded_name
from .hf.registry import adapter_for, describe
from .hf.structure import LinearRef, NormRef, Structure

PathLike = str | os.PathLike


Rows = slice | torch.Tensor | None
"""Which rows along the first axis an absorbed tensor is computed for: a span, indices, or (None) all of it."""


class AbsorbedView(LazyTensors):
    """The absorbed tensors of a Hugging Face checkpoint directory, by model state-dict name, computed on lookup.

    A :class:`~modeconn.io.lazy.LazyTensors`, so that weight matching streams it: rows along the first axis are
    computed from the same rows of the stored tensors where each absorbed row depends on its own source row only
    (linear layers reading a norm, writers centered along another axis, untied copies); otherwise (a writer
    centered along its first axis, a folded bias) from the whole tensor, the last one so computed kept for the
    next rows of the same key — one tensor at a time either way.

    Attributes: ``note`` (the ``modeconn_absorbed`` record of the config), ``model`` (the absorbed model on the
    meta device: the module swaps replayed), ``shapes`` (key → (dtype, shape)), ``norms`` (the stream's norms, as
    :func:`~modeconn.symmetry.hf.registry.describe` gives them before absorption). ``dtype``: every floating
    tensor cast to it (default: its stored dtype), e.g. fp32 for the arithmetic of an absorption in memory.
    Raises (on construction): UnsupportedOperationError for a family or model absorption does not apply to (the
    reason named) and for a checkpoint that is already absorbed, CheckpointError / ConfigError as
    :func:`modeconn.stream.hf_checkpoint_spec`.
    """

    def __init__(self, path: PathLike, dtype: torch.dtype | None = None) -> None:
        from ..io.lazy import LazyCheckpoint
        from ..io.hf import checkpoint_layout
        from ..io.stacked import stacked_view
        from .hf.directory import hf_config
        from .hf.config_check import build_meta_model

        self.path, self.cast = Path(path), dtype
        self.config = hf_config(self.path)
        if getattr(self.config, ABSORBED_KEY, None) is not None:
            raise UnsupportedOperationError(f"{self.path} is already an absorbed checkpoint")
        meta = build_meta_model(self.config, self.path / "config.json")
        names, stacked = checkpoint_layout(meta)  # MoE banks stored per expert are read as banks
        self.ckpt = stacked_view(LazyCheckpoint(self.path), stacked)
        adapter = adapter_for(meta)
        if adapter.absorb is not None:
            raise UnsupportedOperationError(f"normalization absorption is not supported for {adapter.family}: "
                                            f"{adapter.absorb}")
        st = describe(meta)
        check_absorbable(st)
        self.stored = names | {k: k for k in stacked}  # model key → stored name
        self._plan(st)
        self.model = absorbed_meta_model(self.config, self.note)
        sd = self.model.state_dict()
        self.shapes = {k: (self.dtype_of(k), tuple(sd[k].shape)) for k in sd}

    def _plan(self, st: Structure) -> None:
        norms = self.norms = st.stream.norms
        self.dropped = {k for n in norms for k in (n.weight, n.bias) if k}
        layer_norm = any(n.kind == "layernorm" for n in norms)
        self.centered = {s.key: s.axis for s in st.stream.writers} if layer_norm else {}
        self.readers: dict[str, tuple[LinearRef, NormRef]] = {}
        self.biases: dict[str, tuple[LinearRef, NormRef]] = {}
        for n in norms:
            for r in n.readers:
                self.readers[r.weight] = (r, n)
                if n.bias is not None:
                    self.biases[r.bias or f"{r.path}.bias"] = (r, n)
        self.aliases = dict(st.aliases)
        self.note = {"format": ABSORBED_FORMAT, **absorption_record(st), "atol": None, "streamed": True}

    def dtype_of(self, key: str) -> torch.dtype:
        """The dtype of absorbed tensor ``key`` (or of a stored tensor the absorption drops, a norm weight)."""
        src = self._source_key(key)
        if src is None:  # a new bias: the dtype of its layer's weight (which may be a tied alias)
            weight = self.biases[key][0].weight
            src = self.aliases.get(weight, weight)
        stored = self.ckpt.infos[self._stored_name(src)].dtype
        return self.cast if self.cast is not None and stored.is_floating_point else stored

    def _stored_name(self, key: str) -> str:
        """The checkpoint's name of model tensor ``key`` (renamings resolve per tensor object, which tied tensors
        share, so a name the checkpoint lacks falls back to the key itself)."""
        name = self.stored.get(key, key)
        return name if name in self.ckpt.infos or key not in self.ckpt.infos else key

    def _source_key(self, key: str) -> str | None:
        if key in self.biases and self.biases[key][0].bias is None:
            return None  # a new bias: no stored tensor
        return self.aliases.get(key, key)

    _held: tuple[str, torch.Tensor] | None = None
    """The last whole tensor computed for row reads (key, tensor)."""

    def _read(self, key: str, rows: Rows = None) -> torch.Tensor:
        """Stored tensor ``key`` (its ``rows`` alone where given) in fp64."""
        name = self._stored_name(key)
        if rows is None:
            t = self.ckpt[name]
        elif isinstance(rows, slice):
            t = self.ckpt.read_rows(name, rows.start, rows.stop - rows.start)
        else:
            t = self.ckpt.read_rows_at(name, rows)
        return t.float().double()

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.shapes:
            raise KeyError(key)
        return self._absorbed(key)

    def _absorbed(self, key: str, rows: Rows = None) -> torch.Tensor:
        """Absorbed tensor ``key``, or its ``rows`` computed from the same rows of its sources (row-local keys)."""
        dtype, shape = self.shapes[key]
        if key in self.biases:
            t = self._bias(key, shape)
        else:
            t = self._read(self._source_key(key), rows)
            if key in self.centered:
                t = t - t.mean(dim=self.centered[key], keepdim=True)
            if key in self.readers:
                t = self._scaled(key, t, rows)
        return t.float().to(dtype)

    def _scaled(self, key: str, t: torch.Tensor, rows: Rows) -> torch.Tensor:
        """Reader ``key`` (or its ``rows``) times its norm's ``γ`` along the input axis."""
        r, n = self.readers[key]
        if not n.weight:
            return t
        gamma = n.offset + self._read(n.weight)
        if r.in_axis == 0 and rows is not None:
            gamma = gamma[rows]
        view = [1] * t.ndim
        view[r.in_axis] = -1
        return t * gamma.reshape(view)

    def _row_local(self, key: str) -> bool:
        """Whether each row (first axis) of absorbed ``key`` is computed from the same row of its source alone."""
        ndim = len(self.shapes[key][1])
        return key not in self.biases and (key not in self.centered or self.centered[key] % ndim != 0)

    def _rows_of(self, key: str, rows: slice | torch.Tensor) -> torch.Tensor:
        """``self[key][rows]``: from the sources' rows where :meth:`_row_local`, else sliced from the whole tensor
        (kept until rows of another key are read)."""
        if self._row_local(key):
            return self._absorbed(key, rows)
        if self._held is None or self._held[0] != key:
            self._held = None  # dropped before the next whole tensor is computed
            self._held = (key, self._absorbed(key))
        whole = self._held[1]
        return whole[rows].clone() if isinstance(rows, slice) else whole[rows]

    def _check_rows(self, key: str, lo: int, hi: int) -> None:
        """KeyError for an unknown key; ValueError naming the view and key for rows ``lo … hi − 1`` outside it."""
        if key not in self.shapes:
            raise KeyError(key)
        shape = self.shapes[key][1]
        if not shape or lo < 0 or hi < lo or hi > shape[0]:
            raise ValueError(f"{self.path}: rows {lo}:{hi} outside absorbed tensor {key!r} of shape {shape}")

    def read_rows(self, key: str, start: int, count: int) -> torch.Tensor:
        self._check_rows(key, start, start + count)
        return self._rows_of(key, slice(start, start + count))

    def read_rows_at(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        idx = rows.long()
        self._check_rows(key, int(idx.min()) if idx.numel() else 0, int(idx.max()) + 1 if idx.numel() else 0)
        return self._rows_of(key, idx)

    def shape_of(self, key: str) -> tuple[int, ...]:
        return self.shapes[key][1]

    def meta(self) -> dict[str, torch.Tensor]:
        return {k: torch.empty(shape, dtype=dtype, device="meta") for k, (dtype, shape) in self.shapes.items()}

    def _bias(self, key: str, shape: tuple[int, ...]) -> torch.Tensor:
        r, n = self.biases[key]
        b = self._read(r.bias) if r.bias else torch.zeros(shape, dtype=torch.float64)
        w = self._read(self.aliases.get(r.weight, r.weight))
        return b + torch.tensordot(w, self._read(n.bias), dims=([r.in_axis], [0]))

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def absorbed_config(self) -> dict[str, Any]:
        """The config JSON object of the absorbed checkpoint (:func:`~modeconn.symmetry.absorb.absorbed_config_json`:
        marked, ``modeconn_absorbed``, untied, its class, the source's name — not its path)."""
        return absorbed_config_json(self.config.to_dict(), self.note, type(self.model).__name__,
                                    recorded_name(str(self.path)))


def absorbed_meta_model(config: Any, note: Mapping[str, Any]) -> torch.nn.Module:
    """The model of an absorbed checkpoint on the meta device: the class ``config`` names (untied), each norm of
    ``note["norms"]`` a :class:`~modeconn.symmetry.hf.ScaleFreeRMSNorm`, each linear of ``note["biased"]`` with a
    bias (as :func:`~modeconn.symmetry.absorb.load_absorbed` rebuilds it)."""
    import copy

    from .absorb import replay_absorption
    from .hf.config_check import build_meta_model

    cfg = copy.deepcopy(config)
    cfg.tie_word_embeddings = False
    model = build_meta_model(cfg, "config")
    replay_absorption(model, note)
    return model


def stream_absorb(src: PathLike, out: PathLike, *, overwrite: bool = False, max_shard_bytes: int = 2 << 30,
                  progress: Callable[[int, int], None] | None = None) -> Path:
    """Write the normalization-absorbed checkpoint of the Hugging Face directory ``src`` to ``out``, tensor by tensor
    (module docstring): ``config.json`` marked as absorbed (:mod:`modeconn.symmetry.absorb`: stock transformers
    refuses it), ``modeconn-absorbed`` safetensors shards of at most ``max_shard_bytes``, and ``src``'s tokenizer and
    generation files. Peak memory: a few tensors.

    Returns ``out`` (written atomically, never replacing what modeconn did not write). Raises: as
    :class:`AbsorbedView`; CheckpointError for an ``out`` that may not be written.
    """
    from ..io.lazy import ABSORBED_STEM, ShardLayout, write_like
    from ..io.hf import side_files

    view = AbsorbedView(src)
    layout = ShardLayout.plan(view.shapes, max_shard_bytes, stem=ABSORBED_STEM)
    files = {k: v for k, v in side_files(src).items() if k != "config.json"}
    files["config.json"] = view.absorbed_config()
    return write_like(out, layout, view.__getitem__, files=files, overwrite=overwrite, progress=progress,
                      inputs=[src], command="absorb")
