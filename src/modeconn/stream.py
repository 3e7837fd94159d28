"""Align, apply and merge checkpoints larger than memory, streaming them tensor by tensor.

    from modeconn.stream import hf_checkpoint_spec, stream_apply, stream_merge, stream_weight_matching

    spec = hf_checkpoint_spec("ckpt/a")                              # skeleton on the meta device: no weights read
    res = stream_weight_matching(spec, "ckpt/a", "ckpt/b", restarts=1, max_iter=3)
    stream_apply(spec, "ckpt/b", res.element, "ckpt/b_aligned")      # same shards and index as ckpt/b
    stream_merge(spec, ["ckpt/a", "ckpt/b"], "ckpt/merged", elements=[None, res.element])

Checkpoints are directories with ``model.safetensors`` or Hugging Face shards + ``model.safetensors.index.json``
(:class:`~modeconn.io_stream.LazyCheckpoint`). Weight matching reads each tensor when a term needs it (see
:mod:`modeconn.match.weight`, "Streaming"); :func:`stream_apply` and :func:`stream_merge` write the result shard by
shard, one tensor at a time, into a temporary directory renamed into place, reading the inputs of the next tensors
ahead and writing finished tensors behind the arithmetic (:class:`~modeconn.io_stream.ReadAhead`: background threads,
bounded depths). Peak memory is about the largest space's n×n score (weight matching) or a few tensors per input
(apply, merge: :data:`~modeconn.io_stream.READ_AHEAD` + 1 keys read, :data:`~modeconn.io_stream.WRITE_BEHIND` + 1
results), not the model size.

``device=`` (``--device``): weight matching's score products and the merge arithmetic run there (inputs are read on
the host and copied per tensor; results come back per tensor to be written); ``None``/``"cpu"`` compute exactly as
before the option existed. An unavailable device is a ConfigError naming the option before any work
(:func:`modeconn._util.device.resolve_device`).

Hugging Face directories (``config.json`` with ``model_type``): :func:`hf_checkpoint_spec` builds the model on the
meta device from its config (no weights are read or allocated) and takes its spec from the family adapter
(:func:`modeconn.symmetry.hf.hf_symmetry_spec`), with tensor names as stored in the checkpoint (transformers ≥ 5
renames a few on load, e.g. GPT-NeoX's ``embed_out`` → ``lm_head``). Streaming uses permutation groups (residual,
per-head q·k / v·o, FFN permutations; head permutations with per-head transforms work too): normalization
absorption (:func:`modeconn.absorb_normalization`), which the orthogonal residual group needs, rewrites the model
in memory and is not available here. Tied tensors (GPT-2's ``wte`` / ``lm_head``) are transformed once and stay
equal; a checkpoint that stores only one of them (as ``save_pretrained`` does) is supported.

:func:`align_hf_checkpoints` and :func:`merge_hf_checkpoints` are the recipes behind ``modeconn align`` /
``modeconn merge`` on Hugging Face directories. Merging here is the weighted average only: transformer LMs carry no
BatchNorm statistics to re-estimate, and nothing is evaluated (no data is read).
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
from ._util.jsonio import write_json
from .checks import all_finite, check_compatible, check_finite
from .errors import CheckpointError, ConfigError, UnsupportedOperationError
from .io import CONFIG_NAME, PICKLE_SUFFIXES, _check_target, check_dtype_kinds, check_in_checkpoint, read_json_object
from .io_stream import READ_AHEAD, INDEX_SUFFIX, LazyCheckpoint, ReadAhead, ShardLayout, write_like, write_order
from .match.result import Alignment
from .match.weight import DEFAULTS, weight_matching
from .path.interpolate import merge_weights, plan_settings, weighted_average
from .path.merge_rules import MERGE_RULES, RuleSettings, applied_weights, check_filters, check_rule_settings, rule_weights
from .symmetry import Element, SymmetrySpec
from .symmetry.hf import FULL_GROUPS
from .vocabulary import check_vocabularies

PathLike = str | os.PathLike
Checkpoint = PathLike | LazyCheckpoint
Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: the stage (``"run 1/1 sweep 2"``, ``"writing"``), units done and their total."""

