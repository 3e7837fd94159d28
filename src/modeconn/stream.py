"""Align, apply and merge checkpoints larger than memory, streaming them tensor by tensor.

    from modeconn.stream import hf_checkpoint_spec, stream_apply, stream_merge, stream_weight_matching

    spec = hf_checkpoint_spec("ckpt/a")                              # from names, shapes and config: no weights read
    res = stream_weight_matching(spec, "ckpt/a", "ckpt/b", restarts=1, max_iter=3)
    stream_apply(spec, "ckpt/b", res.element, "ckpt/b_aligned")      # same shards and index as ckpt/b
    stream_merge(spec, ["ckpt/a", "ckpt/b"], "ckpt/merged", elements=[None, res.element])

Checkpoints are directories with ``model.safetensors`` or Hugging Face shards + ``model.safetensors.index.json``
(:class:`~modeconn.io.lazy.LazyCheckpoint`). Weight matching reads each tensor when a term needs it (see
:mod:`modeconn.match.weight`, "Streaming"); :func:`stream_apply` and :func:`stream_merge` write the result shard by
shard, one tensor at a time, into a temporary directory renamed into place, reading the inputs of the next tensors
ahead and writing finished tensors behind the arithmetic (:class:`~modeconn.io.lazy.ReadAhead`: background threads,
bounded depths). Peak memory is about the largest space's n×n score (weight matching) or a few tensors per input
(apply, merge: :data:`~modeconn.io.lazy.READ_AHEAD` + 1 keys read, :data:`~modeconn.io.lazy.WRITE_BEHIND` + 1
results), not the model size.

``device=`` (``--device``): weight matching's score products and the merge arithmetic run there (inputs are read on
the host and copied per tensor; results come back per tensor to be written); ``None``/``"cpu"`` compute exactly as
before the option existed. An unavailable device is a ConfigError naming the option before any work
(:func:`modeconn._util.device.resolve_device`).

Hugging Face directories (``config.json`` with ``model_type``): :func:`hf_checkpoint_spec` takes the spec of a table
family (Llama, GPT-NeoX …: :data:`~modeconn.symmetry.hf.skeleton.SKELETON_FAMILIES`) from the checkpoint's tensor
names and shapes and its config alone (:mod:`modeconn.symmetry.hf.skeleton`: transformers' model classes are not
imported); for other families it builds the model on the meta device from its config (no weights are read or
allocated) and takes its spec from the family adapter (:func:`modeconn.symmetry.hf.hf_symmetry_spec`), with tensor
names as stored in the checkpoint (transformers ≥ 5 renames a few on load, e.g. GPT-NeoX's ``embed_out`` →
``lm_head``). Streaming uses permutation groups (residual,
per-head q·k / v·o, FFN permutations; head permutations with per-head transforms work too): normalization
absorption (:func:`modeconn.absorb_normalization`), which the orthogonal residual group needs, rewrites the model
in memory and is not available here. Tied tensors (GPT-2's ``wte`` / ``lm_head``) are transformed once and stay
equal; a checkpoint that stores only one of them (as ``save_pretrained`` does) is supported.

:func:`modeconn.recipes.hf_stream.align_hf_checkpoints` and :func:`~modeconn.recipes.hf_stream.merge_hf_checkpoints`
are the recipes behind ``modeconn align`` / ``modeconn merge`` on Hugging Face directories. Merging here is the
weighted average only: transformer LMs carry no BatchNorm statistics to re-estimate, and nothing is evaluated (no
data is read).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ._util.device import is_cpu, resolve_device
from .checks import all_finite, check_compatible, check_finite
from .errors import CheckpointError, ConfigError
from .io import CONFIG_NAME, check_dtype_kinds
from .io.checkpoint import _check_target
from .io.hf import checkpoint_layout, is_hf_checkpoint, side_files, with_config
from .io.stacked import stacked_view
from .io.lazy import READ_AHEAD, LazyCheckpoint, ReadAhead, ShardLayout, write_like, write_order
from .io.vocabulary import check_vocabularies
from .match.result import Alignment
from .match.weight import weight_matching
from .path.interpolate import merge_weights, plan_settings, weighted_average
from .path.merge_rules import MergeRule, RuleSettings, check_rule_settings
from .symmetry import Element, SymmetrySpec
from .symmetry.hf.directory import check_same_hf_configs, hf_config

PathLike = str | os.PathLike
Checkpoint = PathLike | LazyCheckpoint
Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: the stage (``"run 1/1 sweep 2"``, ``"writing"``), units done and their total."""


