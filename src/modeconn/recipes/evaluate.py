"""Recipe ``eval``: the scores of one checkpoint — loss and accuracy on a dataset's held-out split (perplexity for
language models) and, for causal language models, lm-evaluation-harness tasks (:mod:`modeconn.diagnostics.harness`).

* modeconn checkpoints: the recorded (or named) dataset's test split; loss in nats (cross-entropy), accuracy a
  fraction; token models per token.
* Hugging Face causal LMs (``…ForCausalLM``): a text dataset or the user's corpus tokenized with the checkpoint's own
  tokenizer in blocks of ``min(128, max_position_embeddings)`` tokens, loss in nats per token, perplexity
  ``exp(loss)``; lm-eval tasks (``--tasks``) on the model as loaded. Image classifiers: the user's image folder with
  the checkpoint's own preprocessing, loss and accuracy.

Everything is checked before any weights are read (output target, tasks known to lm-eval, dataset, kind); the
results are written atomically (``results.json``, ``report.md``). A NaN/Inf loss or score is an error.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torch import nn

from ..checkpoints import CHECKPOINT_KINDS, Checkpoint, open_checkpoint, refuse_kind, register_in_memory
from ..errors import ConfigError
from .outcome import Outcome

Log = Callable[[str], None]


@dataclass(frozen=True)
class EvalOptions:
    """The options of ``modeconn eval`` (see its ``--help``)."""

    dataset: str | None = None
    data: Path | None = None
    limit_train: int | None = None
    eval_limit: int | None = None
    tasks: tuple[str, ...] = ()
    include_path: Path | None = None
    limit: float | None = None
    num_fewshot: int | None = None
    batch_size: int = 8
    seed: int = 0
    overwrite: bool = False


@dataclass
class Evaluand:
    """One checkpoint, loaded for evaluation: ``model`` maps a batch of the bundle's inputs to logits; ``bundle`` its
    data (None when no dataset applies); ``lm`` / ``tokenizer`` the transformers causal LM and its tokenizer, for
    lm-eval (None for other kinds)."""

    model: nn.Module
    bundle: Any = None
    lm: nn.Module | None = None
    tokenizer: Any = None
    info: dict[str, Any] = field(default_factory=dict)


def evaluate(model_dir: Path, out: Path, opts: EvalOptions = EvalOptions(), *, log: Log = print) -> Outcome:
    """Score the checkpoint ``model_dir`` and write ``results.json`` and ``report.md`` to ``out``.

    Raises ConfigError / CheckpointError / DataError before any weights are read (bad option, unknown lm-eval task,
    a kind ``eval`` cannot read, no dataset and no task); NonFiniteError for a NaN/Inf loss or score (nothing is
    written)."""
    from .._util.outdir import check_output_target
    from ..diagnostics.harness import check_tasks

    check_output_target(out, inputs=[p for p in (model_dir, opts.data, opts.include_path) if p is not None],
                        overwrite=opts.overwrite)
    _check_options(opts)
    if opts.tasks:
        check_tasks(opts.tasks, opts.include_path)
    ckpt = open_checkpoint(model_dir)
    load = ckpt.kind.operation("evaluate")
    if load is None:
        raise refuse_kind("evaluate", "eval", ckpt)
    start = time.perf_counter()
    ev = load(ckpt, opts)
    results = _results(ckpt, ev, opts, log)
    _write(out, results, start, inputs=[model_dir], overwrite=opts.overwrite)
    return Outcome(out, "results.json, report.md", tuple(_lines(results)), "evaluation")


def _check_options(opts: EvalOptions) -> None:
    if opts.limit is not None and not (opts.limit > 0 and (opts.limit < 1 or float(opts.limit).is_integer())):
        raise ConfigError(f"--limit must be a whole number of documents or a fraction in (0, 1), got {opts.limit}")
    if not opts.tasks:
        for name in ("include_path", "limit", "num_fewshot"):
            if getattr(opts, name) is not None:
                raise ConfigError(f"--{name.replace('_', '-')} applies to lm-eval tasks: give --tasks, or leave it out")


def _results(ckpt: Checkpoint, ev: Evaluand, opts: EvalOptions, log: Log) -> dict[str, Any]:
    from ..path.evaluate import evaluate_model
    from ..path.methods import eval_loaders

    results: dict[str, Any] = {"model": str(ckpt.path), "kind": ckpt.kind.name, **ev.info}
    if ev.bundle is not None:
        log(f"evaluating on {ev.bundle.name} (test split)")
        test = evaluate_model(ev.model, eval_loaders(ev.bundle, opts.eval_limit)["test"],
                              where=f"{ckpt.path} on {ev.bundle.name} (test split)")
        if ev.lm is not None:
            test["perplexity"] = math.exp(test["loss"])
        results["dataset"] = {"name": ev.bundle.name, "split": "test", "eval_limit": opts.eval_limit}
        results["test"] = test
    if opts.tasks:
        from ..diagnostics.harness import harness_scores

        log(f"lm-eval tasks: {', '.join(opts.tasks)}")
        limit = int(opts.limit) if opts.limit is not None and opts.limit >= 1 else opts.limit
        results["lm_eval"] = harness_scores(ev.lm, ev.tokenizer, opts.tasks, include_path=opts.include_path,
                                            limit=limit, num_fewshot=opts.num_fewshot, batch_size=opts.batch_size,
                                            seed=opts.seed)
    return results


def _lines(results: dict[str, Any]) -> list[str]:
    lines = []
    if "test" in results:
        t = results["test"]
        ppl = f", perplexity {t['perplexity']:.4g}" if "perplexity" in t else ""
        lines.append(f"{results['dataset']['name']} test: loss {t['loss']:.4f} nats, accuracy {t['acc']:.4f}{ppl} "
                     f"({t['n']} {'tokens' if 'perplexity' in t else 'examples'})")
    for task, scores in results.get("lm_eval", {}).get("tasks", {}).items():
        lines.append(f"lm-eval {task}: " + ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))
    return lines


def _report(results: dict[str, Any]) -> str:
    body = "\n".join(f"- {line}" for line in _lines(results))
    return f"# Evaluation of {results['model']}\n\nKind: {results['kind']}.\n\n{body}\n"


def _write(out: Path, results: dict[str, Any], start: float, *, inputs, overwrite: bool) -> None:
    from ..experiments.output import output_directory, write_results

    with output_directory(out, overwrite, inputs=inputs, command="eval") as tmp:
        write_results(tmp, results, _report, start)


# ------------------------------------------------------------------------------------------- per kind


def _eval_in_memory(ckpt: Checkpoint, opts: EvalOptions) -> Evaluand:
    """A model of an in-memory kind (modeconn, timm, torchvision …) and the data the kind feeds it (its recorded
    dataset, or ``--dataset``)."""
    if opts.tasks:
        raise ConfigError(f"--tasks (lm-eval) scores Hugging Face causal LMs; {ckpt.describe()} is not one: leave "
                          "--tasks out (it is scored on its dataset)")
    bundle = ckpt.feed(opts.dataset, opts.data, opts.limit_train)
    return Evaluand(ckpt.load(), bundle, info={"architecture": ckpt.config.get("architecture")})


def _eval_hf(ckpt: Checkpoint, opts: EvalOptions) -> Evaluand:
    """A Hugging Face causal LM (text; lm-eval tasks) or image classifier (an image folder), its data read and checked
    before any weights (:func:`~.hf_memory.load_models`)."""
    from .hf_memory import load_models

    if opts.dataset is None and not opts.tasks:
        raise ConfigError(f"{ckpt.describe()} records no dataset: pass --dataset (a text dataset, your corpus or your "
                          "image folder) and/or --tasks (lm-eval tasks)")
    if opts.tasks:
        _check_causal_lm(ckpt)
    harness_tokenizer = _hf_tokenizer(ckpt) if opts.tasks else None
    info = {"architecture": (ckpt.config.get("architectures") or [None])[0]}
    if opts.dataset is None:
        lm = ckpt.load().float()
        return Evaluand(lm, lm=lm, tokenizer=harness_tokenizer, info=info)
    (model,), bundle = load_models([ckpt], "eval", opts.dataset, opts.data, opts.limit_train)
    lm = getattr(model, "lm", None)  # causal LMs: the transformers model inside the wrapper
    if lm is not None:
        info["context_length"] = bundle.input_shape[0]
    return Evaluand(model, bundle, lm=lm, tokenizer=harness_tokenizer, info=info)


def check_harness_target(ckpt: Checkpoint, tasks, include_path: Path | None) -> None:
    """ConfigError, before any work, unless ``ckpt`` is a Hugging Face causal LM and ``tasks`` are known to lm-eval
    (with the local tasks of ``include_path``): what ``--eval`` (of ``merge`` and ``barrier``) needs; absorbed
    checkpoints (a dual-matched endpoint) are causal LMs too."""
    from ..diagnostics.harness import check_tasks

    if ckpt.kind.name not in ("huggingface", "absorbed"):
        raise ConfigError(f"--eval (lm-eval tasks) scores Hugging Face causal LMs; {ckpt.describe()} is not one")
    _check_causal_lm(ckpt)
    try:
        check_tasks(tasks, include_path)
    except ConfigError as err:
        raise ConfigError(f"--eval: {err}") from None


def score_merge(outcome: Outcome, tasks, include_path: Path | None, seed: int, log: Log) -> Outcome:
    """Score the merge written to ``outcome.path`` on lm-eval ``tasks`` (the merged checkpoint as written, loaded
    back: stock or absorbed) and record the scores in its ``merge.json`` (``lm_eval``) and model card, both replaced
    atomically. NonFiniteError for a NaN/Inf score (the merge stays; its records say nothing of the scores)."""
    import json

    from .._util.atomic import atomic_write_text
    from .._util.jsonio import write_json
    from ..diagnostics.harness import harness_scores
    from .merge_recipe import CARD_NAME, RECIPE_NAME, card_text

    out = Path(outcome.out)
    ckpt = open_checkpoint(out)
    log(f"lm-eval tasks on the merge: {', '.join(tasks)}")
    lm = ckpt.load().float()
    scores = harness_scores(lm, _hf_tokenizer(ckpt), tuple(tasks), include_path=include_path, seed=seed)
    record = {**json.loads((out / "merge.json").read_text()), "lm_eval": scores}
    write_json(out / "merge.json", record, nan="null", default=str)
    if (out / CARD_NAME).is_file() and (out / RECIPE_NAME).is_file():
        atomic_write_text(out / CARD_NAME, card_text(out.name, record, (out / RECIPE_NAME).read_text()))
    lines = tuple(f"lm-eval {task}: " + ", ".join(f"{k} {v:.4g}" for k, v in s.items())
                  for task, s in scores["tasks"].items())
    return replace(outcome, lines=(*outcome.lines, *lines))


def _check_causal_lm(ckpt: Checkpoint) -> None:
    arch = (ckpt.config.get("architectures") or ["?"])[0]
    if not str(arch).endswith("ForCausalLM"):
        raise ConfigError(f"--tasks (lm-eval) scores causal LMs (…ForCausalLM); {ckpt.path} is {arch}")


def _hf_tokenizer(ckpt: Checkpoint):
    """The checkpoint's own tokenizer through transformers (any format transformers reads; no remote code)."""
    from transformers import AutoTokenizer

    from ..errors import DataError

    try:
        return AutoTokenizer.from_pretrained(ckpt.path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise DataError(f"{ckpt.path}: no tokenizer transformers can read ({err})") from None


CHECKPOINT_KINDS["modeconn"].supports("evaluate", _eval_in_memory)
CHECKPOINT_KINDS["huggingface"].supports("evaluate", _eval_hf)
CHECKPOINT_KINDS["absorbed"].supports("evaluate", _eval_hf)
register_in_memory("evaluate", _eval_in_memory)