WEIGHT_SUFFIXES = (".safetensors", ".msgpack", ".h5", ".gguf", ".onnx", *PICKLE_SUFFIXES)
"""Files never copied next to streamed weights (the weights are rewritten, other formats would be stale)."""
RECORDS = ("alignment.json", "merge.json")


def _lazy(ckpt: Checkpoint) -> LazyCheckpoint:
    return ckpt if isinstance(ckpt, LazyCheckpoint) else LazyCheckpoint(ckpt)


# ------------------------------------------------------------------------------ Hugging Face directories
def is_hf_checkpoint(path: PathLike) -> bool:
    """Whether ``path`` is a Hugging Face checkpoint directory: its ``config.json`` is a JSON object with a
    ``model_type`` and no modeconn ``architecture``. False when there is no readable config.json."""
    file = Path(path) / CONFIG_NAME
    try:
        cfg = read_json_object(file, "config file")
    except CheckpointError:
        return False
    return isinstance(cfg.get("model_type"), str) and "architecture" not in cfg


def hf_config(path: PathLike):
    """The ``transformers`` config of a Hugging Face checkpoint directory (read locally; never runs remote code: a
    ``model_type`` transformers does not implement is refused before transformers reads the file, and it is read with
    ``trust_remote_code=False``). For an absorbed checkpoint, the config of its original model type with the
    ``modeconn_absorbed`` record (:func:`~modeconn.symmetry.absorb.read_absorbed_config`).
    Raises CheckpointError (no/invalid config.json), ConfigError (no ``model_type``, one transformers does not
    implement — with ``auto_map``, named as custom code never run —, a malformed absorbed record: the file and the
    field are named)."""
    from .symmetry.absorb import is_absorbed_config, read_absorbed_config
    from .symmetry.hf.config_check import check_model_type, config_value_errors, validate_hf_config

    path = Path(path)
    raw = read_json_object(path / CONFIG_NAME, "config file")
    if is_absorbed_config(raw):
        return read_absorbed_config(raw, path / CONFIG_NAME)
    if not isinstance(raw.get("model_type"), str):
        raise ConfigError(f"{path / CONFIG_NAME}: no 'model_type'; not a Hugging Face checkpoint directory")
    check_model_type(raw, path / CONFIG_NAME)  # before transformers, which would offer to run auto_map's code
    validate_hf_config(raw, path / CONFIG_NAME)  # sizes: positive ints, divisible, bounded (before transformers)
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, *config_value_errors()) as err:
        raise ConfigError(f"{path / CONFIG_NAME}: transformers cannot read this config "
                          f"(model_type {raw['model_type']!r}): {err}") from None


def check_same_hf_configs(paths: Sequence[PathLike]) -> list:
    """The configs of ``paths`` (see :func:`hf_config`); ConfigError naming every field that differs from the first
    (fields that do not change the computed function — names, dtype, attention backend … — are ignored)."""
    from .symmetry.hf import config_differences

    configs = [hf_config(p) for p in paths]
    problems = []
    for p, cfg in zip(paths[1:], configs[1:], strict=False):
        problems += [f"{p}: {d}" for d in config_differences(configs[0], cfg)]
    if problems:
        raise ConfigError(f"the checkpoints are not the same architecture as {paths[0]}:\n  " + "\n  ".join(problems))
    return configs