def _lazy(ckpt: Checkpoint, spec: SymmetrySpec | None = None) -> LazyCheckpoint:
    """``ckpt`` opened, read through the banks ``spec`` binds where it stores them split (:mod:`modeconn.io.stacked`)."""
    lazy = ckpt if isinstance(ckpt, LazyCheckpoint) else LazyCheckpoint(ckpt)
    return stacked_view(lazy, getattr(spec, "stacked", None) or {})


def hf_checkpoint_spec(path: PathLike, groups: str | Mapping[str, str | None] = "permutation", *,
                       config=None, checkpoint: LazyCheckpoint | None = None):
    """The symmetry spec of a Hugging Face checkpoint directory, without reading its weights.

    For a table family (:data:`~modeconn.symmetry.hf.skeleton.SKELETON_FAMILIES`) the spec comes from the stored
    tensor names and shapes and the config (:func:`~modeconn.symmetry.hf.skeleton.skeleton_spec`, tested equal to the
    model class's), without importing transformers' model classes. Otherwise (another family, an absorbed checkpoint,
    a tensor no table names, an orthogonal residual) it builds the model class named by ``config.architectures``
    (one of transformers' own classes for the model type; else the causal-LM, else the base auto class) on the meta
    device (for an absorbed checkpoint, format
    :data:`~modeconn.symmetry.absorb.ABSORBED_FORMAT` read by :func:`~modeconn.symmetry.absorb.read_absorbed_config`,
    with its norms and added biases replayed, so ``groups`` may bind the orthogonal residual group), takes its
    :func:`~modeconn.symmetry.hf.hf_symmetry_spec`
    with ``groups`` and renames the tensors to the names stored in the checkpoint (transformers' save-time
    conversion, pure renamings only). The spec is
    checked against the checkpoint's safetensors headers (keys and shapes; a tied alias may be absent). Tensors the
    checkpoint stores but the model does not have (buffers older conversions saved and transformers ignores on load,
    e.g. Pythia's ``attention.masked_bias``) are kept as unbound tensors: carried through apply and merge unchanged.
    A model tensor missing from the checkpoint is an error.

    Args:
        path: the directory (``config.json`` + safetensors weights).
        groups: as for :func:`~modeconn.symmetry.hf.hf_symmetry_spec` (default: permutations).
        config: the transformers config if already read; ``checkpoint``: the lazy checkpoint if already opened.
    Returns: an :class:`~modeconn.symmetry.hf.HFSymmetrySpec` keyed by checkpoint tensor names.
    Raises: CheckpointError (config/weights missing, corrupt, a shard missing; weights not named as the config's kind
        stores them: :func:`~modeconn.symmetry.absorb.check_absorbed_weights`), ConfigError (config unreadable or
        malformed, e.g. a layer count the checkpoint's tensors cannot hold, a malformed absorption record: the field is
        named),
        UnsupportedOperationError (no adapter for the model type; a checkpoint format that is converted, not
        renamed, on load), SpecError / StateDictMismatchError (the checkpoint does not match the config's model).
    """
    from .symmetry.absorb import ABSORBED_KEY, check_absorbed_weights, rebuild_absorbed
    from .symmetry.hf import hf_symmetry_spec
    from .symmetry.hf.config_check import build_meta_model, check_fits_checkpoint
    from .symmetry.hf.skeleton import skeleton_spec

    path = Path(path)
    config = config if config is not None else hf_config(path)
    ckpt = checkpoint if checkpoint is not None else LazyCheckpoint(path)
    check_fits_checkpoint(config, path / CONFIG_NAME, len(ckpt))  # before building (minutes for a huge layer count)
    absorbed = getattr(config, ABSORBED_KEY, None) is not None
    check_absorbed_weights(ckpt, absorbed, path / CONFIG_NAME)
    stacked: dict = {}
    if absorbed:  # an absorbed checkpoint (stream_absorb / save_absorbed): the module swaps replayed, model names stored
        model = rebuild_absorbed(config, path / CONFIG_NAME)
        names = {k: k for k in model.state_dict()}
    else:
        spec = skeleton_spec(config, {k: i.shape for k, i in ckpt.infos.items()}, ckpt.dtypes, groups)
        if spec is not None:  # a table family: no model class imported (see modeconn.symmetry.hf.skeleton)
            spec.check_state_dict(ckpt.meta(), f"checkpoint {path}")
            return spec
        model = build_meta_model(config, path / CONFIG_NAME)
        names, stacked = checkpoint_layout(model)  # MoE banks stored per expert: read as banks, under model names
        names |= {k: k for k in stacked}
        ckpt = stacked_view(ckpt, stacked)
        stacked = getattr(ckpt, "stacked", {})
    spec = hf_symmetry_spec(model, groups)
    # every stored tensor of the dtype kind the model has (an int32 header over float32 bytes is refused)
    check_dtype_kinds([{names[k]: t for k, t in model.state_dict().items()}, ckpt.dtypes],
                      [f"the model {path / CONFIG_NAME} describes", f"checkpoint {path}"])
    stored = set(names.values())
    spec = _renamed(spec, names, {k: ckpt.infos[k].shape for k in ckpt if k not in stored}, stacked)
    spec.check_state_dict(ckpt.meta(), f"checkpoint {path}")
    return spec


