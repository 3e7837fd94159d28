"""The plan of ``modeconn merge``, resolved once: the options (command line or recipe) turned into typed objects — the
rule's registry entry and settings, the weights as floats, the alignment method's registry entry and config object,
the ``torch.device`` and ``torch.dtype``\\ s — checked before any checkpoint is read, then passed down to the kinds'
back-ends (:mod:`modeconn.recipes.merge`), which never look an option up again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .._util.device import resolve_device
from ..errors import ConfigError
from ..match.methods import ALIGNMENT_METHODS, AlignmentMethod, command_line_methods
from ..path.batchnorm import check_bn_policy
from ..path.merge_layers import OutputSlice
from ..path.merge_rules import MERGE_RULES, MergeRule, RuleSettings, check_rule_settings, rule_weights
from .scope import method_config, method_options


@dataclass(frozen=True)
class MergeOptions:
    """The options of ``modeconn merge`` (see its ``--help``); ``weights`` as given (strings or numbers); ``base``: one
    of the models (as given); ``params``: ``name=value`` strings (``--param``); ``dtype``: output dtype name;
    ``config``: a recipe file (:mod:`modeconn.recipes.merge_recipe`); ``seed``, ``restarts``, ``max_iter``: ``None``
    where not given (a recipe's value, else the default: seed 0); ``options``: the alignment method's further
    settings (``-o key=value``, fields of its config class); ``eval_tasks``: lm-evaluation-harness tasks the written
    merge is scored on (``include_path``: a directory of local task YAML files)."""

    weights: Sequence[str | float] | None = None
    normalize: bool = True
    rule: str = "linear"
    align: str = "weight"
    bn: str = "reset"
    dataset: str | None = None
    data: Path | None = None
    limit_train: int | None = None
    seed: int | None = None
    restarts: int | None = None
    max_iter: int | None = None
    overwrite: bool = False
    base: str | None = None
    params: Sequence[str] = ()
    dtype: str | None = None
    config: Path | None = None
    device: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    eval_tasks: Sequence[str] = ()
    include_path: Path | None = None


@dataclass(frozen=True)
class MergePlan:
    """Everything a merge needs, resolved and checked once: the inputs, the options as resolved (``opts``: a recipe's
    values filled in), the ``rule``'s registry entry and ``settings``, the ``weights`` as the rule uses them (floats,
    normalised where the rule averages and ``normalize`` holds), the alignment method's entry (``align``; None for
    ``--align none``) and config object (``align_config``, set by :func:`with_alignment` once the checkpoints' kind
    is known), the ``device``, the ``dtype`` inputs are cast to, the ``out_dtype`` written, the alignment ``groups``;
    ``tokenizer``: a recipe's tokenizer keys (:class:`~.merge_tokenizer.TokenizerRecipe`; None: the base's tokenizer
    files copied)."""

    models: list[Path]
    opts: MergeOptions
    rule: MergeRule
    weights: list[float]
    settings: RuleSettings
    align: AlignmentMethod | None
    device: torch.device | None
    dtype: torch.dtype | None = None
    out_dtype: torch.dtype | None = None
    groups: Any = "permutation"
    align_config: Any = None
    tokenizer: Any = None
    slices: tuple[OutputSlice, ...] = ()


def align_choices() -> tuple[str, ...]:
    """``--align`` values, read from the registry when asked: the methods that do not train on the models, those that
    learn continuous transforms of language models (dual, one-sided: :mod:`~.merge_lm`), and ``none``."""
    return (*command_line_methods(learns=False), *command_line_methods(continuous=True), "none")


def plan_merge(models: Sequence[Path], opts: MergeOptions) -> MergePlan:
    """The plan of a command line, or of a recipe (``opts.config``); ConfigError naming the option at fault."""
    return _from_recipe(models, opts) if opts.config is not None else _from_options(models, opts)


def _from_options(models: Sequence[Path], opts: MergeOptions) -> MergePlan:
    """The plan of a command line: Hugging Face cache entries resolved, --base found among the models, --param
    parsed, weights and rule settings checked."""
    from ..io.hf import resolve_checkpoint_path

    models = [resolve_checkpoint_path(m) for m in models]
    if len(models) < 2:
        raise ConfigError(f"merge needs at least two checkpoints, got {len(models)}")
    base = _base_index(opts.base, models)
    params = dict(_param(p) for p in opts.params)
    opts = replace(opts, seed=0 if opts.seed is None else opts.seed)
    return checked_plan(models, opts, opts.weights, RuleSettings(base=base, params=params, seed=opts.seed),
                        out_dtype=opts.dtype)


def _from_recipe(models: Sequence[Path], opts: MergeOptions) -> MergePlan:
    """The plan of a recipe (``--config``): models, rule, base, weights, parameters, dtypes and alignment from the
    file; the rule's own options on the command line are refused (one source of truth)."""
    from ..io.hf import resolve_checkpoint_path
    from .merge_recipe import load_recipe

    if models:
        raise ConfigError("--config: the recipe lists the models; give no model directories on the command line")
    overridden = [o for o, v in (("--rule", opts.rule != "linear"), ("--weights", opts.weights), ("--base", opts.base),
                                 ("--param", opts.params)) if v]
    if overridden:
        raise ConfigError(f"--config: {overridden[0]} comes from the recipe; give it there, not on the command line")
    r = load_recipe(opts.config)
    weights = None if all(w is None for w in r.weights) else [1.0 if w is None else w for w in r.weights]
    normalize = r.params.pop("normalize", opts.normalize) if r.rule == "linear" else opts.normalize
    if not isinstance(normalize, bool):
        raise ConfigError(f"{opts.config}: parameters.normalize must be true or false, got {normalize!r}")
    seed = _one_value("seed", r.seed, opts.seed, opts.config)
    align_seed = _one_value("seed", r.align_seed, opts.seed, opts.config, "align.")
    seed = 0 if seed is None else seed
    fixed = [k for k, v in (("seed", r.seed if r.align_seed is None else r.align_seed), ("restarts", r.restarts),
                            ("max_iter", r.max_iter)) if v is not None and k in opts.options]
    if fixed:
        raise ConfigError(f"-o {fixed[0]}: the recipe {opts.config} gives it; give it in one place")
    opts = replace(opts, rule=r.rule, align=r.align, normalize=normalize, weights=weights,
                   dtype=r.out_dtype or opts.dtype or r.dtype, seed=seed if align_seed is None else align_seed,
                   restarts=_one_value("restarts", r.restarts, opts.restarts, opts.config, "align."),
                   max_iter=_one_value("max_iter", r.max_iter, opts.max_iter, opts.config, "align."))
    settings = RuleSettings(base=r.base, params=r.params, seed=seed, normalize=normalize,
                            model_params=r.model_params if any(r.model_params) else ())
    plan = checked_plan([resolve_checkpoint_path(m) for m in r.models], opts, weights, settings, dtype=r.dtype,
                        out_dtype=opts.dtype, groups=r.groups, slices=tuple(r.slices))
    return replace(plan, tokenizer=r.tokenizer)


