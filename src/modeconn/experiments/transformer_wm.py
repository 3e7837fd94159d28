"""`modeconn experiment transformer-wm`: weight matching for transformers on real data (docs/methods.md §0, §3).

1. **Locally trained GPT pair.** Two GPT-NeoX-configured causal LMs (Hugging Face classes; parallel residual,
   partial rotary, LayerNorm) trained from seeds 0 and 1 on the Austen text with a byte-level BPE tokenizer;
   the held-out (test split) loss along the linear path — ``barrier_mean`` and ``barrier_interp`` in nats per
   token — for: naive interpolation; weight matching with the permutation group (residual stream, per-head
   q·k / v·o dims outside the rotary pairs, FFN units) on the models as trained; and weight matching with the
   full group after normalization absorption (orthogonal residual rotation, head permutation, per-head
   orthogonal QK / OV transforms, FFN permutation), interpolated in the absorbed coordinates.
2. **Planted MiniLM.** The pretrained all-MiniLM-L6-v2 (BERT, post-LN) is moved by a random element of its
   group (head permutation with per-head orthogonal QK / OV, FFN permutation; the residual stream of a bare
   ``BertModel`` is its output, so it stays fixed); weight
   matching against the original must recover it: parameters equal to fp32 error, outputs on real sentences
   allclose. Figure: per-tensor relative error of the planted and of the recovered parameters.

Writes ``results.json``, ``report.md``, ``lm_barrier.png`` (held-out loss and accuracy vs λ) and
``minilm_recovery.png``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ..data import load_dataset, make_loader
from ..path import Curve, evaluate_path
from ..report import markdown_table, plot_curves
from ..symmetry.hf import FULL_GROUPS
from .output import output_directory, write_results
from .training import train_models
from .registry import Experiment, register_experiment

Log = Callable[[str], None]
BERT_GROUPS = {"heads": "permutation", "qk": "head_orthogonal", "vo": "head_orthogonal"}


@dataclass(frozen=True)
class LMSize:
    """Everything that differs between ``--quick`` (CI) and the full run."""

    hidden_size: int
    layers: int
    heads: int
    intermediate: int
    vocab_size: int
    context: int
    limit_train: int | None
    epochs: int
    eval_blocks: int
    lambdas: int
    lr: float = 3e-3
    batch_size: int = 32


SIZES = {
    "quick": LMSize(hidden_size=64, layers=2, heads=4, intermediate=256, vocab_size=1024, context=64, limit_train=400,
                    epochs=1, eval_blocks=32, lambdas=7),
    "full": LMSize(hidden_size=128, layers=2, heads=4, intermediate=512, vocab_size=2048, context=128, limit_train=None,
                   epochs=2, eval_blocks=200, lambdas=11),
}


def train_pair(size: LMSize, bundle, log: Log) -> list[nn.Module]:
    """Two ``gpt-neox-tiny`` LMs trained from seeds 0 and 1 (initialisation and data order), in eval mode."""
    train = dict(epochs=size.epochs, lr=size.lr, optimizer="adamw", weight_decay=0.1, batch_size=size.batch_size,
                 warmup_epochs=0.05 * size.epochs, grad_clip=1.0)
    return train_models("gpt-neox-tiny", bundle, (0, 1), train, in_shape=(size.context,), log=log, label="LM",
                        hidden_size=size.hidden_size, num_hidden_layers=size.layers, num_attention_heads=size.heads,
                        intermediate_size=size.intermediate)


def lm_barriers(size: LMSize, bundle, models: list[nn.Module], log: Log) -> tuple[dict[str, Curve], dict[str, Any]]:
    """Held-out loss along the linear path: naive, WM (permutations), WM (full group, absorbed)."""
    from ..match import weight_matching
    from ..symmetry import absorb_normalization, symmetry_spec
    from ..symmetry.hf import hf_symmetry_spec

    a, b = models
    test = torch.utils.data.Subset(bundle.test, range(min(size.eval_blocks, len(bundle.test))))
    loader = {"test": make_loader(test, 16)}
    sa, sb = a.state_dict(), b.state_dict()
    curves: dict[str, Curve] = {}
    stats: dict[str, Any] = {}
    curves["naive"] = evaluate_path(a, sa, sb, loader, lambdas=size.lambdas)
    t0 = time.perf_counter()
    spec = symmetry_spec(a)
    wm = weight_matching(spec, sa, sb)
    stats["wm_permutation"] = {"seconds": time.perf_counter() - t0, "objective": wm.objective,
                               "spaces": len(spec.spaces)}
    curves["WM (permutations)"] = evaluate_path(a, sa, wm.apply(sb), loader, lambdas=size.lambdas)
    log("weight matching (permutations) done")
    t0 = time.perf_counter()
    abs_a, abs_b = absorb_normalization(a), absorb_normalization(b)
    full = hf_symmetry_spec(abs_a, groups=FULL_GROUPS)
    wm_full = weight_matching(full, abs_a.state_dict(), abs_b.state_dict())
    stats["wm_full"] = {"seconds": time.perf_counter() - t0, "objective": wm_full.objective,
                        "spaces": len(full.spaces), "groups": FULL_GROUPS}
    curves["WM (full group, absorbed)"] = evaluate_path(abs_a, abs_a.state_dict(), wm_full.apply(abs_b.state_dict()),
                                                        loader, lambdas=size.lambdas)
    log("weight matching (full group) done")
    return curves, stats


def planted_minilm(root: Path, seed: int = 0) -> dict[str, Any]:
    """Random full-group element on MiniLM → weight matching → recovered parameters and outputs."""
    from tokenizers import Tokenizer
    from transformers import AutoModel

    from ..match import weight_matching
    from ..symmetry.hf import hf_symmetry_spec

    model = AutoModel.from_pretrained(str(root), local_files_only=True, trust_remote_code=False).eval()
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    sentences = ["It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                 "must be in want of a wife.", "Mode connectivity joins two minima by a low-loss path."]
    enc = [tok.encode(s).ids for s in sentences]
    n = max(len(e) for e in enc)
    ids = torch.tensor([e + [0] * (n - len(e)) for e in enc])
    mask = torch.tensor([[1] * len(e) + [0] * (n - len(e)) for e in enc])
    spec = hf_symmetry_spec(model, groups=BERT_GROUPS)
    sd = model.state_dict()
    g = spec.random_element(seed=seed)
    planted = spec.apply(sd, g)
    t0 = time.perf_counter()
    res = weight_matching(spec, sd, planted)
    seconds = time.perf_counter() - t0
    recovered = res.apply(planted)

    def out(state):
        m = copy.deepcopy(model)
        m.load_state_dict(state)
        with torch.no_grad():
            return m.eval()(input_ids=ids, attention_mask=mask).last_hidden_state

    ref = out(sd)
    keys = [k for k, b in spec.tensors.items() if b and sd[k].is_floating_point()]
    rel = lambda s: {k: float((s[k].double() - sd[k].double()).norm() / sd[k].double().norm().clamp_min(1e-30))  # noqa: E731
                     for k in keys}
    return {"spaces": len(spec.spaces), "tensors": len(keys), "seconds": seconds,
            "planted_rel_error": rel(planted), "recovered_rel_error": rel(recovered),
            "max_output_diff_planted": float((out(planted) - ref).abs().max()),
            "max_output_diff_recovered": float((out(recovered) - ref).abs().max()),
            "output_scale": float(ref.abs().max())}


def plot_minilm(m: dict[str, Any], path: Path) -> None:
    from ..report.figures import pyplot

    plt = pyplot()

    keys = list(m["planted_rel_error"])
    fig, ax = plt.subplots(figsize=(10, 4))
    x = np.arange(len(keys))
    ax.semilogy(x, [max(m["planted_rel_error"][k], 1e-12) for k in keys], ".", label="planted (before matching)")
    ax.semilogy(x, [max(m["recovered_rel_error"][k], 1e-12) for k in keys], ".", label="after weight matching")
    ax.set_xlabel("parameter tensor (state-dict order)")
    ax.set_ylabel("‖θ' − θ‖ / ‖θ‖")
    ax.set_title(f"MiniLM planted full-group element: {m['spaces']} spaces, recovered in {m['seconds']:.1f} s")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_transformer_wm(out: str | Path, *, quick: bool = False, data: str | Path | None = None, overwrite: bool = False,
                       size: LMSize | None = None, log: Log = print) -> dict[str, Any]:
    """Run the experiment (module docstring) and write its outputs into ``out`` (atomically)."""
    from ..data.locate import find_data_dir

    size = size or SIZES["quick" if quick else "full"]
    start = time.perf_counter()
    with output_directory(out, overwrite) as tmp:
        bundle = load_dataset("austen", data, vocab_size=size.vocab_size, context_length=size.context,
                              limit_train=size.limit_train)
        models = train_pair(size, bundle, log)
        curves, stats = lm_barriers(size, bundle, models, log)
        rows = {k: {"barrier_mean": c.barrier("mean", "test"), "barrier_interp": c.barrier("interp", "test"),
                    "endpoint_loss": [float(c.values("test", "loss")[0]), float(c.values("test", "loss")[-1])],
                    "midpoint_loss": float(c.values("test", "loss")[len(c.lambdas) // 2])} for k, c in curves.items()}
        minilm = planted_minilm(find_data_dir("minilm", data))
        plot_minilm(minilm, tmp / "minilm_recovery.png")
        plot_curves(curves, tmp / "lm_barrier.png", title="GPT-NeoX pair on Austen: held-out loss vs λ")
        results = {
            "task": "transformer weight matching (docs/methods.md §0, §3)",
            "size": asdict(size),
            "data": {"train_tokens": int(bundle.train.tensors[0].numel()), "test_blocks": min(size.eval_blocks,
                                                                                              len(bundle.test))},
            "lm_barriers": rows, "wm_stats": stats,
            "minilm": {k: v for k, v in minilm.items() if not k.endswith("rel_error")}
            | {"max_recovered_rel_error": max(minilm["recovered_rel_error"].values()),
               "min_planted_rel_error": min(minilm["planted_rel_error"].values())},
            "curves": {k: c.to_json() for k, c in curves.items()},
        }
        return write_results(tmp, results, report, start)


def report(r: dict[str, Any]) -> str:
    s = r["size"]
    table = markdown_table(["method", "barrier_mean (test loss)", "barrier_interp (test loss)", "midpoint loss",
                            "endpoint losses"],
                           [[k, v["barrier_mean"], v["barrier_interp"], v["midpoint_loss"],
                             " / ".join(f"{x:.4f}" for x in v["endpoint_loss"])] for k, v in r["lm_barriers"].items()])
    m = r["minilm"]
    return "\n".join([
        f"# {r['task']}",
        "",
        f"GPT-NeoX pair ({s['layers']} layers × {s['hidden_size']}, {s['heads']} heads, MLP {s['intermediate']}, "
        f"vocab {s['vocab_size']}, context {s['context']}), seeds 0 and 1, {s['epochs']} epoch(s) over "
        f"{r['data']['train_tokens']:,} training tokens of the Austen text; losses are next-token cross-entropy "
        f"(nats per token) on {r['data']['test_blocks']} held-out blocks.",
        "",
        table,
        "",
        f"Planted MiniLM ({m['spaces']} spaces): largest relative parameter error after weight matching "
        f"{m['max_recovered_rel_error']:.2e} (smallest planted error {m['min_planted_rel_error']:.2e}); max |Δ hidden "
        f"state| {m['max_output_diff_recovered']:.2e} after recovery vs {m['max_output_diff_planted']:.2e} for the "
        f"planted model (the symmetry keeps the function) at output scale {m['output_scale']:.2f}; "
        f"{m['seconds']:.1f} s.",
        "",
        "![loss vs λ](lm_barrier.png)",
        "",
        "![MiniLM recovery](minilm_recovery.png)",
        "",
    ])


register_experiment(Experiment("transformer-wm", __doc__, SIZES, run_transformer_wm, report,
                               ("report.md", "results.json", "lm_barrier.png", "minilm_recovery.png"),
                               {"epochs": "epochs", "width": "hidden_size", "limit_train": "limit_train"},
                               why_not="one pair of language models"))
