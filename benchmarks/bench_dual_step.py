"""One dual-matching step against one training step of the same language model (issue #7; target ≤ 3× in
time and in peak memory), measured side by side.

Model: the GPT-NeoX pair shape of ``experiment transformer-wm`` (2 layers × 128, 4 heads, MLP 512, vocabulary
2,048, context 128), batch 32 blocks, random weights (the step cost does not depend on training). Each
measurement runs in its own subprocess so that its peak RSS (``ru_maxrss``) is its own:

- ``train``: ``--steps`` AdamW steps of ``fit``-equivalent work (forward, token cross-entropy, backward, step);
- ``dual``: ``--steps`` steps of :func:`modeconn.dual_matching` (absorbed models, the full group — orthogonal
  residual, head permutation, head-invertible QK/OV, FFN permutation — discrete parts from a precomputed
  weight matching, so only the learned steps are timed).

Seconds per step are the median over the steps after one warm-up step. Writes
``benchmarks/results/dual_step.json``. Usage::

    python benchmarks/bench_dual_step.py [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from _common import write_json

CFG = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512)
V, T, B = 2048, 128, 32


def _models():
    import torch

    from modeconn.models import build_model

    a = build_model("gpt-neox-tiny", in_shape=(T,), num_classes=V, seed=0, **CFG)
    b = build_model("gpt-neox-tiny", in_shape=(T,), num_classes=V, seed=1, **CFG)
    g = torch.Generator().manual_seed(0)
    batches = [(x, torch.roll(x, -1, 1)) for x in (torch.randint(0, V, (B, T), generator=g) for _ in range(4))]
    return a, b, batches


def run_train(steps: int) -> dict:
    import torch

    from modeconn.nn_utils import mean_cross_entropy

    a, _, batches = _models()
    opt = torch.optim.AdamW(a.parameters(), lr=1e-3)
    times = []
    for i in range(steps + 1):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        loss = mean_cross_entropy(a(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return {"seconds_per_step": statistics.median(times[1:])}


def run_dual(steps: int) -> dict:
    import modeconn as mc
    from modeconn.symmetry.hf import hf_symmetry_spec

    a, b, batches = _models()
    ma, mb = mc.absorb_normalization(a), mc.absorb_normalization(b)
    spec = hf_symmetry_spec(ma, groups={"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible",
                                        "vo": "head_invertible", "ffn": "permutation"})
    sa, sb = ma.state_dict(), mb.state_dict()
    wm = mc.weight_matching(spec, sa, sb)
    times = []
    last = [time.perf_counter()]

    def tick(*_):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    last[0] = time.perf_counter()
    mc.dual_matching(spec, ma, sa, sb, batches, steps=steps + 1, weight_alignment=wm, progress=tick)
    return {"seconds_per_step": statistics.median(times[1:]) if len(times) > 1 else float("nan"),
            "progress_calls": len(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--child", choices=["train", "dual"])
    args = ap.parse_args()
    if args.child:
        res = (run_train if args.child == "train" else run_dual)(args.steps)
        res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(res))
        return
    out = {}
    for kind in ("train", "dual"):
        p = subprocess.run([sys.executable, __file__, "--child", kind, "--steps", str(args.steps)],
                           capture_output=True, text=True, check=True)
        out[kind] = json.loads(p.stdout.strip().splitlines()[-1])
        print(kind, out[kind], flush=True)
    res = {**out, "time_ratio": out["dual"]["seconds_per_step"] / out["train"]["seconds_per_step"],
           "peak_rss_ratio": out["dual"]["peak_rss_mib"] / out["train"]["peak_rss_mib"], "target": 3.0,
           "model": CFG, "batch": [B, T], "vocab": V}
    print({k: v for k, v in res.items() if "ratio" in k})
    print(f"written {write_json('dual_step', res)}")


if __name__ == "__main__":
    main()
