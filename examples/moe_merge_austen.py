"""Merging two Mixture-of-Experts language models trained independently: aligned against plain averaging.

Two Mixtral-style causal LMs (4 experts, top-2, in every layer) are trained from different seeds in a plain PyTorch
loop on Jane Austen's novels, with a byte-level BPE tokenizer trained on the same text, and saved with
``save_pretrained`` (which stores the experts one by one). Then, from the command line:

1. ``merge A B --align none`` — the plain average of the checkpoints as trained;
2. ``merge A B --align weight`` — weight matching first: the residual stream, attention heads' dimensions, and the
   experts (each expert with its router row, its hidden units per expert, solved as an outer assignment over
   per-expert-pair inner assignments), then the average.

Both merges load with ``from_pretrained``; their held-out loss (the last 10 % of the text, never trained on) is
measured next to each endpoint's.

Run it: ``python examples/moe_merge_austen.py OUT_DIR [--quick]`` (``--quick``: the small size the test suite runs).
The full size's numbers are in the docs' results (Mixture-of-Experts merge).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
import transformers as T

from cli_helpers import modeconn, run_tutorial

SIZES = {"quick": dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=64),
         "full": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=96)}
TRAINING = {"quick": dict(chars=150_000, vocab=384, steps=150, batch=16),
            "full": dict(chars=400_000, vocab=512, steps=400, batch=16)}
CONTEXT = 64
EXPERTS = dict(num_local_experts=4, num_experts_per_tok=2)


def austen_text(limit_chars: int) -> str:
    """The bundled Austen text, its first ``limit_chars`` characters."""
    from modeconn.data.locate import find_data_dir
    from modeconn.data.text import read_text_file

    return read_text_file(find_data_dir("austen") / "austen.txt.gz", None)[:limit_chars]


def tokenizer(text: str, vocab: int) -> T.PreTrainedTokenizerFast:
    from modeconn.data import train_tokenizer

    tok = train_tokenizer(text, vocab)
    eos = tok.id_to_token(0)
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos)


def train(seed: int, ids: torch.Tensor, vocab: int, size: dict, steps: int, batch: int) -> T.MixtralForCausalLM:
    """AdamW (cosine schedule) on random ``CONTEXT``-token windows; the router's load-balancing loss included
    (the training of ``modeconn experiment heterogeneous``)."""
    from modeconn.experiments.heterogeneous import HeterogeneousSize, LMSize, lm_config, train_lm

    lm = LMSize(hidden=size["hidden_size"], layers=size["num_hidden_layers"], heads=size["num_attention_heads"],
                kv_heads=size["num_key_value_heads"], intermediate=size["intermediate_size"], steps=steps, batch=batch)
    run = HeterogeneousSize(context=CONTEXT, experts=EXPERTS["num_local_experts"], moe=lm)
    return train_lm(lm_config("mixtral", run, lm, vocab), ids, lm, steps, seed, CONTEXT)


def heldout_loss(path: Path, ids: torch.Tensor, blocks: int = 64) -> float:
    """Mean next-token loss (nats per token) of the checkpoint at ``path`` on the first ``blocks`` non-overlapping
    ``CONTEXT``-token windows of ``ids``."""
    model = T.AutoModelForCausalLM.from_pretrained(path).eval()
    n = min(blocks, len(ids) // CONTEXT)
    x = ids[: n * CONTEXT].reshape(n, CONTEXT)
    with torch.no_grad():
        return float(sum(model(input_ids=x[i:i + 16], labels=x[i:i + 16]).loss * len(x[i:i + 16])
                         for i in range(0, n, 16)) / n)


def main(out: Path, quick: bool) -> dict:
    size = "quick" if quick else "full"
    budget = TRAINING[size]
    out.mkdir(parents=True, exist_ok=True)
    text = austen_text(budget["chars"])
    cut = int(0.9 * len(text))
    tok = tokenizer(text[:cut], budget["vocab"])
    ids, held = torch.tensor(tok(text[:cut])["input_ids"]), torch.tensor(tok(text[cut:])["input_ids"])
    for seed, name in ((0, "moe-a"), (1, "moe-b")):
        train(seed, ids, len(tok), SIZES[size], budget["steps"], budget["batch"]).save_pretrained(out / name)
        tok.save_pretrained(out / name)
    a, b = out / "moe-a", out / "moe-b"
    modeconn("merge", a, b, "--align", "none", "--out", out / "merged-naive")
    modeconn("merge", a, b, "--align", "weight", "--out", out / "merged-aligned")
    loss = {name: heldout_loss(out / name, held) for name in ("moe-a", "moe-b", "merged-naive", "merged-aligned")}
    alignment = json.loads((out / "merged-aligned" / "merge.json").read_text())
    results = {"size": size, "heldout_loss": loss, "perplexity": {k: math.exp(v) for k, v in loss.items()},
               "alignment": {k: alignment[k] for k in ("align",) if k in alignment}}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print("held-out loss (nats/token):", json.dumps(loss))
    return results


def summary(out: Path) -> dict:
    """A finished run's numbers with what ran."""
    import platform
    from datetime import date

    results = json.loads((out / "results.json").read_text())
    config = json.loads((out / "moe-a" / "config.json").read_text())
    return {**results, "date": date.today().isoformat(), "torch": torch.__version__, "transformers": T.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
            "model": {k: config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                             "num_key_value_heads", "intermediate_size", "num_local_experts",
                                             "num_experts_per_tok", "vocab_size")},
            "training": TRAINING[results["size"]]}


def report(s: dict) -> str:
    """A markdown report of :func:`summary`."""
    m, t, loss = s["model"], s["training"], s["heldout_loss"]
    rows = "\n".join(f"| {name} | {v:.4f} | {s['perplexity'][name]:.2f} |" for name, v in loss.items())
    return (f"# Merging two Mixture-of-Experts language models\n\n"
            f"Two Mixtral-style causal LMs ({m['num_hidden_layers']} layers × {m['hidden_size']}, "
            f"{m['num_attention_heads']} heads ({m['num_key_value_heads']} key/value), {m['num_local_experts']} experts "
            f"of {m['intermediate_size']} hidden units, top-{m['num_experts_per_tok']}, vocabulary {m['vocab_size']}) "
            f"trained from seeds 0 and 1 for {t['steps']} AdamW steps of {t['batch']} × {CONTEXT} tokens on the first "
            f"90 % of {t['chars']:,} characters of the Austen text (`examples/moe_merge_austen.py`, {s['size']} size), "
            f"merged with `modeconn merge --align none` (plain average) and `--align weight` (experts with their "
            f"router rows, hidden units per expert, residual stream and attention dimensions).\n\n"
            f"Held-out loss: the remaining 10 %, 64 windows of {CONTEXT} tokens, nats per token.\n\n"
            f"| model | loss | perplexity |\n|---|---|---|\n{rows}\n\n"
            f"Weight matching lowers the merge's held-out loss by {loss['merged-naive'] - loss['merged-aligned']:.3f} "
            f"nats per token; the aligned merge stays {loss['merged-aligned'] - min(loss['moe-a'], loss['moe-b']):.3f} "
            f"above the better endpoint (no fine-tuning after merging). One pair, one size.\n\n"
            f"Ran on {s['date']} with torch {s['torch']}, transformers {s['transformers']}, {s['machine']}.\n")


if __name__ == "__main__":
    run_tutorial(main, __doc__)
