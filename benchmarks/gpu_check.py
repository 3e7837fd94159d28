"""What ``--device`` buys on an accelerator (issues #20 item 4, #38 item 4): score products, LAP solvers, merge
arithmetic, and the whole aligned merge.

Runs in under 5 minutes on one GPU (``--device cuda``), and on the CPU (``--device cpu --quick``) so that it is known
to work before it meets a GPU. Three measurements, each on the device and on the host, side by side:

1. *Score products* — weight matching's (n, n) score ``Σ A_k B_kᵀ`` of a streamed space: fp16 unit matrices (n, m)
   read on the host, copied chunk by chunk and accumulated in fp32 on the device (what
   :class:`modeconn.match.weight_stream._Stream` does with ``device=``), against the host path (accumulated in fp32 inside the
   fp64 buffer). Agreement: max relative difference of the two scores.
2. *LAP solvers* — on weight-matching-like scores (B = a permutation of A plus noise, so a planted optimum): scipy's
   dense solver vs the sparse certified solver of :mod:`modeconn.match.lap`, both on the score copied to the host;
   many small per-head problems (``batch`` × (h, h)) by a scipy loop, lapx's batched CPU solvers ``lapjvx_batch`` /
   ``lapjvs_batch`` (fp64) where lapx is installed, and the batched GPU solver ``torch_linear_assignment`` where that
   is — the measurement :data:`modeconn.match.lap.LAP_POLICIES` waits for before it chooses a batched solver.
   Every solver's objective is compared with scipy's; the solver the policy picks
   (:func:`modeconn.match.lap.lap_method`) is reported next to the fastest one measured.
3. *Merge arithmetic* — :func:`modeconn.stream._merge_one` (the linear rule, fp16 in and out, fp32 accumulation) on
   the device (host→device→host copies included) vs on the host; the results must be equal bit for bit.
4. *The aligned merge* — ``modeconn merge A B --align weight --device DEVICE`` and the same with ``--device cpu``, each a
   fresh process (wall, CPU seconds, peak RSS), on a Llama-2-7B-shaped pair where B is a permuted, perturbed copy of
   A (``_pairs.py``; ``--merge-scale``/``--merge-layers`` shrink it: the defaults take a few minutes, ``--merge-scale
   1 --merge-layers 32`` is the 7B pair of ``bench_7b.py``, 27 GB on disk); the recovered fraction of the planted
   permutation and the largest difference between the two merges.

Writes ``benchmarks/results/gpu_check.json`` (``gpu_check_cpu.json`` for ``--device cpu``). Usage::

    python benchmarks/gpu_check.py --device cuda          # on a GPU machine (≤ 5 min)
    python benchmarks/gpu_check.py --device cuda --merge-scale 1 --merge-layers 32 --tmp /big/disk   # the 7B merge
    python benchmarks/gpu_check.py --device cpu --quick   # anywhere (about a minute on 2 cores)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import write_json
from _pairs import llama_config, recovered, write_pair
from bench_stream_io import timed
from scipy.optimize import linear_sum_assignment

from modeconn._util.device import resolve_device
from modeconn.match import lap as lap_module
from modeconn.match.lap import SPARSE_MIN_N, LapTimer, lap_method, solve_lap
from modeconn.stream import _merge_one

SIZES = {"full": {"score": [(1024, 16384), (4096, 16384), (8192, 16384)], "lap": [512, 2048, 8192],
                  "heads": (256, 64), "merge": [1 << 24, 1 << 26], "pair": (0.25, 4)},
         "quick": {"score": [(256, 4096), (1024, 4096)], "lap": [256, 1024, 2048],
                   "heads": (32, 32), "merge": [1 << 20, 1 << 22], "pair": (0.02, 2)}}
"""Problem sizes: score (n units, m entries per unit), LAP n, per-head (batch, h), merge numel per tensor, the
aligned merge's pair (``scale``, ``layers`` of :func:`_pairs.llama_config`)."""
CHUNK = 1 << 20


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_of(fn, device: torch.device, repeats: int = 3) -> float:
    """The fastest of ``repeats`` timed calls (seconds) after one warm-up, device work included."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return min(times)


# ------------------------------------------------------------------------------------------------- products
def score_on(a: torch.Tensor, b: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    """Σ over row chunks-of-columns of ``a_c b_cᵀ`` in fp32 — on ``device`` (chunks copied there) or the host."""
    n, m = a.shape
    step = max(1, CHUNK // n)
    acc = torch.zeros(n, n, dtype=torch.float32, device=device or "cpu")
    for i in range(0, m, step):
        x, y = a[:, i:i + step].float(), b[:, i:i + step].float()
        if device is not None:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        acc.addmm_(x, y.T)
    return acc.double()


def products(device: torch.device, sizes) -> list[dict]:
    out = []
    for n, m in sizes:
        g = torch.Generator().manual_seed(n)
        a = torch.randn(n, m, generator=g).half()
        b = (a[torch.randperm(n, generator=g)].float() + 0.1 * torch.randn(n, m, generator=g)).half()
        host, dev = score_on(a, b, None), score_on(a, b, device)
        rel = float((host - dev.cpu()).abs().max() / host.abs().max())
        row = {"n": n, "m": m, "host_seconds": best_of(lambda: score_on(a, b, None), torch.device("cpu"), 2),
               "device_seconds": best_of(lambda: score_on(a, b, device), device, 2), "max_rel_difference": rel}
        row["speedup"] = row["host_seconds"] / row["device_seconds"]
        print(f"score n={n} m={m}: host {row['host_seconds']:.3f} s, {device} {row['device_seconds']:.3f} s "
              f"(×{row['speedup']:.1f}), rel diff {rel:.1e}", flush=True)
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------------------ LAP
def planted_score(n: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """A weight-matching-like (n, n) score computed on ``device``: A·(PA + noise)ᵀ of (n, 4n) Gaussian units."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, 4 * n if n <= 2048 else 1024, generator=g)
    b = a[torch.randperm(n, generator=g)] + torch.randn(a.shape, generator=g)
    a, b = a.to(device), b.to(device)
    return (a @ b.T).double()