def _renamed(spec, names: Mapping[str, str], passengers: Mapping[str, tuple[int, ...]], stacked: Mapping):
    """``spec`` keyed by checkpoint names, plus unbound ``passengers`` (checkpoint-only tensors, with their shapes) and
    the banks the checkpoint stores split (``stacked``)."""
    if all(k == v for k, v in names.items()) and not passengers and not stacked:
        return spec
    return type(spec)(spaces=spec.spaces, tensors={**{names[k]: v for k, v in spec.tensors.items()},
                                                   **dict.fromkeys(passengers, ())},
                      shapes={**{names[k]: v for k, v in spec.shapes.items()}, **passengers}, probes=spec.probes,
                      repair_points=spec.repair_points,
                      aliases={names[a]: names[p] for a, p in spec.aliases.items()}, stacked=dict(stacked))


# -------------------------------------------------------------------------------------------- streaming
def stream_weight_matching(spec: SymmetrySpec, a: Checkpoint, b: Checkpoint, **kwargs: Any) -> Alignment:
    """:func:`modeconn.weight_matching` of two checkpoint directories (or lazy checkpoints), streamed: B's element
    aligning it to A. ``kwargs``: restarts, max_iter, rtol, seed, init, keys, chunk, progress. Raises as
    :func:`modeconn.weight_matching` and :class:`~modeconn.io.lazy.LazyCheckpoint`."""
    a, b = _lazy(a, spec), _lazy(b, spec)
    check_dtype_kinds([a.dtypes, b.dtypes], [f"checkpoint {a.path}", f"checkpoint {b.path}"])
    return weight_matching(spec, a, b, **kwargs)


def _source(spec: SymmetrySpec | None, ckpt: LazyCheckpoint, key: str) -> str:
    """The stored tensor ``key`` is made from: a tied alias's primary where the checkpoint has it (so the tie
    survives), else ``key`` itself."""
    if spec is None:
        return key
    primary = spec.primary_of(key)
    return primary if primary in ckpt else key


def _tensor(spec: SymmetrySpec | None, src: str, t: torch.Tensor, g: Element | None, cache: dict) -> torch.Tensor:
    """``(g·θ)[key]`` from ``t``, the stored tensor ``src`` (:func:`_source`) of ``key``; as stored without a spec
    or an element."""
    return t if spec is None or g is None else spec.apply_tensor(src, t, g, cache=cache)


def _reader(spec: SymmetrySpec | None, ckpts: Sequence[LazyCheckpoint], order: Sequence[str]) -> ReadAhead:
    """Per key of ``order``, the stored tensors behind it in every checkpoint (:func:`_source`), read into memory
    :data:`~modeconn.io.lazy.READ_AHEAD` keys ahead on a background thread."""
    return ReadAhead(order, lambda k: [c.read(_source(spec, c, k)) for c in ckpts], READ_AHEAD)