def _one_value(key: str, recipe: int | None, option: int | None, file: Path, prefix: str = "") -> int | None:
    """The recipe's ``key``, else the command line's option (None when neither gives one); ConfigError when both
    give different values (one source of truth)."""
    if recipe is not None and option is not None and recipe != option:
        flag = "--" + key.replace("_", "-")
        raise ConfigError(f"{flag} {option}: the recipe {file} gives {prefix}{key} {recipe}; give it in one place")
    return recipe if recipe is not None else option


def checked_plan(models: Sequence[Path], opts: MergeOptions, weights: Sequence[str | float] | None,
                 settings: RuleSettings, *, dtype: str | None = None, out_dtype: str | None = None,
                 groups: Any = "permutation", slices: tuple[OutputSlice, ...] = ()) -> MergePlan:
    """The plan with every option looked up and checked once: the rule and its settings (per output slice where
    ``slices`` are given), the weights (as ``--weights``), the --align method (a typo names the choices), the
    BatchNorm policy, the device and the dtypes."""
    rule = MERGE_RULES.get(opts.rule)
    used = rule_weights(rule, weights, len(models), normalize=opts.normalize, option="--weights")
    if slices:
        from .hf_slices import check_slices

        check_slices(rule, settings, slices)
    else:
        check_rule_settings(rule, settings, len(models), weights_given=weights is not None)
    check_bn_policy(opts.bn)
    return MergePlan(list(models), opts, rule, used, settings, align=_align_method(opts.align),
                     device=resolve_device(opts.device, "--device"), dtype=torch_dtype(dtype, "dtype"),
                     out_dtype=torch_dtype(out_dtype), groups=groups, slices=slices)


def _align_method(name: str) -> AlignmentMethod | None:
    choices = align_choices()
    if name not in choices:
        raise ConfigError(f"unknown --align {name!r}; valid: {', '.join(choices)}")
    return None if name == "none" else ALIGNMENT_METHODS.get(name)


_ALIGN_FLAGS = ("seed", "restarts", "max_iter", "device")
"""The merge options that are also fields of an alignment method's config (shorthands for them)."""


def with_alignment(plan: MergePlan, given: MergeOptions, path: str,
                   excluded: Mapping[str, str] | None = None) -> MergePlan:
    """``plan`` with the alignment method's config object, built once (:func:`~.scope.method_config`): the resolved
    seed, restarts, max_iter and device where the method has those fields, the flags ``given`` on the command line,
    and the ``-o`` options; ``excluded``: fields ``path`` (the kind's merge) does not use. ConfigError for ``-o`` with
    ``--align none``."""
    entry, opts = plan.align, plan.opts
    if entry is None:
        if opts.options:
            raise ConfigError(f"-o {next(iter(opts.options))}: -o sets an option of the alignment method; "
                              "--align none runs none")
        return plan
    fields = entry.config.model_fields
    defaults = {k: getattr(opts, k) for k in _ALIGN_FLAGS if k in fields and getattr(opts, k) is not None}
    config = method_config(entry, method_options(entry.config, given, _ALIGN_FLAGS), opts.options, path,
                           defaults=defaults, excluded=excluded)
    return replace(plan, align_config=config)


def _base_index(base: str | None, models: list[Path]) -> int | None:
    if base is None:
        return None
    from ..io.hf import resolve_checkpoint_path

    target = resolve_checkpoint_path(Path(base)).resolve()
    for i, m in enumerate(models):
        if m.resolve() == target:
            return i
    raise ConfigError(f"--base {base}: not one of the models being merged ({', '.join(map(str, models))})")


def _param(text: str) -> tuple[str, Any]:
    """``name=value`` of --param, the value read as YAML (numbers, true/false, strings)."""
    import yaml

    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ConfigError(f"--param {text!r}: expected name=value, e.g. --param density=0.5")
    try:
        return name.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        raise ConfigError(f"--param {text!r}: the value is not a number, boolean or string") from None


_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "bfloat16": "bfloat16",
           "bf16": "bfloat16", "float64": "float64"}


def torch_dtype(name: str | None, option: str = "--dtype") -> torch.dtype | None:
    """The torch dtype named by ``name`` (None stays None); ConfigError naming ``option`` and the valid names."""
    if name is None:
        return None
    if name not in _DTYPES:
        raise ConfigError(f"{option} {name!r}; valid: {', '.join(_DTYPES)}")
    return getattr(torch, _DTYPES[name])