def hf_checkpoint_spec(path: PathLike, groups: str | Mapping[str, str | None] = "permutation", *,
                       config=None, checkpoint: LazyCheckpoint | None = None):
    """The symmetry spec of a Hugging Face checkpoint directory, without reading its weights.

    Builds the model class named by ``config.architectures`` (one of transformers' own classes for the model type;
    else the causal-LM, else the base auto class) on the meta device (for an absorbed checkpoint, format
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

    path = Path(path)
    config = config if config is not None else hf_config(path)
    ckpt = checkpoint if checkpoint is not None else LazyCheckpoint(path)
    check_fits_checkpoint(config, path / CONFIG_NAME, len(ckpt))  # before building (minutes for a huge layer count)
    absorbed = getattr(config, ABSORBED_KEY, None) is not None
    check_absorbed_weights(ckpt, absorbed, path / CONFIG_NAME)
    if absorbed:  # an absorbed checkpoint (stream_absorb / save_absorbed): the module swaps replayed, model names stored
        model = rebuild_absorbed(config, path / CONFIG_NAME)
        names = {k: k for k in model.state_dict()}
    else:
        model = build_meta_model(config, path / CONFIG_NAME)
        names = checkpoint_tensor_names(model)
    spec = hf_symmetry_spec(model, groups)
    # every stored tensor of the dtype kind the model has (an int32 header over float32 bytes is refused)
    check_dtype_kinds([{names[k]: t for k, t in model.state_dict().items()}, ckpt.dtypes],
                      [f"the model {path / CONFIG_NAME} describes", f"checkpoint {path}"])
    stored = set(names.values())
    spec = _renamed(spec, names, {k: ckpt.infos[k].shape for k in ckpt if k not in stored})
    spec.check_state_dict(ckpt.meta(), f"checkpoint {path}")
    return spec


def checkpoint_tensor_names(model: torch.nn.Module) -> dict[str, str]:
    """Model state-dict key → the name ``save_pretrained`` stores the tensor under (transformers ≥ 5 renames a few,
    e.g. GPT-NeoX's ``lm_head.weight`` is stored as ``embed_out.weight``; the identity before transformers 5).
    Works on a model built on the meta device. Raises UnsupportedOperationError if saving converts (fuses/splits)
    tensors instead of renaming them."""
    sd = model.state_dict()
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers < 5: keys are stored as named
        return {k: k for k in sd}
    saved = revert_weight_conversion(model, dict(sd))
    ids = {id(t): k for k, t in sd.items()}
    names = {ids[id(t)]: k for k, t in saved.items() if id(t) in ids}
    if len(names) != len(sd) or len(saved) != len(sd):
        raise UnsupportedOperationError(
            f"{type(model).__name__}: transformers converts (fuses/splits) some tensors between the checkpoint and "
            f"the model ({sorted(set(sd) - set(names))[:5]}); streaming needs checkpoint tensors that map one to one "
            "to model tensors"
        )
    return names


def _renamed(spec, names: Mapping[str, str], passengers: Mapping[str, tuple[int, ...]]):
    """``spec`` keyed by checkpoint names, plus unbound ``passengers`` (checkpoint-only tensors, with their shapes)."""
    if all(k == v for k, v in names.items()) and not passengers:
        return spec
    return type(spec)(spaces=spec.spaces, tensors={**{names[k]: v for k, v in spec.tensors.items()},
                                                   **dict.fromkeys(passengers, ())},
                      shapes={**{names[k]: v for k, v in spec.shapes.items()}, **passengers}, probes=spec.probes,
                      repair_points=spec.repair_points,
                      aliases={names[a]: names[p] for a, p in spec.aliases.items()})


# -------------------------------------------------------------------------------------------- streaming
def stream_weight_matching(spec: SymmetrySpec, a: Checkpoint, b: Checkpoint, **kwargs: Any) -> Alignment:
    """:func:`modeconn.weight_matching` of two checkpoint directories (or lazy checkpoints), streamed: B's element
    aligning it to A. ``kwargs``: restarts, max_iter, rtol, seed, init, keys, chunk, progress. Raises as
    :func:`modeconn.weight_matching` and :class:`~modeconn.io_stream.LazyCheckpoint`."""
    a, b = _lazy(a), _lazy(b)
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
    :data:`~modeconn.io_stream.READ_AHEAD` keys ahead on a background thread."""
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
    ckpt = _lazy(src)
    _check_inputs(spec, [ckpt], [element])
    cache: dict = {}
    tick = (lambda d, t: progress("writing", d, t)) if progress is not None else None
    with _reader(spec, [ckpt], write_order(ckpt)) as reader:
        return write_like(out, ckpt, lambda k: _tensor(spec, _source(spec, ckpt, k), reader.get(k)[0], element, cache),
                          files=with_config(ckpt.path, files), overwrite=overwrite, progress=tick, command="align")


def stream_merge(spec: SymmetrySpec | None, srcs: Sequence[Checkpoint], out: PathLike, *,
                 weights: Sequence[float] | None = None, elements: Sequence[Element | None] | None = None,
                 files: Mapping[str, Any] | None = None, overwrite: bool = False,
                 progress: Progress | None = None, normalize: bool = True, rule: str = "linear",
                 settings: RuleSettings | None = None, dtype: torch.dtype | None = None,
                 out_dtype: torch.dtype | None = None, device: str | torch.device | None = None) -> Path:
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
        rule: the merge rule applied to each tensor (:data:`~modeconn.path.merge_rules.MERGE_RULES`; ``linear``);
            ``settings``: its base, parameters and seed (:class:`~modeconn.path.merge_rules.RuleSettings`).
        dtype: inputs cast to it before the rule (mergekit's recipe ``dtype``); ``out_dtype``: the written floating
            tensors' dtype.
        device: where the arithmetic runs (``None``/``"cpu"``: the CPU, as before; ``"cuda"`` …): each tensor's
            inputs are copied there and the result back.
    Returns: ``out``, created atomically. Peak memory: :data:`~modeconn.io_stream.READ_AHEAD` + 1 keys' tensors per
        model read, the fp32 sum, :data:`~modeconn.io_stream.WRITE_BEHIND` + 1 results.
    Raises: ConfigError (fewer than two models, bad weights or rule settings, elements not one per model, a device
        that is not available — named),
        StateDictMismatchError (keys/shapes differ), SpecError, CheckpointError; NonFiniteError naming the model and
        tensor with NaN/Inf, or the rule and tensor where the rule makes NaN/Inf from finite inputs or overflows the
        output dtype — raised here, not on the writer thread, and nothing is written then.
    """
    ckpts = [_lazy(s) for s in srcs]
    if len(ckpts) < 2:
        raise ConfigError(f"merging needs at least two checkpoints, got {len(ckpts)}")
    device = resolve_device(device, "device")
    weights = merge_weights(weights, len(ckpts), normalize=normalize)  # before any work
    merge_rule = check_rule_settings(rule, settings, len(ckpts))
    elements = list(elements) if elements is not None else [None] * len(ckpts)
    if len(elements) != len(ckpts):
        raise ConfigError(f"elements must have one entry (or None) per checkpoint: {len(elements)} for {len(ckpts)}")
    _check_inputs(spec, ckpts, elements)
    metas = [c.meta() for c in ckpts]
    keys = _merged_keys(metas[0])
    settings = plan_settings(merge_rule, metas, weights, settings, keys, dtype=dtype)
    names = [str(c.path) for c in ckpts]
    caches: list[dict] = [{} for _ in ckpts]
    layout = _layout_in(ckpts[0].layout, out_dtype)
    merge_one = functools.partial(_merge_one, names=names, weights=weights, rule=rule, settings=settings, dtype=dtype,
                                  out_dtype=out_dtype, device=None if is_cpu(device) else device)

    def produce(key: str) -> torch.Tensor:
        stored = zip(ckpts, reader.get(key), elements, caches, strict=True)
        return merge_one(key, [_tensor(spec, _source(spec, c, key), t, g, cache) for c, t, g, cache in stored])

    tick = (lambda d, t: progress("writing", d, t)) if progress is not None else None
    with _reader(spec, ckpts, write_order(layout)) as reader:
        return write_like(out, layout, produce, files=with_config(ckpts[0].path, files, out_dtype),
                          overwrite=overwrite, progress=tick, inputs=[c.path for c in ckpts], command="merge")


def _merged_keys(meta: Mapping[str, torch.Tensor]) -> list[str]:
    """The tensors a merge rule combines: the floating (and complex) ones; the rest are the first model's."""
    return [k for k, t in meta.items() if t.is_floating_point() or t.is_complex()]


PROPAGATING_RULES = frozenset({"linear"})
"""Rules whose result is NaN/Inf wherever an input is (``Σ w_i t_i`` in IEEE arithmetic): for them a finite result
proves finite inputs, and the inputs are scanned only when it is not (to name the model at fault)."""


def _merge_one(key: str, tensors: list[torch.Tensor], *, names: list[str], weights: list[float], rule: str,
               settings: RuleSettings | None, dtype: torch.dtype | None, out_dtype: torch.dtype | None,
               device: torch.device | None) -> torch.Tensor:
    """One merged tensor of :func:`stream_merge` (on ``device`` when given); NonFiniteError naming the model and
    ``key`` for NaN/Inf inputs, the same error whichever the rule (:data:`PROPAGATING_RULES` check after merging)."""
    if device is not None:
        tensors = [t.to(device, non_blocking=True) for t in tensors]
    sds = [{key: t} for t in tensors]
    propagating = rule in PROPAGATING_RULES
    if not propagating:
        for sd, name in zip(sds, names, strict=True):
            check_finite(sd, name)
    out = weighted_average(sds, weights, check=False, normalize=False, rule=rule, settings=settings, dtype=dtype,
                           out_dtype=out_dtype)[key]
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


def with_config(src: PathLike, files: Mapping[str, Any] | None, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """``files`` plus the ``config.json`` of checkpoint directory ``src`` when ``files`` has none (so that
    ``from_pretrained`` reads the real architecture); with ``dtype``, the config's dtype field (``dtype`` /
    ``torch_dtype``) set to it. CheckpointError for an unreadable config that has to be rewritten."""
    files = dict(files or {})
    source = files.get(CONFIG_NAME, Path(src) / CONFIG_NAME)
    if CONFIG_NAME not in files and not Path(source).is_file():
        return files
    files[CONFIG_NAME] = source
    if dtype is None:
        return files
    cfg = dict(source) if isinstance(source, Mapping) else read_json_object(Path(source), "config file")
    fields = [f for f in ("dtype", "torch_dtype") if f in cfg] or ["dtype"]
    files[CONFIG_NAME] = {**cfg, **dict.fromkeys(fields, str(dtype).removeprefix("torch."))}
    return files


# ---------------------------------------------------------------------------------------------- recipes
def side_files(path: PathLike) -> dict[str, Path]:
    """The files of a checkpoint directory that travel with its weights (config.json, generation config, tokenizer
    files …): every top-level regular file except weights (safetensors, index, pickles, other weight formats) and
    modeconn's own alignment/merge records. CheckpointError naming the file and its target if one is a symlink
    leaving the checkpoint's tree (:func:`modeconn.io.check_in_checkpoint`; Hugging Face cache blobs are allowed)."""
    path = Path(path)
    files = {p.name: p for p in sorted(path.iterdir())
             if p.is_file() and not p.name.startswith(".") and p.suffix.lower() not in WEIGHT_SUFFIXES
             and not p.name.endswith(INDEX_SUFFIX) and p.name not in RECORDS}
    for p in files.values():
        check_in_checkpoint(p, path)
    return files


def _open_pair(paths: Sequence[PathLike], out: PathLike, overwrite: bool,
               groups: str | Mapping[str, str | None] | None = "permutation"):
    """Every cheap check before heavy work: one vocabulary, configs agree, weights complete, spec fits (``groups``
    ``None``: no spec, names/shapes/dtype kinds only), ``out`` writable. Returns ``(spec or None, lazy ckpts)``."""
    _check_target(Path(out), overwrite, paths)
    for p in paths:
        if not is_hf_checkpoint(p):
            raise CheckpointError(f"{p}: not a Hugging Face checkpoint directory (config.json with model_type)")
    check_vocabularies(paths)
    configs = check_same_hf_configs(paths)
    for p in paths:  # side files that would be copied to --out: no symlink out of the checkpoint
        side_files(p)
    ckpts = [LazyCheckpoint(p) for p in paths]
    spec = None if groups is None else hf_checkpoint_spec(paths[0], groups, config=configs[0], checkpoint=ckpts[0])
    _check_inputs(spec, ckpts, [])
    return spec, ckpts


def resolve_checkpoint_path(path: PathLike) -> Path:
    """``path`` itself, or for a Hugging Face hub cache entry (``…/models--ORG--NAME`` with ``snapshots/``) its
    snapshot: the revision ``refs/main`` names, else the only one. CheckpointError naming the entry and its
    revisions when that is ambiguous or the named snapshot is missing."""
    p = Path(path)
    snaps = p / "snapshots"
    if not (p.name.startswith("models--") and snaps.is_dir()):
        return p
    revs = sorted(d.name for d in snaps.iterdir() if d.is_dir())
    ref = p / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text().strip()
        if (snaps / rev).is_dir():
            return snaps / rev
        raise CheckpointError(f"{p}: refs/main names revision {rev!r}, which is not among its snapshots {revs}")
    if len(revs) == 1:
        return snaps / revs[0]
    raise CheckpointError(f"{p}: Hugging Face cache entry with snapshots {revs} and no refs/main; pass one snapshot "
                          f"directory ({snaps}/<revision>)")


def model_names(paths: Sequence[PathLike]) -> list[str]:
    """Names of checkpoint directories for records and model cards, never machine paths: ``ORG/NAME@REVISION`` for
    a Hugging Face cache snapshot, else the directory's name (with its parent's where two names would collide)."""
    def name(p: Path, depth: int) -> str:
        return hub_id(p) or "/".join(p.resolve().parts[-depth:])

    names = [name(Path(p), 1) for p in paths]
    if len(set(names)) < len(names):
        names = [name(Path(p), 2) for p in paths]
    return names


def hub_id(path: PathLike) -> str | None:
    """``ORG/NAME@REVISION`` for a directory inside a Hugging Face hub cache snapshot
    (``…/models--ORG--NAME/snapshots/REVISION``), else None."""
    parts = Path(path).resolve().parts
    for i, part in enumerate(parts[:-2]):
        if part.startswith("models--") and parts[i + 1] == "snapshots":
            return part.removeprefix("models--").replace("--", "/") + "@" + parts[i + 2]
    return None


def align_hf_checkpoints(a: PathLike, b: PathLike, out: PathLike, *, seed: int = 0,
                         restarts: int = DEFAULTS.restarts, max_iter: int = DEFAULTS.max_iter, chunk: int = 1 << 20,
                         overwrite: bool = False, progress: Progress | None = None, device: str | torch.device | None = None) -> Alignment:
    """Streaming weight matching of Hugging Face checkpoint B to A, and B aligned written to ``out``.

    ``out`` gets B's layout (same shards and index), B's side files (config.json …) and ``alignment.json`` (the
    element, objective, history and stats of :func:`modeconn.weight_matching`, plus ``aligned_to`` and ``source``).
    The aligned B computes the same function as B (permutations are exact). Every check (configs field by field,
    shards, spec, ``out``, ``device``) runs before the matching; ``device``: where the score products run
    (:class:`~modeconn.match.weight.WeightMatchingConfig`). Returns the :class:`~modeconn.match.Alignment`.
    Raises: see :func:`hf_checkpoint_spec`, :func:`modeconn.weight_matching`, :func:`stream_apply`.
    """
    device = resolve_device(device, "device")
    spec, (ca, cb) = _open_pair([a, b], out, overwrite)
    res = weight_matching(spec, ca, cb, restarts=restarts, max_iter=max_iter, seed=seed, chunk=chunk,
                          progress=progress, device=device)
    record = {**res.to_json(), "aligned_to": model_names([a])[0], "source": model_names([b])[0],
              "settings": {"restarts": restarts, "max_iter": max_iter, "seed": seed}}
    stream_apply(spec, cb, res.element, out, files={**side_files(b), "alignment.json": record},
                 overwrite=overwrite, progress=progress)
    return res


def merge_hf_checkpoints(paths: Sequence[PathLike], out: PathLike, *, weights: Sequence[float] | None = None,
                         align: str = "weight", seed: int = 0, restarts: int = DEFAULTS.restarts,
                         max_iter: int = DEFAULTS.max_iter, chunk: int = 1 << 20, overwrite: bool = False,
                         progress: Progress | None = None, normalize: bool = True,
                         rule: str = "linear", settings: RuleSettings | None = None,
                         dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None,
                         groups: str | Mapping[str, str | None] = "permutation",
                         files: Mapping[str, Any] | Callable[[dict], Mapping[str, Any]] | None = None,
                         device: str | torch.device | None = None) -> dict[str, Any]:
    """Merge Hugging Face checkpoints: align every one to the first (``align="weight"``: streaming weight matching
    with ``groups``; ``"none"``: as stored — then any architecture with matching tensor names, shapes and dtype
    kinds, no symmetry adapter needed), then write the merge to ``out`` in the first one's layout.

    ``out`` also gets the side files (config.json, tokenizer files …) of the base model (``settings.base``) or else
    the first, ``files`` (e.g. a model card; or a function of the record returning them) and ``merge.json``: the
    inputs' names (:func:`model_names`, never machine paths), weights as applied (``None`` where the rule uses
    none: the base of a task-vector rule, every model of a rule without weights), rule, parameters, base, the seed of
    a randomised rule, the alignment's settings (groups, restarts, max_iter, seed) and its objectives and stats.
    ``paths`` may be Hugging Face
    cache entries (:func:`resolve_checkpoint_path`). ``weights``/``normalize``/``rule``/``settings``/``dtype``/
    ``out_dtype`` as in :func:`stream_merge`; a rule weighting task vectors (``non_base``) takes the weights as given
    (default 1 each); ``seed`` also seeds a randomised rule unless ``settings.seed`` is set; ``device``: where the
    score products and the merge arithmetic run (checked before any work). Returns the record.
    Raises: ConfigError (align not weight/none, fewer than two models, bad weights or rule settings, a parameter
    filter that selects no tensor, different vocabularies — the first differing token named) and as
    :func:`align_hf_checkpoints`; NonFiniteError (nothing written) when the rule makes NaN/Inf from finite inputs.
    """
    if align not in ("weight", "none"):
        raise ConfigError(f"Hugging Face checkpoints are aligned by streaming weight matching: align must be "
                          f"'weight' or 'none', got {align!r}")
    if len(paths) < 2:
        raise ConfigError(f"merging needs at least two checkpoints, got {len(paths)}")
    paths = [resolve_checkpoint_path(p) for p in paths]
    merge_rule = MERGE_RULES.get(rule)
    w = rule_weights(merge_rule, weights, len(paths), normalize=normalize)  # checked before heavy work
    settings = settings or RuleSettings()
    if merge_rule.random and settings.seed is None:
        settings = dataclasses.replace(settings, seed=seed)
    check_rule_settings(merge_rule, settings, len(paths), weights_given=weights is not None)
    device = resolve_device(device, "device")
    spec, ckpts = _open_pair(paths, out, overwrite, None if align == "none" else groups)
    check_filters(settings, _merged_keys(ckpts[0].meta()))  # a filter that selects nothing: before the alignment
    names = model_names(paths)
    elements, alignments = _align_to_first(spec, ckpts, names, align, dict(seed=seed, restarts=restarts,
                                                                          max_iter=max_iter, chunk=chunk,
                                                                          device=device), progress)
    record = {"merged_from": names, "weights": applied_weights(merge_rule, w, settings.base), "rule": rule,
              "source": merge_rule.source, "align": align,
              "align_settings": {"groups": groups, "restarts": restarts, "max_iter": max_iter, "seed": seed}
              if align == "weight" else None,
              "base": None if settings.base is None else names[settings.base], "params": dict(settings.params),
              "model_params": [dict(p) for p in settings.model_params], "seed": settings.seed if merge_rule.random else None,
              "dtype": _dtype_name(dtype), "out_dtype": _dtype_name(out_dtype), "alignments": alignments,
              "input_dtypes": sorted({_dtype_name(i.dtype) for c in ckpts for i in c.infos.values()
                                      if i.dtype.is_floating_point})}
    src = paths[settings.base if settings.base is not None else 0]
    extra = files(record) if callable(files) else (files or {})
    stream_merge(spec, ckpts, out, weights=w, normalize=False, elements=elements, rule=rule, settings=settings,
                 dtype=dtype, out_dtype=out_dtype, files={**side_files(src), **extra, "merge.json": record},
                 overwrite=overwrite, progress=progress, device=device)
    return record


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _align_to_first(spec, ckpts: list[LazyCheckpoint], names: list[str], align: str, wm: dict, progress):
    """Per model the element aligning it to the first (``None`` for the first and for ``align="none"``) and the
    alignment records (name, objective, stats)."""
    elements: list[Element | None] = [None]
    alignments = []
    for i, c in enumerate(ckpts[1:], 1):
        if align == "none":
            elements.append(None)
            continue
        tick = (lambda s, d, t, i=i: progress(f"model {i + 1}: {s}", d, t)) if progress is not None else None
        res = weight_matching(spec, ckpts[0], c, progress=tick, **wm)
        elements.append(res.element)
        alignments.append({"model": names[i], "objective": res.objective, "stats": res.stats})
    return elements, alignments


__all__ = [
    "align_hf_checkpoints", "check_same_hf_configs", "check_vocabularies", "checkpoint_tensor_names",
    "hf_checkpoint_spec", "hf_config", "is_hf_checkpoint", "merge_hf_checkpoints", "model_names",
    "resolve_checkpoint_path", "side_files", "stream_apply", "stream_merge", "stream_weight_matching",
]


def align_hf_full_group(a: PathLike, b: PathLike, out: PathLike, *, seed: int = 0,
                        restarts: int = DEFAULTS.restarts, max_iter: int = DEFAULTS.max_iter, chunk: int = 1 << 20, overwrite: bool = False,
                        progress: Progress | None = None, max_shard_bytes: int = 2 << 30,
                        device: str | torch.device | None = None) -> Alignment:
    """Full-group weight matching of Hugging Face checkpoint B to A, out of core: both are normalization-absorbed
    tensor by tensor (:class:`~modeconn.symmetry.absorb_stream.AbsorbedView`, no intermediate copy), matched with
    :data:`FULL_GROUPS` streaming, and written to ``out`` as ``a/`` (A absorbed) and ``b/`` (B absorbed and
    aligned) — absorbed checkpoints :func:`~modeconn.symmetry.absorb.load_absorbed` and the CLI read — plus
    ``alignment.json``. The aligned B computes B's function (up to fp rounding of the rotation).

    Returns the :class:`~modeconn.match.Alignment`. Raises: UnsupportedOperationError for a family absorption does
    not apply to (the reason named), and as :func:`align_hf_checkpoints`; every check runs before the matching.
    """
    from ._util.outdir import output_directory
    from .io_stream import ABSORBED_STEM
    from .symmetry.absorb_stream import AbsorbedView
    from .symmetry.hf import hf_symmetry_spec

    device = resolve_device(device, "device")
    _open_pair([a, b], out, overwrite, groups=None)  # configs, vocabularies, weights, out: before any work
    va, vb = AbsorbedView(a), AbsorbedView(b)
    spec = hf_symmetry_spec(va.model, FULL_GROUPS)
    res = weight_matching(spec, va, vb, restarts=restarts, max_iter=max_iter, seed=seed, chunk=chunk,
                          progress=progress, device=device)
    layout = ShardLayout.plan(va.shapes, max_shard_bytes, stem=ABSORBED_STEM)
    cache: dict = {}
    with output_directory(out, inputs=[a, b], overwrite=overwrite, command="align") as tmp:
        write_like(tmp / "a", layout, va.__getitem__, files={**_side(a), CONFIG_NAME: va.absorbed_config()},
                   inputs=[a])
        write_like(tmp / "b", layout, lambda k: spec.apply_tensor(k, vb[k], res.element, cache=cache),
                   files={**_side(b), CONFIG_NAME: vb.absorbed_config()}, inputs=[b])
        record = {**res.to_json(), "groups": FULL_GROUPS, "aligned_to": model_names([a])[0],
                  "source": model_names([b])[0]}
        write_json(tmp / "alignment.json", record, nan="null")
    return res


def _side(path: PathLike) -> dict[str, Path]:
    return {k: v for k, v in side_files(path).items() if k != CONFIG_NAME}
