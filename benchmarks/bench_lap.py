"""Linear assignment (LAP) solvers at the sizes weight matching meets (issues #8, #38), side by side on the same
scores, every answer checked against scipy's optimum.

Scores (maximised) per size n, weight-matching-like: ``S = W_A W_Bᵀ`` of two n × d unit matrices (d = min(n/4, 256)
inputs per unit: FFN units see d_model = n/4 inputs; capped to keep the products cheap on two cores), with

* ``planted``: ``W_B = P (0.7 W_A + 0.7 E)`` — B a permuted, perturbed copy of A (a strong diagonal after P);
* ``independent``: ``W_B = P (0.2 W_A + E)`` — two weakly related models, as trained pairs from independent
  initialisations are (the scores weight matching sees in its first sweep are this flat);
* ``uniform``: i.i.d. uniform scores (no structure; the hardest case for JV column reduction).

``--trained`` instead: the hidden-space scores of the trained 784→16384→10 MLP pair (``bench_sparse_lap.py``'s),
restricted to the first n units, and MiniLM's FFN scores (1536 units); batched: MiniLM's per-head scores.

Solvers: ``scipy`` (``linear_sum_assignment``), lapx's ``lapjvx``, ``lapjvs`` (fp64 kernel: ``prefer_float32=False``;
the fp32 kernel is not exact on fp64 scores), ``lapjvh`` and ``lapjvr`` (``--lapx``), modeconn's ``sparse`` certified
solver alone (steps 1–5 of :mod:`modeconn.match.lap`; failed certificates and dense fallbacks counted), ``today``:
the policy without the row-maxima exit, and ``policy``: :func:`modeconn.match.lap.solve_lap` with ``method="auto"``
as weight matching runs it. ``row_maxima``: the exit's own cost (one argmax pass and a count;
on scores where it does not answer, all the policy adds to the rule behind it). Sizes above ``--dense-max`` /
``--lapx-max`` skip those dense solvers (the sparse solver's certified optimum is then the reference). Batched:
``batch`` problems of n units at once (per-head spaces: 32 heads × head_dim): a scipy loop against lapx's batched
solvers.

Each solver's objective must equal scipy's to 1e-9 relative (``exact``). Timings are the best of ``--repeats``
on a shared 2-core machine (noisy; rerun before trusting a < 20% difference). Writes
``benchmarks/results/<--out>.json`` (default ``lap_solvers``). Usage::

    python benchmarks/bench_lap.py [--sizes 512 1024 2048 4096 8192] [--repeats 2] [--kinds planted independent]
    python benchmarks/bench_lap.py --trained --sizes 512 1024 2048 4096 8192 16384 --dense-max 4096 --out NAME
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from _common import write_json
from modeconn.match import lap as lap_module
from modeconn.match.lap import LapTimer, _sparse_certified, solve_lap


def scores(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "uniform":
        return rng.random((n, n))
    d = min(max(n // 4, 16), 256)
    a = rng.standard_normal((n, d))
    perm = rng.permutation(n)
    b = (0.7 * a + 0.7 * rng.standard_normal((n, d))) if kind == "planted" else (0.2 * a + rng.standard_normal((n, d)))
    return a @ b[perm].T


def _lapx(name: str):
    import lap

    fn = getattr(lap, name)
    extra = {"prefer_float32": False} if name == "lapjvs" else {}

    def solve(s: np.ndarray) -> np.ndarray:
        rows, cols = fn(-s, return_cost=False, **extra)
        perm = np.empty(len(rows), dtype=np.int64)
        perm[rows] = cols
        return perm

    return solve


def _sparse(s: np.ndarray, timer: LapTimer) -> np.ndarray:
    perm = _sparse_certified(torch.from_numpy(s), np.arange(len(s)), timer)
    timer.dense_fallbacks += perm is None
    return perm if perm is not None else linear_sum_assignment(s, maximize=True)[1]


def _policy(s: np.ndarray, timer: LapTimer) -> np.ndarray:
    return solve_lap(torch.from_numpy(s), "bench", timer, method="auto").numpy()


def _today(s: np.ndarray, timer: LapTimer) -> np.ndarray:
    row_maxima, lap_module._row_maxima = lap_module._row_maxima, lambda t: None
    try:
        return _policy(s, timer)
    finally:
        lap_module._row_maxima = row_maxima


LAPX = ("lapjvx", "lapjvs", "lapjvh", "lapjvr")


def solvers(n: int, dense_max: int, lapx_max: int, lapx: tuple[str, ...] = LAPX) -> dict:
    """The dense solvers run at size ``n``: scipy up to ``dense_max`` units, lapx's ``lapx`` up to ``lapx_max``."""
    out = {"scipy": lambda s: linear_sum_assignment(s, maximize=True)[1]} if n <= dense_max else {}
    try:
        import lap

        if n <= lapx_max:
            out.update({name: _lapx(name) for name in lapx if hasattr(lap, name)})
    except ImportError:
        print("lapx not installed: scipy and modeconn's solvers only")
    return out


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def synthetic_cases(sizes, kinds, rng):
    """``(kind, score)`` of every size and synthetic kind (module docstring)."""
    for n in sizes:
        for kind in kinds:
            yield kind, scores(kind, n, rng)


