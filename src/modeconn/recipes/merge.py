"""Recipe ``merge``: align every model to the first, merge by a rule, write it — for every checkpoint kind.

* kinds loaded in memory (modeconn, timm, torchvision …): BatchNorm statistics reset / interpolated / REPAIRed,
  evaluated on the test split, written as the first model's kind (:func:`modeconn.recipes.merge_modeconn.run_merge`).
* Hugging Face directories (or cache entries): streamed shard by shard in the first model's layout, no data read
  (:func:`modeconn.recipes.hf_stream.merge_hf_checkpoints`), with the recipe it ran and a model card beside the weights.

Options come from the command line or from a recipe (``--config``, mergekit's schema plus ``align:``,
:mod:`modeconn.recipes.merge_recipe`); every check runs before any checkpoint is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._util.device import resolve_device
from .._util.outdir import check_output_target
from ..checkpoints import CHECKPOINT_KINDS, Checkpoint, open_checkpoints, refuse_kind, register_in_memory
from ..errors import ConfigError
from ..path.interpolate import weights_sum_to_one
from ..path.merge_rules import MERGE_RULES, RuleSettings
from .align import check_single_process
from .outcome import Outcome
from .scope import check_scope

Log = Callable[[str], None]


@dataclass(frozen=True)
class MergeOptions:
    """The options of ``modeconn merge`` (see its ``--help``); ``weights`` as given (strings or numbers); ``base``: one
    of the models (as given); ``params``: ``name=value`` strings (``--param``); ``dtype``: output dtype name;
    ``config``: a recipe file (:mod:`modeconn.recipes.merge_recipe`); ``seed``, ``restarts``, ``max_iter``: ``None``
    where not given (a recipe's value, else the default: seed 0)."""

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


@dataclass(frozen=True)
class _Plan:
    """Everything a merge needs, checked: inputs, weights as used, rule settings, dtypes, alignment groups."""

    models: list[Path]
    opts: MergeOptions
    weights: list[float] | None
    settings: RuleSettings
    dtype: str | None = None
    out_dtype: str | None = None
    groups: Any = "permutation"


def merge(models: Sequence[Path], out: Path, opts: MergeOptions = MergeOptions(), *, progress=None,
          log: Log = print, note: Log = print) -> Outcome:
    """Merge checkpoint directories ``models`` (the first is the reference) into ``out``; with ``opts.config`` the
    models and options come from a recipe (then ``models`` must be empty).

    ``note`` is told when the weights were normalised. Raises ConfigError / CheckpointError for a bad option, weight,
    rule parameter, recipe key, output target or checkpoint, before any work; NonFiniteError (nothing written) for a
    merged model that computes NaN/Inf."""
    given = opts  # as given on the command line: what check_merge_scope refuses where it does not apply
    plan = _from_recipe(models, opts) if opts.config is not None else _from_options(models, opts)
    opts = plan.opts
    check_output_target(out, inputs=[p for p in (*plan.models, opts.data) if p is not None], overwrite=opts.overwrite)
    if plan.weights is not None and opts.normalize and MERGE_RULES.get(opts.rule).weights == "all" \
            and opts.weights is not None and not weights_sum_to_one([float(w) for w in opts.weights]):
        note(f"--weights {','.join(map(str, opts.weights))} normalised to sum 1: "
             f"{','.join(f'{w:g}' for w in plan.weights)} (--no-normalize uses them as given)")
    _check_options(opts)
    resolve_device(opts.device, "--device")  # an accelerator this machine lacks fails here, before any work
    ckpts = open_checkpoints(plan.models)
    handler = ckpts[0].kind.operation("merge")
    if handler is None:
        raise refuse_kind("merge", "merge", ckpts[0])
    check_merge_scope(given, plan, ckpts[0])
    return handler(ckpts, Path(out), plan, progress, log)


_WM = "weight matching (--align weight)"
_MEMORY = "checkpoints merged in memory (modeconn, timm, torchvision)"
_DATA = f"{_MEMORY}: BatchNorm reset, REPAIR, activation matching and the evaluation read data"
MERGE_SCOPES = {
    "bn": f"{_MEMORY}: BatchNorm statistics after averaging",
    "dataset": _DATA, "data": _DATA, "limit_train": _DATA,
    "dtype": "Hugging Face checkpoints (checkpoints merged in memory keep their dtype)",
    "restarts": _WM, "max_iter": _WM,
    "device": f"{_WM} and the merge arithmetic of Hugging Face checkpoints",
    "normalize": "--weights of a rule that averages all models (linear, slerp …)",
}
"""Every ``merge`` option that some path does not use → where it applies (the others apply everywhere). ``--seed``
applies everywhere: it seeds every random choice of the run (alignment, randomised rules, BatchNorm batches), and a
path that makes none is deterministic, so any seed gives its one result."""


def check_merge_scope(given: MergeOptions, plan: _Plan, first: Checkpoint) -> None:
    """ConfigError naming the first option given on the command line (``given``) that the merge ``plan`` of
    checkpoints of ``first``'s kind does not use (the kind's ``merge_scope`` operation adds its own), and where it
    applies — before any weights are read."""
    opts, rule = plan.opts, MERGE_RULES.get(plan.opts.rule)
    wm = opts.align == "weight"
    used = {"restarts", "max_iter"} if wm else set()
    if rule.weights == "all" and opts.weights is not None:
        used.add("normalize")
    scope = first.kind.operation("merge_scope")
    extra, path = (scope(opts, first) if scope is not None
                   else (set(), f"merging {first.kind.label} checkpoints (--align {opts.align}, --rule {opts.rule})"))
    check_scope(given, used | extra, path, MERGE_SCOPES)


def _hf_scope(opts: MergeOptions, first: Checkpoint) -> tuple[set[str], str]:
    return {"dtype", "device"}, f"merging Hugging Face checkpoints (--align {opts.align}, --rule {opts.rule}), done without data"


def _in_memory_scope(opts: MergeOptions, first: Checkpoint) -> tuple[set[str], str]:
    used = {"bn", "dataset", "data", "limit_train"} | ({"device"} if opts.align == "weight" else set())
    return used, f"merging {first.kind.label} checkpoints (--align {opts.align}, --rule {opts.rule})"


def _from_options(models: Sequence[Path], opts: MergeOptions) -> _Plan:
    """The plan of a command line: Hugging Face cache entries resolved, --base found among the models, --param
    parsed, weights and rule settings checked."""
    from ..io.hf import resolve_checkpoint_path

    models = [resolve_checkpoint_path(m) for m in models]
    if len(models) < 2:
        raise ConfigError(f"merge needs at least two checkpoints, got {len(models)}")
    base = _base_index(opts.base, models)
    params = dict(_param(p) for p in opts.params)
    opts = replace(opts, seed=0 if opts.seed is None else opts.seed)
    return _checked(models, opts, opts.weights, RuleSettings(base=base, params=params, seed=opts.seed), None,
                    opts.dtype, "permutation")


def _from_recipe(models: Sequence[Path], opts: MergeOptions) -> _Plan:
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
    opts = replace(opts, rule=r.rule, align=r.align, normalize=normalize, weights=weights,
                   dtype=r.out_dtype or opts.dtype, seed=seed if align_seed is None else align_seed,
                   restarts=_one_value("restarts", r.restarts, opts.restarts, opts.config, "align."),
                   max_iter=_one_value("max_iter", r.max_iter, opts.max_iter, opts.config, "align."))
    settings = RuleSettings(base=r.base, params=r.params, seed=seed,
                            model_params=r.model_params if any(r.model_params) else ())
    return _checked([resolve_checkpoint_path(m) for m in r.models], opts, weights, settings, r.dtype,
                    opts.dtype, r.groups)


def _one_value(key: str, recipe: int | None, option: int | None, file: Path, prefix: str = "") -> int | None:
    """The recipe's ``key``, else the command line's option (None when neither gives one); ConfigError when both
    give different values (one source of truth)."""
    if recipe is not None and option is not None and recipe != option:
        flag = "--" + key.replace("_", "-")
        raise ConfigError(f"{flag} {option}: the recipe {file} gives {prefix}{key} {recipe}; give it in one place")
    return recipe if recipe is not None else option


def _checked(models, opts: MergeOptions, weights, settings: RuleSettings, dtype, out_dtype, groups) -> _Plan:
    from ..path.merge_rules import check_rule_settings, rule_weights

    rule = MERGE_RULES.get(opts.rule)
    used = rule_weights(rule, weights, len(models), normalize=opts.normalize, option="--weights")
    check_rule_settings(rule, settings, len(models), weights_given=weights is not None)
    for name, value in (("--dtype", out_dtype), ("dtype", dtype)):
        _torch_dtype(value, name)
    return _Plan(list(models), opts, used if weights is not None or rule.weights == "non_base" else None, settings,
                 dtype, out_dtype, groups)


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


def _torch_dtype(name: str | None, option: str = "--dtype"):
    """The torch dtype named by ``name`` (None stays None); ConfigError naming ``option`` and the valid names."""
    import torch

    if name is None:
        return None
    if name not in _DTYPES:
        raise ConfigError(f"{option} {name!r}; valid: {', '.join(_DTYPES)}")
    return getattr(torch, _DTYPES[name])


def _check_options(opts: MergeOptions) -> None:
    """Typos in --align, --bn or --rule fail before any checkpoint is opened."""
    from .merge_modeconn import ALIGN_CHOICES
    from ..path.batchnorm import check_bn_policy

    if opts.align not in ALIGN_CHOICES:
        raise ConfigError(f"unknown --align {opts.align!r}; valid: {', '.join(ALIGN_CHOICES)}")
    check_bn_policy(opts.bn)
    MERGE_RULES.get(opts.rule)


def _merge_in_memory(ckpts: list[Checkpoint], out: Path, plan: _Plan, progress, log: Log) -> Outcome:
    from .merge_modeconn import run_merge

    opts = plan.opts
    if plan.dtype is not None or plan.out_dtype is not None:
        raise ConfigError(f"--dtype / dtype apply to Hugging Face checkpoints; {ckpts[0].kind.label} checkpoints keep "
                          "their dtype")
    path, metrics = run_merge([c.path for c in ckpts], out, weights=plan.weights, align_method=opts.align, bn=opts.bn,
                              dataset=opts.dataset, data=opts.data, limit_train=opts.limit_train, seed=opts.seed,
                              overwrite=opts.overwrite, normalize=False if plan.weights is not None else opts.normalize,
                              rule=opts.rule, settings=plan.settings, log=log, device=opts.device,
                              restarts=opts.restarts, max_iter=opts.max_iter)
    lines = (f"merged model: test acc {100 * metrics['test']['acc']:.2f}%, test loss {metrics['test']['loss']:.4f}",
             ) if metrics else ()
    return Outcome(path, "config.json, model.safetensors, metrics.json", lines, "merged checkpoint")


def _merge_hf(ckpts: list[Checkpoint], out: Path, plan: _Plan, progress, log: Log) -> Outcome:
    from ..match.weight import DEFAULTS
    from .hf_stream import merge_hf_checkpoints
    from .merge_recipe import CARD_NAME, RECIPE_NAME, card_text, recipe_refs, recipe_text

    opts = plan.opts
    check_single_process()

    def files(rec: dict) -> dict:
        recipe = recipe_text(rec, plan.groups, recipe_refs(plan.models, out))
        return {RECIPE_NAME: recipe.encode(), CARD_NAME: card_text(Path(out).name, rec, recipe).encode()}

    rec = merge_hf_checkpoints([c.path for c in ckpts], out, weights=plan.weights, align=opts.align, seed=opts.seed,
                               restarts=opts.restarts or DEFAULTS.restarts, max_iter=opts.max_iter or DEFAULTS.max_iter,
                               overwrite=opts.overwrite, progress=progress, normalize=False, rule=opts.rule, settings=plan.settings,
                               dtype=_torch_dtype(plan.dtype, "dtype"), out_dtype=_torch_dtype(plan.out_dtype),
                               groups=plan.groups, files=files, device=opts.device)
    lines = tuple(f"{r['model']}: streaming weight matching objective {r['objective']:.4f}" for r in rec["alignments"])
    if len(rec["input_dtypes"]) > 1 and plan.out_dtype is None:
        lines += (f"inputs in {', '.join(rec['input_dtypes'])}: written in the first model's dtype (--dtype chooses)",)
    return Outcome(Path(out), f"config.json, safetensors shards and index as the first model, merge.json, {RECIPE_NAME}, "
                   f"{CARD_NAME}", lines, "merged checkpoint")


CHECKPOINT_KINDS["modeconn"].supports("merge", _merge_in_memory)
CHECKPOINT_KINDS["modeconn"].supports("merge_scope", _in_memory_scope)
CHECKPOINT_KINDS["huggingface"].supports("merge", _merge_hf)
CHECKPOINT_KINDS["huggingface"].supports("merge_scope", _hf_scope)
register_in_memory("merge", _merge_in_memory)
register_in_memory("merge_scope", _in_memory_scope)
