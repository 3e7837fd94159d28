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
from .absorb import ABSORBED_FORMAT, ABSORBED_KEY, absorbed_config_json, absorption_record, check_absorbable, recorded_name
from .hf.registry import adapter_for, describe
from .hf.structure import LinearRef, NormRef, Structure

PathLike = str | os.PathLike


class AbsorbedView(Mapping[str, torch.Tensor]):
    """The absorbed tensors of a Hugging Face checkpoint directory, by model state-dict name, computed on lookup.

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

    def _read(self, key: str) -> torch.Tensor:
        return self.ckpt[self._stored_name(key)].float().double()

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.shapes:
            raise KeyError(key)
        dtype, shape = self.shapes[key]
        if key in self.biases:
            t = self._bias(key, shape)
        else:
            t = self._read(self._source_key(key))
            if key in self.centered:
                t = t - t.mean(dim=self.centered[key], keepdim=True)
            if key in self.readers:
                r, n = self.readers[key]
                view = [1] * t.ndim
                view[r.in_axis] = -1
                t = t * (n.offset + self._read(n.weight)).reshape(view) if n.weight else t
        return t.float().to(dtype)

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