def _check_inputs(spec: SymmetrySpec | None, ckpts: list[LazyCheckpoint], elements: Sequence[Element | None]) -> None:
    """Names, shapes and dtype kinds agree (and, with a spec, fit it; elements valid; stored ties equal)."""
    metas = [c.meta() for c in ckpts]
    for c, m in zip(ckpts, metas, strict=False):
        if spec is not None:
            spec.check_state_dict(m, f"checkpoint {c.path}")
    check_compatible(metas, [str(c.path) for c in ckpts])
    check_dtype_kinds(metas, [f"checkpoint {c.path}" for c in ckpts])  # kinds as the first (reference) checkpoint's
    if spec is None:
        if any(g is not None for g in elements):
            raise ConfigError("group elements need a symmetry spec: pass the spec of the checkpoints")
        return
    for g in elements:
        if g is not None:
            spec.check_element(g)
    for c in ckpts:  # tied tensors stored twice must be equal (read before anything is written)
        spec.check_tied(c, f"checkpoint {c.path}")


def stream_apply(spec: SymmetrySpec, src: Checkpoint, element: Element, out: PathLike, *,
                 files: Mapping[str, Any] | None = None, overwrite: bool = False,
                 progress: Progress | None = None) -> Path:
    """Write ``element · θ`` of checkpoint ``src`` to ``out``, tensor by tensor, in ``src``'s layout.

    Same shard file names, keys per shard, index (``weight_map`` and ``metadata``) and safetensors metadata; dtypes
    kept (permutations are exact in every dtype: the result equals ``spec.apply`` bit for bit). ``files``: other
    files for ``out`` (name → path to copy, bytes, or a JSON object); ``src``'s ``config.json`` is always written
    unless ``files`` has one, so ``from_pretrained`` reads the real architecture — pass ``files=side_files(src)``
    for the tokenizer and generation files too. Peak memory: one tensor and its image.

    Returns: ``out``, created atomically. Raises: CheckpointError (src unreadable, ``out`` non-empty without
    ``overwrite``), StateDictMismatchError (src does not fit the spec), SpecError (bad element; tied tensors stored
    with different values).
    """
    ckpt = _lazy(src, spec)
    _check_inputs(spec, [ckpt], [element])
    cache: dict = {}
    tick = (lambda d, t: progress("writing", d, t)) if progress is not None else None
    with _reader(spec, [ckpt], write_order(ckpt)) as reader:
        return write_like(out, ckpt, lambda k: _tensor(spec, _source(spec, ckpt, k), reader.get(k)[0], element, cache),
                          files=with_config(ckpt.path, files), overwrite=overwrite, progress=tick, command="align")


