"""`modeconn experiment merge-rules`: practitioners' merge rules on two independently trained LMs.

Two GPT-NeoX-configured causal LMs (the pair of ``transformer-wm``: seeds 0 and 1, the Austen text, byte-level BPE)
are merged by each rule of :data:`RULES` — modeconn's weighted average and mergekit's task arithmetic, TIES, DARE
(seeded), SLERP and Karcher mean (:mod:`modeconn.path.merge_mergekit`) — after three alignments: none (the models as
trained, which is all mergekit can do), weight matching with the permutation group, and weight matching with the
full group after normalization absorption (merged in the absorbed coordinates). The number per cell is the merged
model's held-out next-token loss (nats per token, test split). Task-vector rules take model A as the base (B's task
vector is ``B − A``): there is no common pre-trained ancestor of two independently trained models.

Writes ``results.json`` and ``report.md``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..data import load_dataset, make_loader
from ..path.merge_rules import RuleSettings, check_rule_settings
from ..report import markdown_table
from .output import output_directory, write_results
from .registry import Experiment, register_experiment
from ..symmetry.hf import FULL_GROUPS
from .transformer_wm import SIZES, LMSize, train_pair

Log = Callable[[str], None]

RULES: dict[str, tuple[str, list[float], RuleSettings]] = {
    "linear (0.5 / 0.5)": ("linear", [0.5, 0.5], RuleSettings()),
    "task_arithmetic (base A, w 0.5)": ("task_arithmetic", [1.0, 0.5], RuleSettings(base=0)),
    "ties (base A, density 0.5)": ("ties", [1.0, 1.0], RuleSettings(base=0, params={"density": 0.5})),
    "dare_ties (base A, density 0.5, seed 0)": ("dare_ties", [1.0, 1.0],
                                                RuleSettings(base=0, params={"density": 0.5}, seed=0)),
    "dare_linear (base A, w 0.5, density 0.5, seed 0)": ("dare_linear", [1.0, 0.5],
                                                         RuleSettings(base=0, params={"density": 0.5}, seed=0)),
    "slerp (base A, t 0.5)": ("slerp", [1.0, 1.0], RuleSettings(base=0, params={"t": 0.5})),
    "karcher": ("karcher", [1.0, 1.0], RuleSettings()),
}
"""Row label → (rule, weights, settings): the merges of the table."""


def aligned_pairs(models: list[nn.Module], log: Log) -> tuple[dict[str, tuple[nn.Module, dict, dict]], dict]:
    """Alignment label → (model to load the merge into, A's state dict, B's aligned state dict), plus timings."""
    from ..match import weight_matching
    from ..symmetry import absorb_normalization, symmetry_spec
    from ..symmetry.hf import hf_symmetry_spec

    a, b = models
    sa, sb = a.state_dict(), b.state_dict()
    pairs, stats = {"none": (a, sa, sb)}, {}
    t0 = time.perf_counter()
    wm = weight_matching(symmetry_spec(a), sa, sb)
    pairs["weight (permutations)"] = (a, sa, wm.apply(sb))
    stats["weight (permutations)"] = {"seconds": time.perf_counter() - t0, "objective": wm.objective}
    log("weight matching (permutations) done")
    t0 = time.perf_counter()
    abs_a, abs_b = absorb_normalization(a), absorb_normalization(b)
    full = weight_matching(hf_symmetry_spec(abs_a, groups=FULL_GROUPS), abs_a.state_dict(), abs_b.state_dict())
    pairs["weight (full group, absorbed)"] = (abs_a, abs_a.state_dict(), full.apply(abs_b.state_dict()))
    stats["weight (full group, absorbed)"] = {"seconds": time.perf_counter() - t0, "objective": full.objective,
                                              "groups": FULL_GROUPS}
    log("weight matching (full group) done")
    return pairs, stats


def merged_losses(pairs: dict[str, tuple[nn.Module, dict, dict]], loader, log: Log) -> dict[str, dict[str, float]]:
    """Row label → {alignment label: held-out loss of the merge} for every rule of :data:`RULES`."""
    from ..path import evaluate_model
    from ..path.interpolate import weighted_average

    rows: dict[str, dict[str, float]] = {}
    for label, (rule, weights, settings) in RULES.items():
        check_rule_settings(rule, settings, 2)
        rows[label] = {}
        for align, (model, sa, sb) in pairs.items():
            merged = weighted_average([sa, sb], weights, normalize=False, rule=rule, settings=settings)
            m = copy.deepcopy(model)
            m.load_state_dict(merged)
            rows[label][align] = evaluate_model(m, loader, where=f"{label}, align {align}")["loss"]
        log(f"{label}: " + ", ".join(f"{k} {v:.4f}" for k, v in rows[label].items()))
    return rows


def run_merge_rules(out: str | Path, *, size: LMSize | None = None, data: str | Path | None = None,
                    overwrite: bool = False, log: Log = print) -> dict[str, Any]:
    """Run the experiment (module docstring) and write ``results.json`` and ``report.md`` into ``out`` atomically.
    Raises ConfigError (data not found, mergekit not installed) before training."""
    from ..path import evaluate_model

    size = size or SIZES["full"]
    for rule, _, settings in RULES.values():
        check_rule_settings(rule, settings, 2)
    start = time.perf_counter()
    with output_directory(out, overwrite) as tmp:
        bundle = load_dataset("austen", data, vocab_size=size.vocab_size, context_length=size.context,
                              limit_train=size.limit_train)
        models = train_pair(size, bundle, log)
        test = torch.utils.data.Subset(bundle.test, range(min(size.eval_blocks, len(bundle.test))))
        loader = make_loader(test, 16)
        pairs, stats = aligned_pairs(models, log)
        results = {
            "task": "merge rules on two independently trained GPT-NeoX LMs", "size": asdict(size),
            "data": {"train_tokens": int(bundle.train.tensors[0].numel()), "test_blocks": len(test)},
            "endpoints": {n: evaluate_model(m, loader, where=f"model {n}")["loss"] for n, m in zip("AB", models,
                                                                                                   strict=True)},
            "losses": merged_losses(pairs, loader, log), "alignment": stats,
            "rules": {k: {"rule": r, "weights": w, "base": s.base, "params": dict(s.params), "seed": s.seed}
                      for k, (r, w, s) in RULES.items()},
        }
        return write_results(tmp, results, report, start)


def report(r: dict[str, Any]) -> str:
    s = r["size"]
    aligns = list(next(iter(r["losses"].values())))
    table = markdown_table(["merge rule", *(f"align {a}" for a in aligns)],
                           [[k, *(v[a] for a in aligns)] for k, v in r["losses"].items()])
    e = r["endpoints"]
    return "\n".join([
        f"# {r['task']}", "",
        f"GPT-NeoX pair ({s['layers']} layers × {s['hidden_size']}, {s['heads']} heads, MLP {s['intermediate']}, "
        f"vocab {s['vocab_size']}, context {s['context']}), seeds 0 and 1, {s['epochs']} epoch(s) over "
        f"{r['data']['train_tokens']:,} training tokens of the Austen text. Each cell: held-out next-token loss "
        f"(nats per token, {r['data']['test_blocks']} test blocks) of the merged model. Endpoints: A {e['A']:.4f}, "
        f"B {e['B']:.4f}. Task-vector rules and SLERP take A as the base (B's task vector is B − A); "
        "mergekit 0.1.5's kernels (`modeconn merge --rule`), modeconn's linear average.", "",
        table, "",
        "Alignment: " + "; ".join(f"{k}: objective {v['objective']:.4g}, {v['seconds']:.1f} s"
                                  for k, v in r["alignment"].items()) + f"; total {r['seconds']:.0f} s.", "",
    ])


register_experiment(Experiment("merge-rules", __doc__, SIZES, run_merge_rules, report, ("report.md", "results.json"),
                               {"epochs": "epochs", "width": "hidden_size", "limit_train": "limit_train"},
                               why_not="one pair of language models"))
