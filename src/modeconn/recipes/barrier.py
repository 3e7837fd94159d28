"""`modeconn barrier`: naive and aligned barriers between two trained checkpoints."""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable, Sequence

import torch.nn as nn

from ..data import DatasetBundle
from ..diagnostics.compare import Comparison, compare_alignments
from ..experiments.output import output_directory
from .reporting import write_comparison


def run_barrier(out: str | Path, model_a: nn.Module, model_b: nn.Module, bundle: DatasetBundle,
                methods: Sequence[str], *, bn: str = "reset", lambdas: int = 25, eval_limit: int | None = None,
                seed: int = 0, overwrite: bool = False, names: tuple[str, str] = ("A", "B"),
                inputs: Sequence[str | Path] = (), log: Callable[[str], None] = print,
                progress: Callable[[int, int], None] | None = None) -> Comparison:
    """Compare alignment methods on two models and write the report into ``out`` (atomically; ``inputs`` are the
    checkpoint directories, which ``out`` may not be, contain or lie inside)."""
    start = time.perf_counter()
    with output_directory(out, overwrite, inputs=inputs, command="barrier") as tmp:
        comparison = compare_alignments(model_a, model_a.state_dict(), model_b.state_dict(), bundle, methods,
                                        lambdas=lambdas, bn=bn, seed=seed, eval_limit=eval_limit, on_step=log,
                                        progress=progress)
        results = {
            "task": f"barrier between {names[0]} and {names[1]} on {bundle.name}",
            "models": list(names),
            "dataset": {"name": bundle.name, "train": len(bundle.train), "test": len(bundle.test)},
            "endpoints": comparison.endpoints("test"),
            "bn": bn,
            **comparison.to_json(),
            "seconds": time.perf_counter() - start,
        }
        write_comparison(tmp, comparison, results, title=f"{bundle.name}: linear interpolation A → B")
    return comparison


def barrier(a: Path, b: Path, methods: Sequence[str], out: Path, *, dataset: str | None = None,
            data: Path | None = None, limit_train: int | None = None, bn: str = "reset", lambdas: int = 25,
            eval_limit: int | None = None, seed: int = 0, overwrite: bool = False, log: Callable[[str], None] = print,
            progress: Callable[[int, int], None] | None = None) -> Comparison:
    """The back-end of ``modeconn barrier``: the method names and BatchNorm policy checked, the pair and its data
    loaded (:func:`~modeconn.recipes.pair.load_pair_and_data`), options that would do nothing refused, then
    :func:`run_barrier`. Raises ConfigError (every check before the comparison starts)."""
    from ..diagnostics.compare import check_methods
    from ..path.batchnorm import check_bn_policy
    from .pair import check_pair_options, load_pair_and_data

    check_methods(methods)
    check_bn_policy(bn)
    ma, mb, _, bundle = load_pair_and_data(a, b, "barrier", dataset, data, limit_train)
    check_pair_options(ma, bundle, bn=bn)  # a --bn that would do nothing
    return run_barrier(out, ma, mb, bundle, methods, bn=bn, lambdas=lambdas, eval_limit=eval_limit, seed=seed,
                       overwrite=overwrite, names=(str(a), str(b)), inputs=[a, b], log=log, progress=progress)