def stream_merge(spec: SymmetrySpec | None, srcs: Sequence[Checkpoint], out: PathLike, *,
                 weights: Sequence[float] | None = None, elements: Sequence[Element | None] | None = None,
                 files: Mapping[str, Any] | None = None, overwrite: bool = False,
                 progress: Progress | None = None, normalize: bool = True, rule: str | MergeRule = "linear",
                 settings: RuleSettings | None = None, dtype: torch.dtype | None = None,
                 out_dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                 fill: Callable[[str, list[torch.Tensor]], list[torch.Tensor]] | None = None) -> Path:
    """Write the merge of two or more checkpoints, ``rule((g_i · θ_i)_i)`` (default ``Σ_i w_i · (g_i · θ_i)``), to
    ``out``, tensor by tensor, in the first one's layout (as :func:`modeconn.path.interpolate.weighted_average`:
    fp32 accumulation, the first model's dtype unless ``out_dtype``, integer tensors kept exactly, every floating
    tensor by the same rule). The first checkpoint's ``config.json`` is written with the weights (its dtype field set
    to ``out_dtype`` when given) unless ``files`` has one.

    Args:
        spec: the checkpoints' symmetry spec, or ``None`` for checkpoints merged as stored (any architecture whose
            tensor names, shapes and dtype kinds agree; no ``elements`` then).
        srcs: checkpoint directories (or lazy checkpoints) of one architecture; the first is the reference.
        weights: one finite weight per model (default uniform); ``normalize`` (default): non-negative, divided by
            their sum; ``normalize=False``: any finite weights as given (:func:`~modeconn.path.interpolate.merge_weights`).
        elements: per model the group element to apply first (``None``: as stored), e.g. from
            :func:`stream_weight_matching` against the first model.
        files, overwrite, progress: as in :func:`stream_apply`.
        rule: the merge rule applied to each tensor, a name of :data:`~modeconn.path.merge_rules.MERGE_RULES` or its
            entry (``linear``);
            ``settings``: its base, parameters and seed (:class:`~modeconn.path.merge_rules.RuleSettings`).
        dtype: inputs cast to it before the rule (mergekit's recipe ``dtype``); ``out_dtype``: the written floating
            tensors' dtype.
        device: where the arithmetic runs (``None``/``"cpu"``: the CPU, as before; ``"cuda"`` …; a ``torch.device``
            is taken as resolved): each tensor's inputs are copied there and the result back.
        fill: ``fill(key, tensors)`` → the tensors the rule merges, from the models' tensors of ``key`` after their
            elements (e.g. the rows of tokens a model lacks, :meth:`modeconn.recipes.merge_vocab.Vocabulary.filler`).
    Returns: ``out``, created atomically. Peak memory: :data:`~modeconn.io.lazy.READ_AHEAD` + 1 keys' tensors per
        model read, the fp32 sum, :data:`~modeconn.io.lazy.WRITE_BEHIND` + 1 results.
    Raises: ConfigError (fewer than two models, bad weights or rule settings, elements not one per model, a device
        that is not available — named),
        StateDictMismatchError (keys/shapes differ), SpecError, CheckpointError; NonFiniteError naming the model and
        tensor with NaN/Inf, or the rule and tensor where the rule makes NaN/Inf from finite inputs or overflows the
        output dtype — raised here, not on the writer thread, and nothing is written then.
    """
    ckpts = [_lazy(s, spec) for s in srcs]
    if len(ckpts) < 2:
        raise ConfigError(f"merging needs at least two checkpoints, got {len(ckpts)}")
    if not isinstance(device, torch.device):
        device = resolve_device(device, "device")
    weights = merge_weights(weights, len(ckpts), normalize=normalize)  # before any work
    merge_rule = check_rule_settings(rule, settings, len(ckpts))
    elements = list(elements) if elements is not None else [None] * len(ckpts)
    if len(elements) != len(ckpts):
        raise ConfigError(f"elements must have one entry (or None) per checkpoint: {len(elements)} for {len(ckpts)}")
    _check_inputs(spec, ckpts, elements)
    metas = [c.meta() for c in ckpts]
    keys = merged_keys(metas[0])
    settings = plan_settings(merge_rule, metas, weights, settings, keys, dtype=dtype)
    names = [str(c.path) for c in ckpts]
    caches: list[dict] = [{} for _ in ckpts]
    layout = _layout_in(ckpts[0].layout, out_dtype)
    merge_one = functools.partial(_merge_one, names=names, weights=weights, rule=merge_rule, settings=settings, dtype=dtype,
                                  out_dtype=out_dtype, device=None if is_cpu(device) else device)

    def produce(key: str) -> torch.Tensor:
        stored = zip(ckpts, reader.get(key), elements, caches, strict=True)
        tensors = [_tensor(spec, _source(spec, c, key), t, g, cache) for c, t, g, cache in stored]
        return merge_one(key, tensors if fill is None else fill(key, tensors))

    tick = (lambda d, t: progress("writing", d, t)) if progress is not None else None
    with _reader(spec, ckpts, write_order(layout)) as reader:
        return write_like(out, layout, produce, files=with_config(ckpts[0].path, files, out_dtype),
                          overwrite=overwrite, progress=tick, inputs=[c.path for c in ckpts], command="merge")


def merged_keys(meta: Mapping[str, torch.Tensor]) -> list[str]:
    """The tensors a merge rule combines: the floating (and complex) ones; the rest are the first model's."""
    return [k for k, t in meta.items() if t.is_floating_point() or t.is_complex()]


PROPAGATING_RULES = frozenset({"linear"})
"""Rules whose result is NaN/Inf wherever an input is (``Σ w_i t_i`` in IEEE arithmetic): for them a finite result
proves finite inputs, and the inputs are scanned only when it is not (to name the model at fault)."""


