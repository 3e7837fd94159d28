"""The Hugging Face back-ends of ``modeconn align`` and ``modeconn merge``: streaming weight matching of a pair (or the
full transformer group after normalization absorption), and streaming merges, written next to their records."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .._util.jsonio import write_json
from ..io import CONFIG_NAME
from ..io.safe import read_json_object
from ..io.hf import PathLike, code_free_side_files, model_names, resolve_checkpoint_path, without_remote_code
from ..io.lazy import ShardLayout, write_like
from ..match.result import Alignment
from ..match.weight import DEFAULTS, WeightMatchingConfig, align_to_first, weight_matching
from ..path.merge_layers import with_layer_positions
from ..path.merge_rules import MergeRule, RuleSettings, applied_weights, check_filters, tensor_weighted
from ..stream import merged_keys, open_hf_checkpoints, stream_apply, stream_merge
from ..symmetry.hf import FULL_GROUPS
from .merge_plan import MergePlan
from .merge_tokenizer import tokenizer_record

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: the stage (``"run 1/1 sweep 2"``, ``"writing"``), units done and their total."""


def align_hf_checkpoints(a: PathLike, b: PathLike, out: PathLike,
                         config: WeightMatchingConfig | Mapping[str, Any] | None = None, *, overwrite: bool = False,
                         progress: Progress | None = None, **options: Any) -> Alignment:
    """Streaming weight matching of Hugging Face checkpoint B to A, and B aligned written to ``out``.

    ``config`` / ``options``: weight matching's :class:`~modeconn.match.weight.WeightMatchingConfig` (an instance, a
    mapping, or keyword fields: ``seed``, ``restarts``, ``max_iter``, ``chunk``, ``device`` — where the score
    products run — …; every field applies to streaming). ``out`` gets B's layout (same shards and index), B's side
    files (config.json …) and ``alignment.json`` (the element, objective, history and stats of
    :func:`modeconn.weight_matching`, plus ``aligned_to``, ``source`` and the ``settings``). The aligned B computes
    the same function as B (permutations are exact). Every check (options, configs field by field, shards, spec,
    ``out``, ``device``) runs before the matching. Returns the :class:`~modeconn.match.Alignment`.
    Raises: see :func:`hf_checkpoint_spec`, :func:`modeconn.weight_matching`, :func:`stream_apply`.
    """
    cfg = WeightMatchingConfig.from_any(config, **options)
    spec, (ca, cb) = open_hf_checkpoints([a, b], out, overwrite)
    res = weight_matching(spec, ca, cb, cfg, progress=progress)
    record = {**res.to_json(), "aligned_to": model_names([a])[0], "source": model_names([b])[0],
              "settings": wm_settings(cfg)}
    stream_apply(spec, cb, res.element, out, files={**code_free_side_files(b), "alignment.json": record},
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
    score products and the merge arithmetic run (checked before any work). Every option is resolved once into a
    :class:`~modeconn.recipes.merge_plan.MergePlan` (:func:`merge_hf_plan` runs it). Returns the record.
    Raises: ConfigError (align not weight/none, fewer than two models, bad weights or rule settings, a parameter
    filter that selects no tensor, different vocabularies — the first differing token named) and as
    :func:`align_hf_checkpoints`; NonFiniteError (nothing written) when the rule makes NaN/Inf from finite inputs.
    """
    from .merge_plan import MergeOptions, checked_plan

    if align not in ("weight", "none"):
        raise ConfigError(f"Hugging Face checkpoints are aligned by streaming weight matching: align must be "
                          f"'weight' or 'none', got {align!r}")
    if len(paths) < 2:
        raise ConfigError(f"merging needs at least two checkpoints, got {len(paths)}")
    opts = MergeOptions(normalize=normalize, rule=rule, align=align, seed=seed, overwrite=overwrite, device=device)
    plan = checked_plan([resolve_checkpoint_path(p) for p in paths], opts, weights, settings or RuleSettings(),
                        groups=groups)
    wm = WeightMatchingConfig(seed=seed, restarts=restarts, max_iter=max_iter, chunk=chunk, device=device)
    plan = dataclasses.replace(plan, dtype=dtype, out_dtype=out_dtype, align_config=wm if align == "weight" else None)
    return merge_hf_plan(plan, out, files=files, progress=progress)


def merge_hf_plan(plan: MergePlan, out: PathLike, *,
                  files: Mapping[str, Any] | Callable[[dict], Mapping[str, Any]] | None = None,
                  progress: Progress | None = None) -> dict[str, Any]:
    """Run a resolved merge ``plan`` on Hugging Face checkpoints (:func:`merge_hf_checkpoints` describes what is
    written): its rule entry, weights, settings, device, dtypes and weight-matching config are used as they are.
    ConfigError for an alignment method that does not stream."""
    if plan.align is not None and not plan.align.streams:
        raise ConfigError(f"Hugging Face checkpoints are aligned by streaming weight matching: align must be "
                          f"'weight' or 'none' (a method that streams), got {plan.align.name!r}")
    paths, rule, settings, w = plan.models, plan.rule, plan.settings, plan.weights
    if rule.random and settings.seed is None:
        settings = dataclasses.replace(settings, seed=plan.opts.seed or 0)
    vocab = _vocabulary(plan, settings)
    spec, ckpts = open_hf_checkpoints(paths, out, plan.opts.overwrite, None if plan.align is None else plan.groups,
                                      vocabulary=vocab if vocab is not None and vocab.remap else None)
    keys = merged_keys(ckpts[0].meta())
    check_filters(settings, keys)  # a filter that selects nothing: before the alignment
    settings = with_layer_positions(settings, keys)
    names = model_names(paths)
    elements, alignments = align_to_first(spec, ckpts, names, plan.align_config, progress)
    record = {"merged_from": names, "rule": rule.name, "source": rule.source, "align": plan.opts.align,
              "align_settings": None if plan.align_config is None
              else {"groups": plan.groups, **wm_settings(plan.align_config)},
              "base": None if settings.base is None else names[settings.base], **_weights_record(rule, w, settings),
              "model_params": [dict(p) for p in settings.model_params], "seed": settings.seed if rule.random else None,
              "dtype": dtype_name(plan.dtype), "out_dtype": dtype_name(plan.out_dtype), "alignments": alignments,
              "input_dtypes": sorted({dtype_name(i.dtype) for c in ckpts for i in c.infos.values()
                                      if i.dtype.is_floating_point}),
              **({"tokenizer": tokenizer_record(plan.tokenizer, names)} if plan.tokenizer is not None else {})}
    src = paths[settings.base if settings.base is not None else 0]
    extra = files(record) if callable(files) else (files or {})
    side = code_free_side_files(src)
    if vocab is not None:
        side = vocab.side_files(side, without_remote_code(read_json_object(src / CONFIG_NAME, "config file")))
    fill = vocab.filler(ckpts) if vocab is not None and vocab.remap else None
    stream_merge(spec, ckpts, out, weights=w, normalize=False, elements=elements, rule=rule, settings=settings,
                 dtype=plan.dtype, out_dtype=plan.out_dtype, files={**side, **extra, "merge.json": record},
                 overwrite=plan.opts.overwrite, progress=progress, device=plan.device, fill=fill)
    return record


def _vocabulary(plan: MergePlan, settings: RuleSettings):
    """The output vocabulary of a recipe with tokenizer keys (:mod:`~.merge_vocab`; None without them)."""
    if plan.tokenizer is None:
        return None
    from .merge_vocab import plan_vocabulary

    return plan_vocabulary(plan.tokenizer, plan.models, settings.base, aligned=plan.align is not None,
                           dtype=plan.dtype, where=str(plan.opts.config))


def _weights_record(rule: MergeRule, weights: Sequence[float], settings: RuleSettings) -> dict[str, Any]:
    """The record's ``weights`` (as applied) and ``params``; weights given as parameter settings stay there (with
    a linear merge's ``normalize``), and ``weights`` is None."""
    if not tensor_weighted(settings):
        return {"weights": applied_weights(rule, weights, settings.base), "params": dict(settings.params)}
    normalize = {"normalize": settings.normalize} if rule.weights == "all" and "normalize" not in rule.params else {}
    return {"weights": None, "params": {**settings.params, **normalize}}


def dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def align_hf_full_group(a: PathLike, b: PathLike, out: PathLike,
                        config: WeightMatchingConfig | Mapping[str, Any] | None = None, *, overwrite: bool = False,
                        progress: Progress | None = None, max_shard_bytes: int = 2 << 30, **options: Any) -> Alignment:
    """Full-group weight matching of Hugging Face checkpoint B to A, out of core: both are normalization-absorbed
    tensor by tensor (:class:`~modeconn.symmetry.absorb_stream.AbsorbedView`, no intermediate copy), matched with
    :data:`FULL_GROUPS` streaming, and written to ``out`` as ``a/`` (A absorbed) and ``b/`` (B absorbed and
    aligned) — absorbed checkpoints :func:`~modeconn.symmetry.absorb.load_absorbed` and the CLI read — plus
    ``alignment.json``. The aligned B computes B's function (up to fp rounding of the rotation). ``config`` /
    ``options``: weight matching's, as in :func:`align_hf_checkpoints`.

    Returns the :class:`~modeconn.match.Alignment`. Raises: UnsupportedOperationError for a family absorption does
    not apply to (the reason named), and as :func:`align_hf_checkpoints`; every check runs before the matching.
    """
    from .._util.outdir import output_directory
    from ..io.lazy import ABSORBED_STEM
    from ..symmetry.absorb_stream import AbsorbedView
    from ..symmetry.hf import hf_symmetry_spec

    cfg = WeightMatchingConfig.from_any(config, **options)
    open_hf_checkpoints([a, b], out, overwrite, groups=None)  # configs, vocabularies, weights, out: before any work
    va, vb = AbsorbedView(a), AbsorbedView(b)
    spec = hf_symmetry_spec(va.model, FULL_GROUPS)
    res = weight_matching(spec, va, vb, cfg, progress=progress)
    layout = ShardLayout.plan(va.shapes, max_shard_bytes, stem=ABSORBED_STEM)
    cache: dict = {}
    with output_directory(out, inputs=[a, b], overwrite=overwrite, command="align") as tmp:
        write_like(tmp / "a", layout, va.__getitem__, files={**_side(a), CONFIG_NAME: va.absorbed_config()},
                   inputs=[a])
        write_like(tmp / "b", layout, lambda k: spec.apply_tensor(k, vb[k], res.element, cache=cache),
                   files={**_side(b), CONFIG_NAME: vb.absorbed_config()}, inputs=[b])
        record = {**res.to_json(), "groups": FULL_GROUPS, "aligned_to": model_names([a])[0],
                  "source": model_names([b])[0], "settings": wm_settings(cfg)}
        write_json(tmp / "alignment.json", record, nan="null")
    return res


def wm_settings(cfg: WeightMatchingConfig) -> dict[str, Any]:
    """What a re-run of a weight matching needs, for its record: ``restarts``, ``max_iter``, ``seed`` and every other
    field an option set (a group element as ``init`` recorded as ``"element"``)."""
    chosen = {k: getattr(cfg, k) for k in ("restarts", "max_iter", "seed", *sorted(cfg.model_fields_set))}
    if not isinstance(chosen.get("init", ""), str):
        chosen["init"] = "element"
    return chosen


def _side(path: PathLike) -> dict[str, Path]:
    return {k: v for k, v in code_free_side_files(path).items() if k != CONFIG_NAME}
