"""Scores of a causal language model on lm-evaluation-harness tasks, through lm-eval's Python API on the model as
loaded (no second copy, no re-download): what mergekit-evolve, FusionBench and MergeBench judge a merge by.

Tasks are lm-eval's names (its built-in tasks read their data through ``datasets``, usually from the Hub) or the
names of local YAML tasks in ``include_path`` (e.g. ``dataset_path: json`` with ``data_files`` on a local
``.jsonl``: no network). Every metric is checked finite: a NaN/Inf score is an error, never a result.

Requires ``pip install 'modeconn[eval]'`` (lm-eval).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ConfigError, NonFiniteError

INSTALL = "pip install 'modeconn[eval]'"


def _lm_eval():
    try:
        import lm_eval
    except ImportError:
        raise ConfigError(f"lm-evaluation-harness scores (--tasks) need lm-eval: {INSTALL}") from None
    return lm_eval


def task_manager(include_path: str | os.PathLike | None):
    """lm-eval's ``TaskManager`` over its built-in tasks plus the YAML tasks under ``include_path`` (a directory;
    ConfigError naming it when it is not one)."""
    _lm_eval()
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(f"--include-path {include_path}: not a directory of lm-eval task YAML files")
    return TaskManager(include_path=str(include_path) if include_path is not None else None)


def check_tasks(tasks: Sequence[str], include_path: str | os.PathLike | None = None):
    """Before any model is read: lm-eval is installed, ``tasks`` is not empty and every name is a task or group lm-eval
    knows (built in or under ``include_path``). Returns the task manager. Raises ConfigError naming the unknown
    task(s) and where they were looked for."""
    if not tasks:
        raise ConfigError("--tasks is empty: name at least one lm-eval task")
    manager = task_manager(include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        where = f"lm-eval's tasks and {include_path}" if include_path is not None else "lm-eval's tasks (add local " \
            "YAML tasks with --include-path DIR)"
        raise ConfigError(f"unknown lm-eval task(s) {', '.join(map(repr, unknown))}: not among {where}")
    return manager


def _scores(raw: dict[str, Any], task: str) -> dict[str, float]:
    """lm-eval's ``{"acc,none": 0.5, "acc_stderr,none": 0.1, "alias": …}`` → ``{"acc": 0.5, "acc_stderr": 0.1}``
    (numbers only; a stderr lm-eval did not compute, ``"N/A"``, is left out). NonFiniteError for a NaN/Inf score."""
    out: dict[str, float] = {}
    for key, value in raw.items():
        metric, _, flt = key.partition(",")
        if not flt or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        name = metric if flt == "none" else f"{metric} ({flt})"
        if not math.isfinite(value):
            raise NonFiniteError(f"lm-eval task {task!r}: metric {name!r} is {value}; a non-finite score is not "
                                 "reported")
        out[name] = float(value)
    return out


def harness_scores(model: nn.Module, tokenizer: Any, tasks: Sequence[str], *,
                   include_path: str | os.PathLike | None = None, limit: int | float | None = None,
                   num_fewshot: int | None = None, batch_size: int = 8, seed: int = 0,
                   max_length: int | None = None) -> dict[str, Any]:
    """Scores of ``model`` (a transformers causal LM, in memory; evaluated on its own device and dtype) with
    ``tokenizer`` on lm-eval ``tasks``.

    ``limit``: at most this many documents per task (a fraction in (0, 1) for a share); ``num_fewshot``: few-shot
    examples (default: each task's own); ``seed``: lm-eval's random, numpy, torch and few-shot seeds.

    Returns ``{"tasks": {task: {metric: value}}, "lm_eval_version", "limit", "num_fewshot", "n_samples": {task: n},
    "higher_is_better": {task: {metric: bool}}}`` (the direction lm-eval states for each metric; stderrs have none).
    Raises ConfigError (lm-eval missing, unknown task — before any request runs), NonFiniteError (a NaN/Inf score).
    """
    lm_eval = _lm_eval()
    from lm_eval.models.huggingface import HFLM

    manager = check_tasks(tasks, include_path)
    device = str(next(model.parameters()).device)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, device=device, batch_size=batch_size, max_length=max_length,
              trust_remote_code=False)
    res = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                  num_fewshot=num_fewshot, log_samples=False, bootstrap_iters=0, random_seed=seed,
                                  numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed)
    if res is None:
        raise ConfigError("lm-eval returned no results (a rank other than 0 of a distributed run)")
    scores = {task: _scores(raw, task) for task, raw in res["results"].items()}
    n = {task: int(v.get("effective", v.get("original", 0))) for task, v in res.get("n-samples", {}).items()}
    directions = res.get("higher_is_better", {})
    higher = {task: {m: bool(directions[task][m.split(" (")[0]]) for m in s if m.split(" (")[0] in directions.get(task, {})}
              for task, s in scores.items()}
    return {"tasks": scores, "lm_eval_version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None,
            "limit": limit, "num_fewshot": num_fewshot, "n_samples": n, "higher_is_better": higher}