def _merge_one(key: str, tensors: list[torch.Tensor], *, names: list[str], weights: list[float], rule: MergeRule | str,
               settings: RuleSettings | None, dtype: torch.dtype | None, out_dtype: torch.dtype | None,
               device: torch.device | None) -> torch.Tensor:
    """One merged tensor of :func:`stream_merge` (on ``device`` when given); NonFiniteError naming the model and
    ``key`` for NaN/Inf inputs, the same error whichever the rule (:data:`PROPAGATING_RULES` check after merging)."""
    if device is not None:
        tensors = [t.to(device, non_blocking=True) for t in tensors]
    sds = [{key: t} for t in tensors]
    propagating = (rule if isinstance(rule, str) else rule.name) in PROPAGATING_RULES
    if not propagating:
        for sd, name in zip(sds, names, strict=True):
            check_finite(sd, name)
    out = weighted_average(sds, weights, check=False, normalize=False, rule=rule, settings=settings, dtype=dtype,
                           out_dtype=out_dtype, planned=True)[key]
    if propagating and out.is_floating_point() and not all_finite(out):
        for sd, name in zip(sds, names, strict=True):
            check_finite(sd, name)
    return out


def _layout_in(layout: ShardLayout, dtype: torch.dtype | None) -> ShardLayout:
    """``layout`` with its floating tensors stored as ``dtype`` (the index's ``total_size`` updated)."""
    if dtype is None:
        return layout
    infos = {k: (dataclasses.replace(i, dtype=dtype) if i.dtype.is_floating_point else i) for k, i in layout.infos.items()}
    index = layout.index
    if index is not None:
        meta = {**index.get("metadata", {}), "total_size": sum(i.nbytes for i in infos.values())}
        index = {**index, "metadata": meta}
    return dataclasses.replace(layout, infos=infos, index=index)  # shard and index names kept (an absorbed stem too)


def open_hf_checkpoints(paths: Sequence[PathLike], out: PathLike, overwrite: bool,
               groups: str | Mapping[str, str | None] | None = "permutation", vocabulary=None):
    """Every cheap check before heavy work: one vocabulary, configs agree, weights complete, spec fits (``groups``
    ``None``: no spec, names/shapes/dtype kinds only), ``out`` writable. Returns ``(spec or None, lazy ckpts)``.

    ``vocabulary``: the models' rows in a new vocabulary (``vocabulary.rows`` tokens; ``vocabulary.views(ckpts,
    keys)`` gives each checkpoint's token-indexed tensors ``keys`` in it, e.g. a
    :class:`~modeconn.recipes.merge_vocab.Vocabulary`): the tokenizers may differ, and the checkpoints returned are
    those views (the spec is the first model's in the new vocabulary)."""
    _check_target(Path(out), overwrite, paths)
    for p in paths:
        if not is_hf_checkpoint(p):
            raise CheckpointError(f"{p}: not a Hugging Face checkpoint directory (config.json with model_type)")
    if vocabulary is None:
        check_vocabularies(paths)
    configs = check_same_hf_configs(paths, None if vocabulary is None else vocabulary.rows)
    for p in paths:  # side files that would be copied to --out: no symlink out of the checkpoint
        side_files(p)
    ckpts = [LazyCheckpoint(p) for p in paths]
    if vocabulary is not None:
        ckpts = vocabulary.views(ckpts, token_tensor_names(configs[0], Path(paths[0])))
    spec = None if groups is None else hf_checkpoint_spec(paths[0], groups, config=configs[0], checkpoint=ckpts[0])
    ckpts = [_lazy(c, spec) for c in ckpts]
    _check_inputs(spec, ckpts, [])
    return spec, ckpts


def token_tensor_names(config, path: Path) -> list[str]:
    """The stored names of the token-indexed tensors (token axis first) of the model ``config`` describes: its input
    embeddings and output embeddings (as the model class names them; a tied one is listed too)."""
    from .symmetry.hf.config_check import build_meta_model

    model = build_meta_model(config, path / CONFIG_NAME)
    names = checkpoint_layout(model)[0]  # token tensors are renamed at most (never split like MoE banks)
    ends = {id(m) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None}
    return [names[f"{n}.weight"] for n, m in model.named_modules() if id(m) in ends and f"{n}.weight" in names]


__all__ = [
    "PROPAGATING_RULES", "hf_checkpoint_spec", "merged_keys", "open_hf_checkpoints", "stream_apply", "stream_merge",
    "stream_weight_matching",
]
