"""`modeconn barrier`: naive and aligned barriers between two trained checkpoints."""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch.nn as nn

from ..data import DatasetBundle
from ..config import StrictConfig
from ..diagnostics.compare import Comparison, compare_alignments
from ..errors import ConfigError
from ..experiments.output import output_directory
from ..match.methods import ALIGNMENT_METHODS
from .barrier_harness import HarnessBarrier
from .reporting import write_comparison
from .scope import IN_MEMORY_EXCLUDED, method_config


def run_barrier(out: str | Path, model_a: nn.Module, model_b: nn.Module, bundle: DatasetBundle,
                methods: Sequence[str], *, bn: str = "reset", lambdas: int = 25, eval_limit: int | None = None,
                seed: int = 0, overwrite: bool = False, names: tuple[str, str] = ("A", "B"),
                inputs: Sequence[str | Path] = (), log: Callable[[str], None] = print,
                progress: Callable[..., None] | None = None,
                configs: Mapping[str, StrictConfig] | None = None,
                harness: HarnessBarrier | None = None) -> Comparison:
    """Compare alignment methods on two models and write the report into ``out`` (atomically; ``inputs`` are the
    checkpoint directories, which ``out`` may not be, contain or lie inside); ``configs``: per method its config
    object (:func:`method_configs`); ``progress(stage, done, total, **metrics)``: each method's alignment and path
    points (:func:`~modeconn.diagnostics.compare.compare_alignments`), None: silent; ``harness``: lm-eval tasks scored
    on A, B and each midpoint merge (:mod:`.barrier_harness`; Hugging Face causal LMs), into ``results.json``
    (``lm_eval``) and the report."""
    start = time.perf_counter()
    with output_directory(out, overwrite, inputs=inputs, command="barrier") as tmp:
        on_merge = None
        if harness is not None:
            harness.score("A", model_a, log)
            harness.score("B", model_b, log)
            on_merge = lambda method, merged: harness.score(f"midpoint {method}", merged, log)  # noqa: E731
        comparison = compare_alignments(model_a, model_a.state_dict(), model_b.state_dict(), bundle, methods,
                                        lambdas=lambdas, bn=bn, seed=seed, eval_limit=eval_limit, on_step=log,
                                        progress=progress, configs=configs, on_merge=on_merge)
        results = {
            "task": f"barrier between {names[0]} and {names[1]} on {bundle.name}",
            "models": list(names),
            "dataset": {"name": bundle.name, "train": len(bundle.train), "test": len(bundle.test)},
            "endpoints": comparison.endpoints("test"),
            "bn": bn,
            **comparison.to_json(),
            **({"lm_eval": harness.to_json()} if harness is not None else {}),
            "seconds": time.perf_counter() - start,
        }
        write_comparison(tmp, comparison, results, title=f"{bundle.name}: linear interpolation A → B",
                         extra=harness.report_lines() if harness is not None else ())
    return comparison


def barrier(a: Path, b: Path, methods: Sequence[str], out: Path, *, dataset: str | None = None,
            data: Path | None = None, limit_train: int | None = None, bn: str = "reset", lambdas: int = 25,
            eval_limit: int | None = None, seed: int = 0, overwrite: bool = False, log: Callable[[str], None] = print,
            progress: Callable[..., None] | None = None, options: Mapping[str, Any] | None = None,
            eval_tasks: Sequence[str] = (), include_path: Path | None = None) -> Comparison:
    """The back-end of ``modeconn barrier``: the method names, their ``-o`` options (:func:`method_configs`) and the
    BatchNorm policy checked, the pair and its data loaded (:func:`~modeconn.recipes.pair.load_pair_and_data`),
    options that would do nothing refused, then :func:`run_barrier`; ``eval_tasks``: lm-eval tasks (with the local
    ones of ``include_path``) scored on A, B and each midpoint merge (:mod:`.barrier_harness`). Raises ConfigError
    (every check before the comparison starts)."""
    from ..diagnostics.compare import check_methods
    from ..path.batchnorm import check_bn_policy
    from .pair import check_pair_options, load_pair_and_data

    check_methods(methods)
    configs = method_configs(methods, options or {})
    check_bn_policy(bn)
    if include_path is not None and not eval_tasks:
        raise ConfigError("--include-path names local lm-eval tasks for --eval; give --eval TASKS or leave it out")
    harness = HarnessBarrier.checked(a, eval_tasks, include_path, seed) if eval_tasks else None
    ma, mb, _, bundle = load_pair_and_data(a, b, "barrier", dataset, data, limit_train)
    check_pair_options(ma, bundle, bn=bn)  # a --bn that would do nothing
    return run_barrier(out, ma, mb, bundle, methods, bn=bn, lambdas=lambdas, eval_limit=eval_limit, seed=seed,
                       overwrite=overwrite, names=(str(a), str(b)), inputs=[a, b], log=log, progress=progress,
                       configs=configs, harness=harness)


_BARRIER_EXCLUDED = {**IN_MEMORY_EXCLUDED, "seed": "--seed seeds every method and the BatchNorm batches; give it there"}


def method_configs(methods: Sequence[str], options: Mapping[str, Any]) -> dict[str, StrictConfig]:
    """Per alignment method of ``methods`` (``naive`` has none) its config object, built once from the ``-o``
    ``options``: each key goes to every method whose config has that field. ConfigError before any work for a key
    that no method given has (naming it and each method's fields), one the comparison sets itself (``seed``), or a
    bad value (named by the config). Without options, none (each method runs with its defaults)."""
    if not options:
        return {}
    entries = [ALIGNMENT_METHODS.get(m) for m in dict.fromkeys(methods) if m != "naive"]
    for key in options:
        if not any(key in e.config.model_fields for e in entries):
            fields = "; ".join(f"{e.name}: {', '.join(e.config.model_fields) or 'none'}" for e in entries)
            raise ConfigError(f"-o {key}: no --method given has an option {key!r} ({fields or 'naive has none'})")
    return {e.name: method_config(e, {}, {k: v for k, v in options.items() if k in e.config.model_fields},
                                  f"the barrier comparison (--method {e.name})", excluded=_BARRIER_EXCLUDED)
            for e in entries}
