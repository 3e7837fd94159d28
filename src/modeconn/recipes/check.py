"""``modeconn check A [B]``: load, run :func:`modeconn.diagnostics.check`, write report.md, results.json, check.png.

Of the interpolation paths only the midpoint of each one is evaluated, on the evaluation examples (the path
itself is ``modeconn barrier``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoints import CHECKPOINT_KINDS, refuse_kind, register_in_memory
from .outcome import Outcome

CONTENTS = "report.md, results.json, check.png"


@dataclass(frozen=True)
class CheckOptions:
    """Options of :func:`run_check` (the command's flags)."""

    dataset: str | None = None
    data: Path | None = None
    limit_train: int | None = None
    max_batches: int = 5
    eval_limit: int = 2000
    seed: int = 0
    overwrite: bool = False
    device: str | None = None


def load_models(a: Path, b: Path | None, opts: CheckOptions):
    """``([model A(, model B)], A's config, dataset bundle)``; ConfigError for a checkpoint of a kind ``check`` does not
    read, two architectures, or no (fitting) dataset — before any weights are used. Hugging Face causal LMs are read
    with a text dataset (``--dataset``) tokenized with their own tokenizer."""
    from ..checkpoints import open_checkpoints

    ckpts = open_checkpoints([a] if b is None else [a, b])
    load = ckpts[0].kind.operation("check")
    if load is None:
        raise refuse_kind("check", "check", ckpts[0])
    return load(ckpts, opts)


def _load_in_memory(ckpts, opts: CheckOptions):
    """The models of an in-memory kind and the data it is fed (the kind's hooks)."""
    from ..checkpoints import load_same_architecture

    models = load_same_architecture(ckpts)
    return models, ckpts[0].config, ckpts[0].feed(opts.dataset, opts.data, opts.limit_train)


def _load_hugging_face(ckpts, opts: CheckOptions):
    """Hugging Face causal LMs (text) or image classifiers (an image folder), wrapped to map a batch to logits, and
    their data — read and checked before any weights (:func:`~.hf_memory.load_models`)."""
    from .hf_memory import load_models

    models, bundle = load_models(ckpts, "check", opts.dataset, opts.data, opts.limit_train)
    return models, dict(ckpts[0].config), bundle


CHECKPOINT_KINDS["modeconn"].supports("check", _load_in_memory)
CHECKPOINT_KINDS["huggingface"].supports("check", _load_hugging_face)
CHECKPOINT_KINDS["absorbed"].supports("check", _load_hugging_face)
register_in_memory("check", _load_in_memory)


def run_check(a: Path, b: Path | None, out: Path, opts: CheckOptions, log=print, progress=None) -> Outcome:
    """Check one pair (or model A alone) and write the report into ``out`` atomically (``out`` may not be, contain
    or lie inside an input; an existing ``out`` is replaced only with ``overwrite`` and only if modeconn wrote it);
    ``progress``: :func:`~modeconn.diagnostics.check`'s (None: silent)."""
    from ..diagnostics import check
    from ..experiments.output import output_directory, write_json
    from .check_report import plot, report, summary_lines

    from .._util.device import resolve_device

    resolve_device(opts.device, "--device")  # before any output or model exists
    start = time.perf_counter()
    inputs = [p for p in (a, b, opts.data) if p is not None]
    with output_directory(out, opts.overwrite, inputs=inputs, command="check") as tmp:
        models, _, bundle = load_models(a, b, opts)
        log(f"checking {a}" + ("" if b is None else f" and {b}") + f" on {bundle.name}")
        res = check(*models, data=bundle, max_batches=opts.max_batches, eval_limit=opts.eval_limit, seed=opts.seed,
                    device=opts.device, progress=progress)
        results: dict[str, Any] = {"task": "check", "models": [str(p) for p in (a, b) if p is not None],
                                   **res.to_json(), "seconds": time.perf_counter() - start}
        write_json(tmp / "results.json", results)
        (tmp / "report.md").write_text(report(results))
        plot(results, tmp / "check.png")
    return Outcome(out=out, contents=CONTENTS, lines=tuple(summary_lines(results)), what="check")