def trained_cases(sizes):
    """``(case, score)``: the hidden-space WM score of the trained 784→16384→10 MLP pair restricted to the first
    ``n`` units, per size (``bench_sparse_lap.py``'s pair and score, fp32 products read as fp64), then the FFN scores
    (1536 units) of the pretrained MiniLM, layer 2l against 2l+1."""
    from bench_sparse_lap import ffn_score, minilm_scores, trained_ffn_pair

    sd_a, sd_b = trained_ffn_pair()
    for n in sizes:
        yield "trained-ffn", ffn_score(sd_a, sd_b, n)
    yield from minilm_scores()


def single_rows(cases, repeats, dense_max: int, lapx_max: int, lapx: tuple[str, ...] = LAPX) -> list[dict]:
    """One row per ``(kind, score)``: every solver timed (best of ``repeats``) and checked against the reference
    optimum — scipy's where it runs (up to ``dense_max`` units), else the sparse solver's certified one."""
    rows = []
    for kind, s in cases:
        n = len(s)
        row, ref = {"n": n, "kind": kind}, None
        for name, fn in solvers(n, dense_max, lapx_max, lapx).items():
            row[f"{name}_seconds"], perm = timed(lambda fn=fn: fn(s), repeats if n <= 1536 else 1)
            obj = float(s[np.arange(n), perm].sum())
            ref = obj if ref is None else ref
            row[f"{name}_exact"] = abs(obj - ref) <= 1e-9 * abs(ref)
        for label, fn in (("sparse", _sparse), ("today", _today), ("policy", _policy)):
            timer = LapTimer()
            row[f"{label}_seconds"], perm = timed(lambda fn=fn, timer=timer: fn(s, timer), repeats)
            obj = float(s[np.arange(n), perm].sum())
            if ref is None:  # no dense solver at this size: the certified optimum is the reference
                ref, row["reference"] = obj, "sparse certified"
            row[f"{label}_exact"] = abs(obj - ref) <= 1e-9 * abs(ref)
            if label == "sparse":
                row["sparse_dense_fallbacks"] = timer.dense_fallbacks
                row["sparse_certificate_failures"] = timer.certificate_failures
        row["row_maxima_seconds"], exit_perm = timed(lambda: lap_module._row_maxima(torch.from_numpy(s)), repeats)
        row["row_maxima_answered"] = exit_perm is not None
        row["row_maxima_over_today"] = row["row_maxima_seconds"] / row["today_seconds"]
        timings = {k[:-8]: v for k, v in row.items()
                   if k.endswith("_seconds") and k not in ("policy_seconds", "today_seconds", "row_maxima_seconds")}
        row["fastest"] = min(timings, key=timings.get)
        row["policy_over_today"] = row["policy_seconds"] / row["today_seconds"]
        rows.append(row)
        print(row, flush=True)
    return rows


