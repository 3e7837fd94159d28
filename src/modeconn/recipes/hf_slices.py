"""The Hugging Face back-end of a merge recipe with ``slices``: layer ranges of the models stacked (and merged per
slice by the recipe's rule), streamed tensor by tensor into a new layout, with the output's config giving the new
layer count — as ``mergekit-yaml`` writes it (:func:`~modeconn.path.merge_layers.stack_plan`).

Every model the slices name is aligned to the reference first where the recipe asks (``align: weight``): stacked
layers then share the reference's residual basis, so layers of different models compose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..checks import check_finite
from ..errors import CheckpointError, ConfigError
from ..io import CONFIG_NAME
from ..io.hf import checkpoint_tensor_names, code_free_side_files, model_names, with_config, without_remote_code
from ..io.lazy import LazyCheckpoint, ShardLayout, write_like
from ..io.safe import read_json_object
from ..match.weight import align_to_first
from ..path.interpolate import merge_tensor
from ..path.merge_layers import OutputSlice, PlannedTensor, layer_index, stack_plan, tensor_settings
from ..path.merge_rules import MergeRule, RuleSettings, check_rule_settings, rule_weights
from ..stream import open_hf_checkpoints
from .hf_stream import Progress, dtype_name, wm_settings
from .merge_plan import MergePlan

LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
"""Config fields holding a decoder's layer count (the first present is rewritten)."""
MAX_SHARD_BYTES = 5 << 30
"""Shard size of a sliced merge's output (``save_pretrained``'s default)."""


def check_slices(rule: MergeRule, settings: RuleSettings, slices: Sequence[OutputSlice]) -> None:
    """Every slice's inputs, base and parameters checked against ``rule`` (as
    :func:`~modeconn.path.merge_rules.check_rule_settings` does for a whole-model merge, mergekit's own checks
    included), before any checkpoint is read. ConfigError naming the slice."""
    for i, sl in enumerate(slices):
        shared = {**settings.params, **sl.params}
        if _averages(rule):
            shared.pop("normalize", None)
        try:
            check_rule_settings(rule, RuleSettings(base=slice_base(rule, sl, i), params=shared,
                                                   model_params=[dict(s.params) for s in sl.sources]), len(sl.sources))
        except ConfigError as err:
            raise ConfigError(f"slices[{i}]: {err}") from None


def _averages(rule: MergeRule) -> bool:
    """The rule takes weights that are normalised by the merge (modeconn's linear), not by a parameter of its own."""
    return rule.weights == "all" and "normalize" not in rule.params


def slice_base(rule: MergeRule, sl: OutputSlice, i: int) -> int | None:
    """The index of the slice's base among its sources (None for a rule without one, which ignores it)."""
    if rule.base == "none" or sl.base is None:
        return None
    models = [s.model for s in sl.sources]
    if sl.base not in models:
        raise ConfigError(f"slices[{i}]: the base model is not among the slice's sources (merge rule {rule.name!r} "
                          "takes task vectors against it)")
    return models.index(sl.base)


