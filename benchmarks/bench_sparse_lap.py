"""Exact LAP on weight-matching scores of trained FFN weights: the sparse candidate solver with its dual certificate
(:mod:`modeconn.match.lap`, ``method="sparse"``) against scipy's dense ``linear_sum_assignment``, side by side on
the same matrices (issue #20).

Scores: two single-hidden-layer MLPs (784 → 16384 → 10, ReLU, seeds 0 and 1) trained with modeconn's training API
(AdamW, lr 1e-3, one epoch on the first 10,000 MNIST training images; cached in ``benchmarks/cache/``). The LAP of
the hidden space in weight matching has the score ``S = W1_A W1_Bᵀ + b1_A b1_Bᵀ + W2_Aᵀ W2_B`` (fp32 products; the
dense solver gets their exact fp64 copy, the sparse one the fp32 tensor, as in weight matching). For n < 16384 the
first n hidden units of each model are used. Both solvers must reach the same objective (relative difference
reported; the sparse solver's answer is certified optimal, so any difference is fp64 rounding); certificate
failures and dense fallbacks are reported.

``--minilm``: instead, the FFN spaces (1536 units) of the pretrained all-MiniLM-L6-v2 in ``$MODECONN_DATA/minilm``,
layer 2l of the model as A against layer 2l+1 as B (real pretrained structure, below the sparse solver's threshold).

Writes ``benchmarks/results/<name>.json`` (default ``sparse_lap``). Usage::

    python benchmarks/bench_sparse_lap.py [--sizes 2048 8192 16384] [--repeats 3] [--dense-repeats 1] [--name N]
    python benchmarks/bench_sparse_lap.py --minilm --name sparse_lap_minilm
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from modeconn.match.lap import SPARSE_MIN_N, TOP_K, LapTimer, solve_lap

from _common import write_json

CACHE = Path(__file__).resolve().parent / "cache"
WIDTH = 16384


def trained_ffn_pair() -> list[dict[str, torch.Tensor]]:
    """State dicts of the two trained 784 → 16384 → 10 MLPs (trained once, then read from the cache)."""
    from modeconn.data import load_dataset
    from modeconn.experiments.training import train_models
    from modeconn.io import load_state_dict, save_state_dict

    files = [CACHE / f"ffn{WIDTH}_seed{s}.safetensors" for s in (0, 1)]
    if all(f.exists() for f in files):
        return [load_state_dict(f) for f in files]
    bundle = load_dataset("mnist", os.environ.get("MODECONN_DATA"), limit_train=10_000)
    models = train_models("mlp", bundle, [0, 1], dict(optimizer="adamw", lr=1e-3, weight_decay=0.0, epochs=1,
                                                       batch_size=128), depth=1, width=WIDTH, log=print)
    CACHE.mkdir(exist_ok=True)
    for m, f in zip(models, files, strict=True):
        save_state_dict(f, m.state_dict())
    return [m.state_dict() for m in models]


def ffn_score(sd_a: dict, sd_b: dict, n: int) -> np.ndarray:
    """The hidden space's weight-matching score restricted to the first ``n`` units: fp32 products (as in weight
    matching), returned as fp64 (exact), C order."""
    w1a, w1b = sd_a["blocks.0.linear.weight"][:n], sd_b["blocks.0.linear.weight"][:n]
    b1a, b1b = sd_a["blocks.0.linear.bias"][:n], sd_b["blocks.0.linear.bias"][:n]
    w2a, w2b = sd_a["head.weight"][:, :n], sd_b["head.weight"][:, :n]
    s = w1a @ w1b.T + torch.outer(b1a, b1b) + w2a.T @ w2b
    return s.double().numpy()


def minilm_scores() -> list[tuple[str, np.ndarray]]:
    """WM scores of the FFN space between consecutive layers (0/1, 2/3, 4/5) of the pretrained MiniLM."""
    from safetensors.torch import load_file

    sd = load_file(Path(os.environ.get("MODECONN_DATA", "")) / "minilm" / "model.safetensors")
    pre = "encoder.layer.{}."

    def ffn(layer: int):
        p = pre.format(layer)
        return sd[p + "intermediate.dense.weight"], sd[p + "intermediate.dense.bias"], sd[p + "output.dense.weight"]

    out = []
    for la in (0, 2, 4):
        (ua, ba, da), (ub, bb, db) = ffn(la), ffn(la + 1)
        out.append((f"minilm layer {la} vs {la + 1}", (ua @ ub.T + torch.outer(ba, bb) + da.T @ db).double().numpy()))
    return out


def dense(s: np.ndarray) -> np.ndarray:
    np.negative(s, out=s)  # in place (no n×n copy), restored below
    try:
        return linear_sum_assignment(s)[1]
    finally:
        np.negative(s, out=s)


def bench_case(label: str, s: np.ndarray, args) -> dict:
    """Dense and sparse solves of the fp64 score ``s`` (the sparse solver reads its fp32 copy, exact)."""
    n = len(s)
    s32 = torch.from_numpy(s).float()  # the fp32 score weight matching hands to solve_lap (exact in fp64)
    s = s32.double().numpy()  # the same values for the dense solver (MiniLM's products are fp32 already)
    idx = np.arange(n)
    t_dense = []
    for _ in range(args.dense_repeats or (3 if n <= 2048 else 2 if n <= 8192 else 1)):
        t0 = time.perf_counter()
        perm_d = dense(s)
        t_dense.append(time.perf_counter() - t0)
    obj_d = float(s[idx, perm_d].sum())
    t_sparse, timers = [], []
    for _ in range(args.repeats):
        timer = LapTimer()
        t0 = time.perf_counter()
        perm_s = solve_lap(s32, "ffn", timer, method="sparse").numpy()
        t_sparse.append(time.perf_counter() - t0)
        timers.append(timer.stats())
    obj_s = float(s[idx, perm_s].sum())
    row = {
        "case": label, "n": n, "dense_seconds": t_dense, "sparse_seconds": t_sparse,
        "dense_median": float(np.median(t_dense)), "sparse_median": float(np.median(t_sparse)),
        "speedup": float(np.median(t_dense) / np.median(t_sparse)),
        "dense_objective": obj_d, "sparse_objective": obj_s,
        "objective_rel_diff": abs(obj_s - obj_d) / abs(obj_d), "same_permutation": bool((perm_s == perm_d).all()),
        "certificate_failures": timers[-1]["lap_certificate_failures"],
        "dense_fallbacks": timers[-1]["lap_dense_fallbacks"],
    }
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 8192, 16384])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dense-repeats", type=int, default=None,
                    help="dense solves per size (default: 3 up to 2048 units, 2 up to 8192, 1 above — ~100 s each at 16k)")
    ap.add_argument("--minilm", action="store_true", help="pretrained MiniLM FFN scores instead (1536 units)")
    ap.add_argument("--name", default="sparse_lap", help="results file name (without .json)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.minilm:
        cases = minilm_scores()
    else:
        sd_a, sd_b = trained_ffn_pair()
        cases = ((f"trained ffn, first {n} units", ffn_score(sd_a, sd_b, n)) for n in args.sizes)  # one at a time
    rows = [bench_case(label, s, args) for label, s in cases]
    scores = "MiniLM FFN, layer 2l vs 2l+1" if args.minilm else "trained 784-16384-10 MLP pair (MNIST), hidden-space WM score"
    path = write_json(args.name, {"rows": rows, "top_k": TOP_K, "sparse_min_n": SPARSE_MIN_N, "scores": scores})
    print(f"written {path}")


if __name__ == "__main__":
    main()