def synthetic_batches(batch: int, sizes, rng):
    """``(kind, scores)``: ``batch`` independent-pair scores of ``n`` units per size (per-head spaces)."""
    for n in sizes:
        yield "independent", np.stack([scores("independent", n, rng) for _ in range(batch)])


def minilm_head_batch():
    """``("minilm heads", scores)``: the per-head scores of the pretrained MiniLM's 12 heads × 32 dims, layer 2l
    against 2l+1 (l = 0, 1, 2: 36 problems), ``Q_A,h Q_B,hᵀ + K_A,h K_B,hᵀ`` (the head's q·k rows)."""
    import os
    from pathlib import Path

    from safetensors.torch import load_file

    sd = load_file(Path(os.environ.get("MODECONN_DATA", "")) / "minilm" / "model.safetensors")

    def heads(layer: int, part: str) -> torch.Tensor:
        return sd[f"encoder.layer.{layer}.attention.self.{part}.weight"].reshape(12, 32, -1)

    out = [heads(la, p) @ heads(la + 1, p).transpose(1, 2) for la in (0, 2, 4) for p in ("query", "key")]
    return "minilm heads", torch.cat([a + b for a, b in zip(out[::2], out[1::2], strict=True)]).double().numpy()


def batch_rows(batches, repeats) -> list[dict]:
    rows = []
    try:
        import lap
    except ImportError:
        return rows
    for kind, s in batches:
        batch, n = s.shape[:2]
        row = {"kind": kind, "batch": batch, "n": n}
        row["scipy_loop_seconds"], ref = timed(
            lambda: [linear_sum_assignment(x, maximize=True)[1] for x in s], repeats)
        objective = float(sum(x[np.arange(n), p].sum() for x, p in zip(s, ref, strict=True)))
        for name in ("lapjvx_batch", "lapjvs_batch", "lapjvh_batch", "lapjvr_batch"):
            fn = getattr(lap, name, None)
            if fn is None:
                continue
            extra = {"prefer_float32": False} if name == "lapjvs_batch" else {}
            row[f"{name}_seconds"], (rs, cs) = timed(lambda fn=fn, extra=extra: fn(-s, return_cost=False, **extra),
                                                     repeats)
            obj = float(sum(x[r, c].sum() for x, r, c in zip(s, rs, cs, strict=True)))
            row[f"{name}_exact"] = abs(obj - objective) <= 1e-9 * abs(objective)
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--kinds", nargs="+", default=["planted", "independent", "uniform"])
    ap.add_argument("--trained", action="store_true",
                    help="trained scores instead (the trained FFN pair per size, MiniLM's FFN and heads)")
    ap.add_argument("--dense-max", type=int, default=16384, help="largest size scipy's dense solver runs at")
    ap.add_argument("--lapx-max", type=int, default=16384, help="largest size lapx's dense solvers run at")
    ap.add_argument("--lapx", nargs="+", default=list(LAPX), help="lapx's solvers to run")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="lap_solvers")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cases = trained_cases(args.sizes) if args.trained else synthetic_cases(args.sizes, args.kinds, rng)
    rows = single_rows(cases, args.repeats, args.dense_max, args.lapx_max, tuple(args.lapx))
    batches = list(synthetic_batches(args.batch, args.batch_sizes, rng))
    batched = batch_rows([*batches, minilm_head_batch()] if args.trained else batches, args.repeats)
    try:
        import lap

        lapx = lap.__version__
    except ImportError:
        lapx = None
    path = write_json(args.out, {"lapx": lapx, "threads_note": "2 shared cores; other jobs running",
                                 "rows": rows, "batched": batched})
    print(f"written {path}")


if __name__ == "__main__":
    main()
