"""Recipe ``merge``: align every model to the first, merge by a rule, write it — for every checkpoint kind.

* kinds loaded in memory (modeconn, timm, torchvision …): BatchNorm statistics reset / interpolated / REPAIRed,
  evaluated on the test split, written as the first model's kind (:func:`modeconn.recipes.merge_modeconn.merge_in_memory`).
* Hugging Face directories (or cache entries): streamed shard by shard in the first model's layout, no data read
  (:func:`modeconn.recipes.hf_stream.merge_hf_plan`), with the recipe it ran and a model card beside the weights.

Options come from the command line or from a recipe (``--config``, mergekit's schema plus ``align:``,
:mod:`modeconn.recipes.merge_recipe`) and are resolved once into a :class:`~.merge_plan.MergePlan` (plus the alignment
method's config object once the checkpoints' kind is known); every check runs before any checkpoint is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from .._util.outdir import check_output_target
from ..checkpoints import CHECKPOINT_KINDS, Checkpoint, open_checkpoints, refuse_kind, register_in_memory
from ..errors import ConfigError
from ..path.interpolate import weights_sum_to_one
from ..path.merge_layers import refuse_gradients
from .align import check_single_process
from .merge_plan import MergeOptions, MergePlan, plan_merge, with_alignment
from .outcome import Outcome
from .scope import IN_MEMORY_EXCLUDED, check_scope

Log = Callable[[str], None]
__all__ = ["MergeOptions", "MergePlan", "merge", "MERGE_SCOPES", "check_merge_scope"]


def merge(models: Sequence[Path], out: Path, opts: MergeOptions = MergeOptions(), *, progress=None,
          log: Log = print, note: Log = print) -> Outcome:
    """Merge checkpoint directories ``models`` (the first is the reference) into ``out``; with ``opts.config`` the
    models and options come from a recipe (then ``models`` must be empty).

    ``note`` is told when the weights were normalised. Raises ConfigError / CheckpointError for a bad option, weight,
    rule parameter, recipe key, output target or checkpoint, before any work; NonFiniteError (nothing written) for a
    merged model that computes NaN/Inf."""
    given = opts  # as given on the command line: what check_merge_scope refuses where it does not apply
    plan = plan_merge(models, opts)  # every option looked up and checked once, before any checkpoint is read
    opts = plan.opts
    check_output_target(out, inputs=[p for p in (*plan.models, opts.data) if p is not None], overwrite=opts.overwrite)
    if plan.rule.weights == "all" and opts.normalize and opts.weights is not None \
            and not weights_sum_to_one([float(w) for w in opts.weights]):
        note(f"--weights {','.join(map(str, opts.weights))} normalised to sum 1: "
             f"{','.join(f'{w:g}' for w in plan.weights)} (--no-normalize uses them as given)")
    remaps = plan.tokenizer is not None and plan.tokenizer.source is not None  # one vocabulary built of theirs
    ckpts = open_checkpoints(plan.models, same_vocabulary=not remaps)
    handler = ckpts[0].kind.operation("merge")
    if handler is None:
        raise refuse_kind("merge", "merge", ckpts[0])
    path, excluded = check_merge_scope(given, plan, ckpts[0])
    if opts.eval_tasks:
        from .evaluate import check_harness_target

        check_harness_target(ckpts[0], opts.eval_tasks, opts.include_path)
    outcome = handler(ckpts, Path(out), with_alignment(plan, given, path, excluded), progress, log)
    if opts.eval_tasks:
        from .evaluate import score_merge

        outcome = score_merge(outcome, opts.eval_tasks, opts.include_path, plan.settings.seed, log)
    return outcome


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
    "eval_tasks": "merges of Hugging Face causal LMs (lm-eval tasks scored on the written merge)",
    "include_path": "--eval (lm-eval tasks)",
}
"""Every ``merge`` option that some path does not use → where it applies (the others apply everywhere). ``--seed``
applies everywhere: it seeds every random choice of the run (alignment, randomised rules, BatchNorm batches), and a
path that makes none is deterministic, so any seed gives its one result."""


def check_merge_scope(given: MergeOptions, plan: MergePlan, first: Checkpoint) -> tuple[str, dict[str, str]]:
    """ConfigError naming the first option given on the command line (``given``) that the merge ``plan`` of
    checkpoints of ``first``'s kind does not use (the kind's ``merge_scope`` operation adds its own), and where it
    applies — before any weights are read. Returns the path taken (for messages) and the alignment method's config
    fields that path does not use (field → why)."""
    opts = plan.opts
    fields = plan.align.config.model_fields if plan.align is not None else {}
    used = {n for n in ("restarts", "max_iter") if n in fields}
    if plan.rule.weights == "all" and opts.weights is not None:
        used.add("normalize")
    if opts.eval_tasks:
        used.add("include_path")
    scope = first.kind.operation("merge_scope")
    extra, path, excluded = (scope(plan, first) if scope is not None
                             else (set(), f"merging {first.kind.label} checkpoints (--align {opts.align}, "
                                          f"--rule {opts.rule})", {}))
    check_scope(given, used | extra, path, MERGE_SCOPES)
    return path, excluded


def _hf_scope(plan: MergePlan, first: Checkpoint) -> tuple[set[str], str, dict[str, str]]:
    opts = plan.opts
    if plan.align is not None and plan.align.needs_data:  # in memory, on data (recipes.hf_memory, recipes.merge_lm)
        return ({"dataset", "data", "limit_train", "eval_tasks"}, f"merging Hugging Face models in memory (--align {opts.align}, "
                f"--rule {opts.rule}) on their data", IN_MEMORY_EXCLUDED)
    return ({"dtype", "device", "eval_tasks"}, f"merging Hugging Face checkpoints (--align {opts.align}, --rule {opts.rule}), done "
            "without data", {})


def _in_memory_scope(plan: MergePlan, first: Checkpoint) -> tuple[set[str], str, dict[str, str]]:
    opts = plan.opts
    aligns_on_device = plan.align is not None and "device" in plan.align.config.model_fields
    used = {"bn", "dataset", "data", "limit_train"} | ({"device"} if aligns_on_device else set())
    return used, f"merging {first.kind.label} checkpoints (--align {opts.align}, --rule {opts.rule})", IN_MEMORY_EXCLUDED


def _merge_in_memory(ckpts: list[Checkpoint], out: Path, plan: MergePlan, progress, log: Log) -> Outcome:
    from .merge_modeconn import merge_in_memory

    if plan.align is not None and plan.align.needs_continuous:
        from .merge_lm import merge_lm

        return merge_lm(ckpts, out, plan, progress, log)

    if plan.dtype is not None or plan.out_dtype is not None:
        raise ConfigError(f"--dtype / dtype apply to Hugging Face checkpoints; {ckpts[0].kind.label} checkpoints keep "
                          "their dtype")
    _no_tokenizer_keys(plan, f"{ckpts[0].kind.label} checkpoints, which have no tokenizer")
    refuse_gradients(plan.settings.params, plan.settings.model_params, f"merging {ckpts[0].kind.label} checkpoints")
    _refuse_slices(plan, f"merging {ckpts[0].kind.label} checkpoints")
    path, metrics = merge_in_memory(plan, out, log, progress)
    lines = (f"merged model: test acc {100 * metrics['test']['acc']:.2f}%, test loss {metrics['test']['loss']:.4f}",
             ) if metrics else ()
    return Outcome(path, "config.json, model.safetensors, metrics.json", lines, "merged checkpoint")


def _refuse_slices(plan: MergePlan, path: str) -> None:
    if plan.slices:
        raise ConfigError(f"slices: stacking layer ranges applies to Hugging Face checkpoints merged without data "
                          f"(--align weight or none); {path} does not")


def _merge_hf(ckpts: list[Checkpoint], out: Path, plan: MergePlan, progress, log: Log) -> Outcome:
    from .hf_stream import merge_hf_plan
    from .merge_recipe import CARD_NAME, RECIPE_NAME, card_text, recipe_refs, recipe_text

    if plan.align is not None and plan.align.needs_data:
        from .hf_memory import check_no_dtype, check_text_given, merge_in_memory
        from .merge_lm import merge_lm

        check_text_given(plan.opts.dataset, "--align", plan.opts.align, "--align 'weight' or 'none' merge")
        check_no_dtype(plan)
        _no_tokenizer_keys(plan, f"merges aligned in memory (--align {plan.opts.align}); they apply to streaming "
                           "merges (align: weight or none)")
        refuse_gradients(plan.settings.params, plan.settings.model_params, f"--align {plan.opts.align} (in memory)")
        _refuse_slices(plan, f"--align {plan.opts.align} (in memory)")
        if plan.align.needs_continuous:
            return merge_lm(ckpts, out, plan, progress, log)
        return merge_in_memory(ckpts, out, plan, log, progress)
    check_single_process()

    def files(rec: dict) -> dict:
        recipe = recipe_text(rec, plan.groups, recipe_refs(plan.models, out))
        return {RECIPE_NAME: recipe.encode(), CARD_NAME: card_text(Path(out).name, rec, recipe).encode()}

    run = merge_hf_plan
    if plan.slices:
        from .hf_slices import merge_slices_plan as run
    rec = run(plan, out, files=files, progress=progress)
    lines = tuple(f"{r['model']}: streaming weight matching objective {r['objective']:.4f}" for r in rec["alignments"])
    if len(rec["input_dtypes"]) > 1 and plan.out_dtype is None:
        lines += (f"inputs in {', '.join(rec['input_dtypes'])}: written in the first model's dtype (--dtype chooses)",)
    return Outcome(Path(out), f"config.json, safetensors shards and index as the first model, merge.json, {RECIPE_NAME}, "
                   f"{CARD_NAME}", lines, "merged checkpoint")


def _no_tokenizer_keys(plan: MergePlan, why: str) -> None:
    tok = plan.tokenizer
    if tok is not None:
        key = "tokenizer" if tok.section else "tokenizer_source" if tok.source is not None else "chat_template"
        raise ConfigError(f"{plan.opts.config}: {key}: the tokenizer keys do not apply to {why}")


CHECKPOINT_KINDS["modeconn"].supports("merge", _merge_in_memory)
CHECKPOINT_KINDS["modeconn"].supports("merge_scope", _in_memory_scope)
CHECKPOINT_KINDS["huggingface"].supports("merge", _merge_hf)
CHECKPOINT_KINDS["huggingface"].supports("merge_scope", _hf_scope)
register_in_memory("merge", _merge_in_memory)
register_in_memory("merge_scope", _in_memory_scope)
