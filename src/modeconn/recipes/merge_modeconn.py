"""`modeconn merge` in memory: align checkpoints to the first (any registered method, by registry dispatch), merge by
the rule, fix BatchNorm (reset, interpolate or REPAIR), evaluate, save — for every kind loaded in memory (modeconn,
timm, torchvision …), through the kind's hooks (load, feed, example input, save)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path

from .._util.outdir import check_output_target
from ..checkpoints import load_same_architecture, open_checkpoints
from ..data import load_dataset, make_loader
from ..errors import CheckpointError, ConfigError
from ..nn_utils import batchnorm_modules
from ..path import evaluate_model, merge
from ..path.batchnorm import check_bn_statistics
from ..path.merge_rules import RuleSettings, applied_weights
from ..symmetry import symmetry_spec
from .merge_plan import MergeOptions, MergePlan, align_choices, checked_plan, with_alignment
from .scope import IN_MEMORY_EXCLUDED

Log = Callable[[str], None]


def __getattr__(name: str) -> tuple[str, ...]:
    """``ALIGN_CHOICES``: the ``--align`` values, read from the registry when asked
    (:func:`~.merge_plan.align_choices`)."""
    if name == "ALIGN_CHOICES":
        return align_choices()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_merge(paths: Sequence[Path], out: Path, *, weights: Sequence[float] | None = None, align_method: str = "weight",
              bn: str = "reset", dataset: str | None = None, data: Path | None = None, limit_train: int | None = None,
              seed: int = 0, overwrite: bool = False, normalize: bool = True, rule: str = "linear",
              settings: RuleSettings | None = None, log: Log = print, device: str | None = None,
              restarts: int | None = None, max_iter: int | None = None):
    """Merge checkpoint directories; returns (output path, test metrics or {}).

    ``weights``/``normalize``/``rule``/``settings`` as in :func:`modeconn.merge` (validated before any checkpoint is
    read; the config records the weights used, rule and inputs); ``align_method``: a registered alignment method
    that does not train on the models (:func:`~.merge_plan.align_choices`) or ``"none"``; ``device``, ``restarts``,
    ``max_iter``: of weight matching (None: :class:`~modeconn.match.WeightMatchingConfig`'s defaults; ``device`` is
    where its score products run, the averaging of these in-memory models stays on the CPU). The options are
    resolved once into a :class:`~.merge_plan.MergePlan` and :func:`merge_in_memory` runs it. Raises
    NonFiniteError — and writes nothing to ``out`` — when the merged model has
    invalid BatchNorm statistics or a NaN/Inf logit or loss on the test split."""
    check_output_target(out, inputs=paths, overwrite=overwrite, error=CheckpointError)
    opts = MergeOptions(align=align_method, bn=bn, dataset=dataset, data=data, limit_train=limit_train, seed=seed,
                        overwrite=overwrite, normalize=normalize, rule=rule, device=device, restarts=restarts,
                        max_iter=max_iter)
    if len(paths) < 2:
        raise ConfigError("merge needs at least two checkpoints")
    plan = checked_plan(list(paths), opts, weights, settings or RuleSettings())
    path = f"merging modeconn checkpoints (--align {align_method})"
    return merge_in_memory(with_alignment(plan, opts, path, IN_MEMORY_EXCLUDED), out, log)


def merge_in_memory(plan: MergePlan, out: Path, log: Log = print, progress=None):
    """Run a resolved merge ``plan`` on checkpoints of a kind loaded in memory (see :func:`run_merge`); returns
    (output path, test metrics or {})."""
    paths, opts = plan.models, plan.opts
    ckpts = open_checkpoints(paths)
    name = opts.dataset or ckpts[0].dataset
    if name is None and (opts.bn == "repair" or (plan.align is not None and plan.align.needs_data)):
        raise ConfigError(f"--bn {opts.bn} / --align {opts.align} need a dataset; pass --dataset")
    bundle = ckpts[0].feed(name, opts.data, opts.limit_train, load_dataset) if name else None  # before any weights
    models = load_same_architecture(ckpts)
    if name is None and opts.bn == "reset" and batchnorm_modules(models[0]):  # never a silent interpolation instead
        raise ConfigError("--bn reset re-estimates the merged model's BatchNorm statistics on data, and "
                          f"{ckpts[0].describe()} records no dataset: pass --dataset, or --bn interpolate / keep")
    x0 = bundle.train.tensors[0][:2] if bundle is not None else ckpts[0].example_input()
    spec = symmetry_spec(models[0], x0)
    sds = aligned_state_dicts(plan, spec, models, bundle, log, progress)
    bn_loader = make_loader(bundle.train, 512, shuffle=True, seed=opts.seed) if bundle is not None else None
    log(f"averaging {len(sds)} models (bn={opts.bn})")
    with_model = bundle is not None or opts.bn in ("interpolate", "keep")  # these need no data
    merged = merge(sds, plan.weights, model=models[0] if with_model else None, bn=opts.bn, bn_loader=bn_loader,
                   bn_batches=20, spec=spec, normalize=False, rule=plan.rule, settings=plan.settings)
    result = copy.deepcopy(models[0])
    result.load_state_dict(merged)
    check_bn_statistics(result, "merged model")
    metrics = ({"test": evaluate_model(result, make_loader(bundle.test, 512), where="merged model, split 'test'")}
               if bundle is not None else {})
    path = ckpts[0].save(out, result, config=merge_record(plan, name), metrics=metrics or None, overwrite=opts.overwrite,
                         inputs=paths, command="merge")
    return path, metrics


def aligned_state_dicts(plan: MergePlan, spec, models, bundle, log: Log, progress=None) -> list[dict]:
    """Every model's state dict, the second on aligned to the first by the plan's method (its registry entry and
    config object; as stored for ``--align none``); a method that reads data reports to ``progress``."""
    sds = [m.state_dict() for m in models]
    entry = plan.align
    if entry is None:
        return sds
    loader = make_loader(bundle.train, 512) if entry.needs_data else None
    aligned = [sds[0]]
    for p, sd in zip(plan.models[1:], sds[1:], strict=True):
        log(f"aligning {p} to {plan.models[0]} ({entry.display})")
        runtime = {"progress": progress} if entry.needs_data else {}
        res = entry.align(spec, sds[0], sd, model=models[0], loader=loader, config=plan.align_config, **runtime)
        aligned.append(res.apply(sd))
    return aligned


def merge_record(plan: MergePlan, dataset: str | None) -> dict:
    """What the merged checkpoint's config records: inputs, rule, weights applied, alignment and its settings."""
    from ..io.hf import model_names

    opts, settings = plan.opts, plan.settings
    extra = {"merged_from": model_names(plan.models), "rule": plan.rule.name, "align": opts.align, "bn": opts.bn,
             "weights": applied_weights(plan.rule, plan.weights, settings.base), "base": settings.base,
             "params": dict(settings.params)}
    if plan.rule.random:
        extra["seed"] = settings.seed
    if plan.align_config is not None:  # what a re-run of the alignment needs
        extra["align_settings"] = plan.align_config.model_dump(mode="json", exclude_unset=True)
    if dataset:
        extra["dataset"] = dataset
    return extra
