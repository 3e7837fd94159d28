"""Training speed and learning curve of gpt-neox-tiny on "austen" (CPU), to size the LM barrier experiment.

Trains one model per seed for a token budget with AdamW (linear warm-up over 5 % of the steps, then cosine
to 0, weight decay 0.1, grad-norm clip 1.0) on random training blocks (a fresh permutation of all blocks per
pass, ``torch.Generator`` seeded), evaluates the validation split (nats/token and perplexity) every
``--eval-every`` steps, and records tokens/s of the training steps (evaluation excluded). The loop is
:func:`modeconn.train.fit`'s per-step work (flattened next-token cross-entropy) with intermediate
evaluations, which ``fit`` (per-epoch) does not offer.

Writes ``benchmarks/results/lm_<name>.json`` atomically and prints one line per evaluation. Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_lm.py --preset small --tokens 1000000
    OMP_NUM_THREADS=1 python benchmarks/bench_lm.py --preset base --tokens 500000 --seeds 0
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_json

from modeconn.data import load_dataset
from modeconn.models import build_model
from modeconn.train import evaluate, lr_factor

PRESETS = {
    # the suggestion: 4 layers x 256, 4 heads, MLP 1024, V = 4096
    "base": dict(vocab_size=4096, model=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                             intermediate_size=1024)),
    # the proposed CPU default: 2 layers x 128, 4 heads of 32, MLP 512, V = 2048
    "small": dict(vocab_size=2048, model=dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                              intermediate_size=512)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--tokens", type=int, default=1_000_000, help="training tokens per model")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    preset = PRESETS[args.preset]

    t0 = time.perf_counter()
    bundle = load_dataset("austen", vocab_size=preset["vocab_size"], context_length=args.context)
    load_seconds = time.perf_counter() - t0
    x, y = bundle.train.tensors
    tokens_per_step = args.batch_size * args.context
    steps = max(1, args.tokens // tokens_per_step)
    warmup = max(1, steps // 20)
    runs = []
    for seed in args.seeds:
        model = build_model("gpt-neox-tiny", seed=seed, in_shape=bundle.input_shape, num_classes=bundle.num_classes,
                            **preset["model"])
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, warmup, "cosine"))
        gen = torch.Generator().manual_seed(seed)
        order, pos = torch.randperm(len(x), generator=gen), 0
        curve, train_seconds = [], 0.0
        val0 = evaluate(model, bundle.val, batch_size=128)
        curve.append({"step": 0, "tokens": 0, "val_loss": val0["loss"], "val_ppl": math.exp(val0["loss"])})
        model.train()
        tic = time.perf_counter()
        for step in range(1, steps + 1):
            if pos + args.batch_size > len(order):
                order, pos = torch.randperm(len(x), generator=gen), 0
            idx = order[pos:pos + args.batch_size]
            pos += args.batch_size
            logits = model(x[idx])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[idx].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if step % args.eval_every == 0 or step == steps:
                train_seconds += time.perf_counter() - tic
                val = evaluate(model, bundle.val, batch_size=128)
                model.train()
                rec = {"step": step, "tokens": step * tokens_per_step, "train_loss": float(loss.detach()),
                       "val_loss": val["loss"], "val_ppl": math.exp(val["loss"]), "val_acc": val["acc"],
                       "train_seconds": train_seconds, "tokens_per_second": step * tokens_per_step / train_seconds}
                curve.append(rec)
                print(f"seed {seed} step {step}/{steps} tokens {rec['tokens']:,} val {val['loss']:.3f} nats "
                      f"(ppl {rec['val_ppl']:.1f}, acc {val['acc']:.3f}) {rec['tokens_per_second']:.0f} tok/s "
                      f"{train_seconds:.0f}s", flush=True)
                tic = time.perf_counter()
        test = evaluate(model, bundle.test, batch_size=128)
        runs.append({"seed": seed, "curve": curve, "test_loss": test["loss"], "test_ppl": math.exp(test["loss"]),
                     "params": sum(p.numel() for p in model.parameters())})
    path = write_json(f"lm_{args.preset}", {
        "preset": args.preset, **preset, "context": args.context, "batch_size": args.batch_size, "lr": args.lr,
        "tokens": steps * tokens_per_step, "steps": steps, "warmup_steps": warmup, "dataset_seconds": load_seconds,
        "train_tokens_available": int(x.numel()), "runs": runs,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
