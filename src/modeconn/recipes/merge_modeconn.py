"""`modeconn merge`: align checkpoints to the first, average, fix BatchNorm (reset or REPAIR), save."""

from __future__ import annotations

import copy
from pathlib import Path
from collections.abc import Callable, Sequence

from ..data import load_dataset, make_loader, user_data_path
from ..errors import CheckpointError, ConfigError
from ..io import read_config, save_checkpoint
from ..match import activation_matching, weight_matching
from ..match.methods import command_line_methods
from ..path import evaluate_model, merge
from ..path.batchnorm import check_bn_policy, check_bn_statistics
from ..path.merge_rules import check_rule_settings
from ..path.interpolate import merge_weights
from ..symmetry import symmetry_spec
from .._util.outdir import check_output_target
from .align import dataset_for
from ..io.models import example_input, load_same_architecture

ALIGN_CHOICES = (*command_line_methods(learns=False), "none")


def run_merge(paths: Sequence[Path], out: Path, *, weights: Sequence[float] | None = None, align_method: str = "weight",
              bn: str = "reset", dataset: str | None = None, data: Path | None = None, limit_train: int | None = None,
              seed: int = 0, overwrite: bool = False, normalize: bool = True, rule: str = "linear",
              settings=None, log: Callable[[str], None] = print, device: str | None = None,
              restarts: int | None = None, max_iter: int | None = None):
    """Merge checkpoint directories; returns (output path, test metrics or {}).

    ``weights``/``normalize``/``rule``/``settings`` as in :func:`modeconn.merge` (validated before any checkpoint is
    read; the config records the weights used, rule and inputs); ``device``, ``restarts``, ``max_iter``: of weight
    matching (None: :class:`~modeconn.match.WeightMatchingConfig`'s defaults; ``device`` is where its score products
    run, the averaging of these in-memory models stays on the CPU). Raises
    NonFiniteError — and writes nothing to ``out`` — when the merged model has
    invalid BatchNorm statistics or a NaN/Inf logit or loss on the test split."""
    check_output_target(out, inputs=paths, overwrite=overwrite, error=CheckpointError)
    if align_method not in ALIGN_CHOICES:
        raise ConfigError(f"unknown --align {align_method!r}; valid: {', '.join(ALIGN_CHOICES)}")
    check_bn_policy(bn)
    if len(paths) < 2:
        raise ConfigError("merge needs at least two checkpoints")
    weights = merge_weights(weights, len(paths), normalize=normalize, option="--weights")
    check_rule_settings(rule, settings, len(paths))  # a typo names the rules before any checkpoint is read
    configs = [read_config(p) for p in paths]
    name = dataset or configs[0].get("dataset")
    if name is None and (bn == "repair" or align_method == "activation"):
        raise ConfigError(f"--bn {bn} / --align {align_method} need a dataset; pass --dataset")
    if user_data_path(name) is not None:  # the user's image folder (named or recorded), checked before any weights
        bundle = dataset_for(configs[0], dataset, data, limit_train)
    else:
        bundle = load_dataset(name, data, limit_train=limit_train) if name else None
    models, configs = load_same_architecture(paths)
    x0 = bundle.train.tensors[0][:2] if bundle is not None else example_input(configs[0])
    spec = symmetry_spec(models[0], x0)
    sds = [models[0].state_dict()]
    wm_options = {k: v for k, v in (("restarts", restarts), ("max_iter", max_iter)) if v is not None}
    for p, m in zip(paths[1:], models[1:], strict=False):
        if align_method == "none":
            sds.append(m.state_dict())
            continue
        log(f"aligning {p} to {paths[0]} ({align_method} matching)")
        if align_method == "weight":
            res = weight_matching(spec, sds[0], m.state_dict(), seed=seed, device=device, **wm_options)
        else:
            res = activation_matching(spec, models[0], m, make_loader(bundle.train, 512))
        sds.append(res.apply(m.state_dict()))
    bn_loader = make_loader(bundle.train, 512, shuffle=True, seed=seed) if bundle is not None else None
    log(f"averaging {len(sds)} models (bn={bn})")
    with_model = bundle is not None or bn in ("interpolate", "keep")  # these need no data
    merged = merge(sds, weights, model=models[0] if with_model else None, bn=bn, bn_loader=bn_loader,
                   bn_batches=20, spec=spec, normalize=False, rule=rule, settings=settings)  # weights already validated/normalised above
    result = copy.deepcopy(models[0])
    result.load_state_dict(merged)
    check_bn_statistics(result, "merged model")
    metrics = ({"test": evaluate_model(result, make_loader(bundle.test, 512), where="merged model, split 'test'")}
               if bundle is not None else {})
    from ..path.merge_rules import MERGE_RULES, applied_weights
    from ..io.hf import model_names

    merge_rule = MERGE_RULES.get(rule)
    extra = {"merged_from": model_names(paths), "rule": rule, "align": align_method, "bn": bn,
             "weights": applied_weights(merge_rule, weights, settings.base if settings is not None else None)}
    if settings is not None:
        extra.update(base=settings.base, params=dict(settings.params))
        if merge_rule.random:
            extra["seed"] = settings.seed
    if align_method == "weight":  # what a re-run of the alignment needs
        extra["align_settings"] = {"seed": seed, **wm_options, **({"device": str(device)} if device else {})}
    if name:
        extra["dataset"] = name
    path = save_checkpoint(out, result, config=extra, metrics=metrics or None, overwrite=overwrite,
                           inputs=paths, command="merge")
    return path, metrics