def objective(score: np.ndarray, perm: np.ndarray) -> float:
    return float(score[np.arange(len(perm)), perm].sum())


@contextlib.contextmanager
def without_row_maxima():
    """:func:`solve_lap` without its row-maxima exit, so that the solvers themselves are timed."""
    saved, lap_module._row_maxima = lap_module._row_maxima, lambda t: None
    try:
        yield
    finally:
        lap_module._row_maxima = saved


def lap_sizes(device: torch.device, sizes) -> list[dict]:
    out = []
    for n in sizes:
        s = planted_score(n, device)
        host = s.cpu().numpy()
        row: dict = {"n": n, "policy": lap_method(device, n)}
        ref = None
        for method in ("dense", "sparse"):
            timer = LapTimer()
            t = time.perf_counter()
            with without_row_maxima():  # the solver itself (these planted scores would take the row-maxima exit)
                perm = solve_lap(s, f"n{n}", timer, method=method).numpy()  # the device score is copied to the host
            row[f"{method}_seconds"] = time.perf_counter() - t
            val = objective(host, perm)
            ref = val if ref is None else ref
            row[f"{method}_objective_minus_dense"] = val - ref
            if method == "sparse":
                row["sparse_certificate_failures"] = timer.certificate_failures
                row["sparse_dense_fallbacks"] = timer.dense_fallbacks
        row["fastest"] = min(("dense", "sparse"), key=lambda k: row[f"{k}_seconds"])
        t = time.perf_counter()
        row["policy_objective_minus_dense"] = objective(host, solve_lap(s, f"n{n}", method=row["policy"]).numpy()) - ref
        row["policy_seconds_with_row_maxima_exit"] = time.perf_counter() - t
        print(f"LAP n={n}: dense {row['dense_seconds']:.3f} s, sparse {row['sparse_seconds']:.3f} s; policy "
              f"{row['policy']}, fastest {row['fastest']}", flush=True)
        out.append(row)
    return out


def effective(method: str, n: int) -> str:
    """The solver ``solve_lap(method=...)`` runs for n units (``auto`` resolved)."""
    return ("sparse" if n >= SPARSE_MIN_N else "dense") if method == "auto" else method


def per_head(device: torch.device, batch: int, h: int) -> dict:
    """``batch`` small (h, h) problems: a scipy loop vs the batched GPU solver when installed."""
    scores = torch.stack([planted_score(h, device, seed=i) for i in range(batch)])
    host = scores.cpu().numpy()
    t = time.perf_counter()
    perms = np.stack([linear_sum_assignment(-x)[1] for x in host])
    row = {"batch": batch, "h": h, "scipy_loop_seconds": time.perf_counter() - t,
           "policy": lap_method(device, h, batch)}
    if importlib.util.find_spec("lap") is not None:
        import lap

        for name in ("lapjvx_batch", "lapjvs_batch"):
            fn = getattr(lap, name, None)
            if fn is None:
                continue
            extra = {"prefer_float32": False} if name == "lapjvs_batch" else {}
            t = time.perf_counter()
            _, cols = fn(-host, return_cost=False, **extra)
            row[f"{name}_seconds"] = time.perf_counter() - t
            row[f"{name}_objective_minus_scipy"] = sum(objective(x, np.asarray(c)) - objective(x, q)
                                                       for x, c, q in zip(host, cols, perms, strict=True))
    if importlib.util.find_spec("torch_linear_assignment") is None or device.type != "cuda":
        row["batched_gpu_solver"] = "torch_linear_assignment not installed" if device.type == "cuda" else \
            "needs a CUDA device"
    else:
        from torch_linear_assignment import batch_linear_assignment

        cost = (-scores).float().contiguous()
        row["batched_gpu_seconds"] = best_of(lambda: batch_linear_assignment(cost), device)
        got = batch_linear_assignment(cost).cpu().numpy()
        row["batched_objective_minus_scipy"] = sum(objective(x, p) - objective(x, q)
                                                   for x, p, q in zip(host, got, perms, strict=True))
    print(f"per-head {batch}×({h}×{h}): {row}", flush=True)
    return row


