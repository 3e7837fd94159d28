"""``modeconn merge``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (DATASET_HELP, DATA_HELP, DEVICE_HELP, MAX_ITER_HELP, METHOD_OPTION_HELP, OVERWRITE_HELP,
                   RESTARTS_HELP, app, console, context_length_option, errors_exit, label_field_option, live_help, log,
                   parse_kv, progress_bar, split_option, text_field_option, user_data)
from ._print import show


def _rule_help() -> str:
    from ..path.merge_rules import MERGE_RULES

    return "merge rule: " + "; ".join(f"{r.name} — {r.summary} ({r.source})" + (f" [params: {', '.join(r.params)}]" if r.params else "")
                                      for r in map(MERGE_RULES.get, MERGE_RULES))


def _align_help() -> str:
    """The --align choices registered when help is shown (:func:`~._app.live_help`)."""
    from ..recipes.merge_plan import align_choices

    return ("align every model to the first: " + ", ".join(align_choices()) + " (Hugging Face checkpoints: weight "
            "or none streamed, activation in memory, dual / one-sided for two causal LMs); -o sets the method's "
            "options")


@app.command(cls=live_help(align_method=_align_help, rule=_rule_help))
def merge(
    models: list[Path] = typer.Argument(None, help="two or more checkpoint directories or Hugging Face cache entries "
                                        "(models--ORG--NAME); the first is the reference (omit with --config)"),
    out: Path = typer.Option(..., help="checkpoint directory for the merged model"),
    config: Path | None = typer.Option(None, help="a merge recipe (mergekit's YAML schema, a subset, plus an align: "
                                       "section; see modeconn.recipes.merge_recipe) instead of models and rule options"),
    weights: str | None = typer.Option(None, help="comma-separated weights, one per model (default uniform); "
                                       "non-negative and normalised to sum 1 unless --no-normalize; task-vector rules "
                                       "(ties, dare_*, task_arithmetic …) take them as given, default 1, base ignored"),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help="normalise --weights to sum 1 (default); "
                                   "--no-normalize: any finite weights as given (task-arithmetic sums, extrapolation)"),
    rule: str = typer.Option("linear", help=_rule_help()),
    base: str | None = typer.Option(None, help="the base model of a task-vector rule or SLERP (one of the models)"),
    param: list[str] = typer.Option([], "--param", help="a rule parameter name=value, repeatable (e.g. density=0.5, "
                                    "t=0.3; mergekit's names)"),
    dtype: str | None = typer.Option(None, help="Hugging Face checkpoints: dtype of the output (float32, float16, "
                                     "bfloat16; default: the first model's)"),
    align_method: str = typer.Option("weight", "--align", help=_align_help()),
    option: list[str] = typer.Option([], "--option", "-o", help=METHOD_OPTION_HELP),
    bn: str = typer.Option("reset", help="BatchNorm policy after averaging: reset, interpolate, repair"),
    dataset: str | None = typer.Option(None, help="data for BN reset / REPAIR / activation matching: " + DATASET_HELP),
    split: str | None = split_option(),
    text_field: str = text_field_option(),
    label_field: str = label_field_option(),
    context_length: int | None = context_length_option(),
    data: Path | None = typer.Option(None, help=DATA_HELP),
    limit_train: int | None = typer.Option(None, min=1),
    seed: int | None = typer.Option(None, help="seed of weight matching's restarts and of randomised rules (DARE, "
                                    "DELLA); default 0, or the recipe's (--config)"),
    restarts: int | None = typer.Option(None, min=1, help=RESTARTS_HELP),
    max_iter: int | None = typer.Option(None, min=1, help=MAX_ITER_HELP),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
    device: str | None = typer.Option(None, help=DEVICE_HELP),
    eval_tasks: str | None = typer.Option(None, "--eval", help="Hugging Face causal LMs: score the written merge on "
                                          "these comma-separated lm-evaluation-harness tasks (merge.json, model card; "
                                          "pip install 'modeconn\\[eval]')"),
    include_path: Path | None = typer.Option(None, help="--eval: a directory of local lm-eval task YAML files (a task "
                                             "may run Python it names: point this only at tasks you trust)"),
) -> None:
    """Merge two or more checkpoints into one.

    Aligns every model to the first (unless --align none), merges them with --rule (default: the weighted average
    with --weights), re-estimates BatchNorm statistics (reset) or applies REPAIR, evaluates on the test split and
    writes a checkpoint. A merged model whose BatchNorm statistics are invalid or that computes NaN/Inf is refused;
    nothing is written.

    Hugging Face checkpoint directories (config.json with model_type, safetensors shards or one file): --align
    weight (streaming weight matching) or none (any architecture with matching tensor names and shapes), then the
    merge is written shard by shard in the first model's layout with the base's (else the first's) config and
    tokenizer files, merge.json, the recipe it ran (merge_recipe.yml) and a model card (README.md); no BatchNorm step
    and no evaluation (no data is read). -o key=value sets any option of the --align method's config class (every
    WeightMatchingConfig field on Hugging Face checkpoints). Rules other than linear come from mergekit
    (pip install 'modeconn\\[mergekit]').
    """
    from ..recipes.merge import MergeOptions, merge as run_merge

    opts = MergeOptions(weights=[w.strip() for w in weights.split(",")] if weights else None,
                        normalize=normalize, rule=rule, align=align_method, bn=bn, dataset=dataset, data=data,
                        limit_train=limit_train, seed=seed, restarts=restarts, max_iter=max_iter,
                        overwrite=overwrite, base=base, params=tuple(param), dtype=dtype, config=config,
                        device=device, options=parse_kv(option, "--option"),
                        eval_tasks=tuple(t.strip() for t in (eval_tasks or "").split(",") if t.strip()),
                        include_path=include_path)
    with errors_exit(), user_data(dataset, split, text_field, context_length, seed, label_field), progress_bar() as progress:
        outcome = run_merge(models or [], out, opts, progress=progress, log=log,
                            note=lambda s: console.print(f"note: {s}"))
    show(outcome)
