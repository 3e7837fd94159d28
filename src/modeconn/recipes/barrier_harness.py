"""lm-evaluation-harness scores along a barrier comparison of two Hugging Face causal LMs (``barrier --eval``).

The comparison's loss barriers are per-token losses on the user's text; lm-eval tasks score what users of merged LMs
judge a merge by. Each task is run on endpoint A (λ=0), endpoint B (λ=1) and every method's midpoint merge (λ=½, the
very model the comparison evaluates there), and each metric's barrier is the midpoint's loss of score against the
endpoints' mean — the error barrier of Frankle et al. (2020) with the metric in place of accuracy:
``mean(s_A, s_B) − s_½`` for a metric lm-eval states is higher-is-better, ``s_½ − mean(s_A, s_B)`` for one it states is
lower-is-better (perplexities). Positive: the merge is worse than its endpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.nn as nn

from ..checkpoints import open_checkpoint


@dataclass
class HarnessBarrier:
    """lm-eval ``tasks`` (``include_path``: local task YAML files) scored with ``seed`` on the comparison's models,
    with the tokenizer of checkpoint A. ``scores``: point name (``A``, ``B``, ``midpoint <method>``) → the
    :func:`~modeconn.diagnostics.harness.harness_scores` record."""

    tasks: tuple[str, ...]
    include_path: Path | None
    tokenizer: Any
    seed: int = 0
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def checked(cls, a: Path, tasks: Sequence[str], include_path: Path | None, seed: int) -> HarnessBarrier:
        """Before any weights are read: ConfigError unless ``a`` is a Hugging Face causal LM and every task is known
        to lm-eval; DataError for a tokenizer transformers cannot read."""
        from .evaluate import _hf_tokenizer, check_harness_target

        ckpt = open_checkpoint(a)
        check_harness_target(ckpt, tuple(tasks), include_path)
        return cls(tuple(tasks), include_path, _hf_tokenizer(ckpt), seed)

    def score(self, name: str, wrapped: nn.Module, log: Callable[[str], None] = print) -> None:
        """Score the Hugging Face model inside the comparison's wrapper ``wrapped`` as the point ``name``.
        NonFiniteError for a NaN/Inf score."""
        from ..diagnostics.harness import harness_scores
        from .hf_memory import hf_model

        log(f"lm-eval tasks on {name}: {', '.join(self.tasks)}")
        self.scores[name] = harness_scores(hf_model(wrapped), self.tokenizer, self.tasks,
                                           include_path=self.include_path, seed=self.seed)

    def barriers(self) -> dict[str, dict[str, dict[str, float]]]:
        """Method → task → metric → barrier (module docstring); metrics without a stated direction (stderrs) are
        left out."""
        a, b = self.scores["A"], self.scores["B"]
        out: dict[str, dict[str, dict[str, float]]] = {}
        for name, mid in self.scores.items():
            if not name.startswith("midpoint "):
                continue
            per_task = {}
            for task, higher in a["higher_is_better"].items():
                per_task[task] = {m: _barrier(a["tasks"][task][m], b["tasks"][task][m], mid["tasks"][task][m], up)
                                  for m, up in higher.items()}
            out[name.removeprefix("midpoint ")] = per_task
        return out

    def to_json(self) -> dict[str, Any]:
        first = next(iter(self.scores.values()))
        return {"tasks": list(self.tasks), "include_path": None if self.include_path is None else str(self.include_path),
                "lm_eval_version": first["lm_eval_version"], "higher_is_better": first["higher_is_better"],
                "scores": {k: v["tasks"] for k, v in self.scores.items()}, "barrier": self.barriers()}

    def report_lines(self) -> list[str]:
        """The report's section: every score at A, B and each midpoint, with its barrier."""
        lines = ["## lm-eval scores (A, B and the midpoint merge of each method)", "",
                 "Barrier = the midpoint's loss of score against the endpoints' mean (positive: worse than both "
                 "ends on average; perplexities count lower as better).", "",
                 "| method | task | metric | A | B | midpoint | barrier |", "|---|---|---|---:|---:|---:|---:|"]
        a, b = self.scores["A"]["tasks"], self.scores["B"]["tasks"]
        for method, per_task in self.barriers().items():
            mid = self.scores[f"midpoint {method}"]["tasks"]
            for task, metrics in per_task.items():
                lines += [f"| {method} | {task} | {m} | {a[task][m]:.4g} | {b[task][m]:.4g} | {mid[task][m]:.4g} | "
                          f"{v:+.4g} |" for m, v in metrics.items()]
        return [*lines, ""]


def _barrier(a: float, b: float, mid: float, higher_is_better: bool) -> float:
    mean = (a + b) / 2
    return mean - mid if higher_is_better else mid - mean