def merge_slices_plan(plan: MergePlan, out: str | Path, *,
                      files: Mapping[str, Any] | Callable[[dict], Mapping[str, Any]] | None = None,
                      progress: Progress | None = None) -> dict[str, Any]:
    """Run a recipe's slices (``plan.slices``) on Hugging Face checkpoints ``plan.models``: aligned to the first
    where ``plan.align`` says, each output tensor made by ``plan.rule`` from its sources with its own parameter
    values, written in a new layout (shards of :data:`MAX_SHARD_BYTES`) with the base's (else the first slice's first
    model's) config and side files, ``files`` and the record ``merge.json``. Returns the record. Raises ConfigError /
    CheckpointError (a layer range outside a model, a layer without a tensor the first has) before anything is
    written."""
    paths, rule, settings = plan.models, plan.rule, plan.settings
    spec, ckpts = open_hf_checkpoints(paths, out, plan.opts.overwrite, None if plan.align is None else plan.groups)
    src = paths[settings.base if settings.base is not None else plan.slices[0].sources[0].model]
    config = read_json_object(Path(src) / CONFIG_NAME, "config file")
    tensors = stack_plan(plan.slices, _module_order(src, ckpts[0]))
    _check_ranges(plan.slices, ckpts, tensors, config, paths)
    jobs = _with_states(rule, settings, [(p, *_settings(rule, p, plan, settings)) for p in tensors], ckpts, plan)
    names = model_names(paths)
    elements, alignments = align_to_first(spec, ckpts, names, plan.align_config, progress)
    record = _record(plan, names, alignments, ckpts)
    extra = files(record) if callable(files) else (files or {})
    caches: list[dict] = [{} for _ in ckpts]

    def read(model: int, key: str) -> torch.Tensor:
        t = ckpts[model].read(key)
        g = elements[model]
        return t if spec is None or g is None else spec.apply_tensor(key, t, g, cache=caches[model])

    by_key = {job[0].key: job for job in jobs}

    def produce(key: str) -> torch.Tensor:
        p, weights, rule_settings = by_key[key]
        inputs = [read(m, k) for m, k in p.inputs]
        if not inputs[0].is_floating_point():
            return inputs[0]
        for (m, _), t in zip(p.inputs, inputs, strict=True):
            check_finite({key: t}, str(paths[m]))
        return merge_tensor(rule, inputs, weights, key, rule_settings, dtype=plan.dtype, out_dtype=plan.out_dtype)

    layout = ShardLayout.plan({p.key: (_out_dtype(ckpts[p.inputs[0][0]].infos[p.inputs[0][1]].dtype, plan),
                                       ckpts[p.inputs[0][0]].infos[p.inputs[0][1]].shape) for p in tensors},
                              MAX_SHARD_BYTES)
    cfg = stacked_config(config, plan.slices, src)
    written = {**code_free_side_files(src), **extra, CONFIG_NAME: cfg, "merge.json": record}
    tick = (lambda d, t: progress("writing", d, t)) if progress is not None else None
    write_like(out, layout, produce, files=with_config(src, written, plan.out_dtype or plan.dtype),
               overwrite=plan.opts.overwrite, progress=tick, inputs=list(paths), command="merge")
    return record


def _out_dtype(stored: torch.dtype, plan: MergePlan) -> torch.dtype:
    return plan.out_dtype if plan.out_dtype is not None and stored.is_floating_point else stored


def _module_order(path: str | Path, ckpt: LazyCheckpoint) -> list[str]:
    """The checkpoint's tensor names in the model's module order (embeddings, layers, final norm, heads), stored
    tensors the model does not name last."""
    from ..symmetry.hf.directory import hf_config
    from ..symmetry.hf.config_check import build_meta_model

    model = build_meta_model(hf_config(Path(path)), Path(path) / CONFIG_NAME)
    ordered = [k for k in checkpoint_tensor_names(model).values() if k in ckpt.infos]
    return list(dict.fromkeys(ordered + list(ckpt.infos)))


def stacked_config(config: Mapping[str, Any], slices: Sequence[OutputSlice], src: str | Path) -> dict[str, Any]:
    """``config`` (a ``config.json`` object) with the layer count of the stacked ``slices`` (as mergekit writes it)
    and, where the config lists a type per layer (``layer_types``), each output layer's type taken from the layer of
    the slice's first source it is made from (mergekit 0.1.5 keeps the old list, which transformers refuses); without
    ``auto_map`` (the stack is transformers' own class: an input's custom code would get other shapes)."""
    out = {**without_remote_code(config), _layer_count_key(config, src): sum(sl.depth for sl in slices)}
    types = config.get("layer_types")
    if isinstance(types, list):
        out["layer_types"] = [types[sl.sources[0].layers[0] + j] for sl in slices for j in range(sl.depth)]
    return out


def _layer_count_key(config: Mapping[str, Any], src: str | Path) -> str:
    key = next((k for k in LAYER_COUNT_KEYS if k in config), None)
    if key is None:
        raise ConfigError(f"slices: {Path(src) / CONFIG_NAME} has no layer count ({', '.join(LAYER_COUNT_KEYS)}) to "
                          "rewrite for the stacked layers")
    return key


def _check_ranges(slices: Sequence[OutputSlice], ckpts: Sequence[LazyCheckpoint], tensors: Sequence[PlannedTensor],
                  config: Mapping[str, Any], paths: Sequence[Path]) -> None:
    n = 1 + max((i for k in ckpts[0].infos if (i := layer_index(k)) is not None), default=-1)
    if n == 0:
        raise ConfigError(f"slices: {paths[0]} has no layer stack (no tensor named '…layers.N.…')")
    for i, sl in enumerate(slices):
        for j, s in enumerate(sl.sources):
            if s.layers[1] > n:
                raise ConfigError(f"slices[{i}].sources[{j}].layer_range {list(s.layers)}: the model has {n} layers")
    for p in tensors:
        for m, k in p.inputs:
            if k not in ckpts[m].infos:
                raise CheckpointError(f"{paths[m]}: no tensor {k!r} (output {p.key!r} of slices[{p.slice}])")