# ---------------------------------------------------------------------------------------------------- merge
def merge_arithmetic(device: torch.device, sizes) -> list[dict]:
    out = []
    kw = dict(names=["a", "b"], weights=[0.5, 0.5], rule="linear", settings=None, dtype=None, out_dtype=None)
    for numel in sizes:
        g = torch.Generator().manual_seed(numel % 1000)
        xs = [torch.randn(numel, generator=g).half() for _ in range(2)]
        host = _merge_one("w", xs, device=None, **kw)
        dev = _merge_one("w", xs, device=device, **kw).cpu()
        row = {"numel": numel, "bytes_in": 2 * 2 * numel,
               "host_seconds": best_of(lambda: _merge_one("w", xs, device=None, **kw), torch.device("cpu")),
               "device_seconds_with_copies": best_of(lambda: _merge_one("w", xs, device=device, **kw).cpu(), device),
               "bit_identical": bool(torch.equal(host, dev))}
        on = [x.to(device) for x in xs]
        row["device_seconds_compute_only"] = best_of(lambda: _merge_one("w", on, device=device, **kw), device)
        print(f"merge {numel:,} elements: host {row['host_seconds']:.3f} s, {device} with copies "
              f"{row['device_seconds_with_copies']:.3f} s, compute only {row['device_seconds_compute_only']:.4f} s, "
              f"identical {row['bit_identical']}", flush=True)
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------- whole merge
def aligned_merge(device: torch.device, scale: float, layers: int, tmp: str) -> dict:
    """``modeconn merge A B --align weight`` with ``--device`` ``device`` and ``cpu`` on a planted pair (item 4)."""
    work = Path(tempfile.mkdtemp(prefix="gpu_check_merge.", dir=tmp))
    try:
        t = time.perf_counter()
        pair = write_pair(work, llama_config(scale, layers))
        row: dict = {"scale": scale, "layers": layers, "pair": pair, "write_seconds": time.perf_counter() - t}
        devices = [str(device)] if device.type == "cpu" else [str(device), "cpu"]
        for dev in devices:
            out = work / f"merged_{dev.replace(':', '_')}"
            argv = [sys.executable, "-m", "modeconn", "merge", str(work / "a"), str(work / "b"), "--align", "weight",
                    "--device", dev, "--out", str(out)]
            run = timed(argv, out)
            (al,) = json.loads((out / "merge.json").read_text())["alignments"]
            run.update(objective=al["objective"], lap_seconds=al["stats"]["lap_seconds"],
                       recovered=recovered(out, work / "a"))
            row[dev] = run
            print(f"merge --align weight --device {dev}: {run['wall_seconds']:.1f} s, peak RSS "
                  f"{run['peak_rss_bytes'] / 2**30:.2f} GiB, recovered {run['recovered']['min_fraction']:.3f}", flush=True)
        if len(devices) == 2:
            from modeconn.io.lazy import LazyCheckpoint

            x, y = (LazyCheckpoint(work / f"merged_{d.replace(':', '_')}") for d in devices)
            row["max_abs_difference"] = max(float((x[k].float() - y[k].float()).abs().max()) for k in x)
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", help="the accelerator to measure (cpu: the code paths, as a check)")
    ap.add_argument("--quick", action="store_true", help="small sizes (for a CPU run)")
    ap.add_argument("--merge-scale", type=float, help="width scale of the merged pair (1: Llama-2-7B)")
    ap.add_argument("--merge-layers", type=int, help="decoder layers of the merged pair (32: Llama-2-7B)")
    ap.add_argument("--tmp", default="/tmp", help="where the merged pair is written (and deleted afterwards)")
    args = ap.parse_args()
    device = resolve_device(args.device, "--device")
    sizes = SIZES["quick" if args.quick else "full"]
    start = time.perf_counter()
    res = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "sizes": "quick" if args.quick else "full", "score_products": products(device, sizes["score"]),
           "lap": lap_sizes(device, sizes["lap"]), "per_head_lap": per_head(device, *sizes["heads"]),
           "merge_arithmetic": merge_arithmetic(device, sizes["merge"])}
    scale, layers = sizes["pair"]
    res["aligned_merge"] = aligned_merge(device, args.merge_scale or scale, args.merge_layers or layers, args.tmp)
    res["seconds"] = time.perf_counter() - start
    res["policy_picked_the_fastest"] = {r["n"]: effective(r["policy"], r["n"]) == r["fastest"] for r in res["lap"]}
    name = "gpu_check" if device.type != "cpu" else "gpu_check_cpu"
    print(f"{res['seconds']:.0f} s; written {write_json(name, res)}")


if __name__ == "__main__":
    main()