def _settings(rule: MergeRule, p: PlannedTensor, plan: MergePlan, settings: RuleSettings):
    """The weights and :class:`RuleSettings` of planned tensor ``p``: its parameter values resolved
    (:func:`~modeconn.path.merge_layers.tensor_settings`), the slice's base."""
    sl = plan.slices[p.slice]
    shared, own = tensor_settings(p, sl, settings.params)
    normalize = settings.normalize
    if _averages(rule):
        normalize = bool(shared.pop("normalize", normalize))
        for o in own:
            o.pop("normalize", None)
    n = len(p.inputs)
    weights = rule_weights(rule, None, n, normalize=normalize)
    return weights, RuleSettings(base=slice_base(rule, sl, p.slice), params=shared, model_params=own,
                                 seed=settings.seed, normalize=normalize)


def _with_states(rule: MergeRule, settings: RuleSettings, jobs: list, ckpts: Sequence[LazyCheckpoint],
                 plan: MergePlan) -> list:
    """``jobs`` (planned tensor, weights, settings; every parameter resolved before any work) with the generator
    state each tensor of a randomised rule starts from, as ``mergekit-yaml --random-seed`` draws them."""
    if not rule.random:
        return jobs
    from ..path.merge_mergekit import replay_random_states

    def inputs(p: PlannedTensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [(ckpts[m].infos[k].shape, plan.dtype or ckpts[m].infos[k].dtype) for m, k in p.inputs]

    draws = [(p.key, max(k for _, k in p.inputs), inputs(p), w, s) for p, w, s in jobs
             if ckpts[p.inputs[0][0]].infos[p.inputs[0][1]].dtype.is_floating_point]
    _check_schedule(rule, [(d[0], d[1]) for d in draws])
    states = replay_random_states(rule, settings.seed if settings.seed is not None else plan.opts.seed or 0, draws)
    return [(p, w, replace(s, states={p.key: states[p.key]}) if p.key in states else s) for p, w, s in jobs]


def _check_schedule(rule: MergeRule, names: Sequence[tuple[str, str]]) -> None:
    """ConfigError when two output tensors of a randomised rule share their scheduling name (the largest name of
    their inputs): mergekit orders those two merges — and so their draws — by its task graph's internals."""
    seen: dict[str, str] = {}
    for key, order in names:
        if order in seen:
            raise ConfigError(f"slices: merge rule {rule.name!r} draws random numbers in the order mergekit schedules "
                              f"its merges, which is not defined for {seen[order]!r} and {key!r} (both made from "
                              f"inputs named up to {order!r}); use a deterministic rule or other layer ranges")
        seen[order] = key


def _record(plan: MergePlan, names: list[str], alignments: list, ckpts: Sequence[LazyCheckpoint]) -> dict[str, Any]:
    settings = plan.settings
    params = dict(settings.params)
    if _averages(plan.rule):
        params["normalize"] = settings.normalize
    return {"merged_from": names, "rule": plan.rule.name, "source": plan.rule.source, "align": plan.opts.align,
            "align_settings": None if plan.align_config is None
            else {"groups": plan.groups, **wm_settings(plan.align_config)},
            "base": None if settings.base is None else names[settings.base], "weights": None, "params": params,
            "model_params": [], "slices": [_slice_record(sl, names) for sl in plan.slices],
            "seed": settings.seed if plan.rule.random else None,
            "dtype": dtype_name(plan.dtype), "out_dtype": dtype_name(plan.out_dtype), "alignments": alignments,
            "input_dtypes": sorted({dtype_name(i.dtype) for c in ckpts for i in c.infos.values()
                                    if i.dtype.is_floating_point})}


def _slice_record(sl: OutputSlice, names: list[str]) -> dict[str, Any]:
    return {"sources": [{"model": names[s.model], "layer_range": list(s.layers),
                         **({"parameters": dict(s.params)} if s.params else {})} for s in sl.sources],
            **({"parameters": dict(sl.params)} if sl.params else {}),
            **({"base_model": names[sl.base]} if sl.base is not None else {})}
