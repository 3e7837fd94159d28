"""Throughput of ``modeconn.train.fit`` against a plain hand-written PyTorch training loop.

Both runs use the same model (a fresh copy of the same initial weights), the same random data, the same
optimizer (SGD, momentum 0.9, weight decay 5e-4), the same batch size and the same number of steps
(one epoch). The plain loop is the minimal loop — shuffled index batches, forward, cross-entropy,
zero_grad, backward, step — with no scheduler, no metrics and no progress bar, so the ratio measures all
of fit's bookkeeping (LR schedule, on-device loss/accuracy accumulation, per-epoch sync). Runs are
interleaved (alternating order) after one untimed warm-up of each, and the median of the repeats is reported,
together with the median of the per-pair ratios (robust when other processes share the CPU).

Writes ``benchmarks/results/train_throughput.json`` atomically and prints it. Usage::

    python benchmarks/bench_train.py [--repeats 7] [--budget-seconds 90] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from modeconn.models import build_model
from modeconn.train import TrainConfig, fit
from torch.utils.data import TensorDataset

RESULTS = Path(__file__).resolve().parent / "results" / "train_throughput.json"


def plain_loop(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig) -> None:
    """The baseline: one epoch of a minimal hand-written loop with the same data order as fit."""
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(cfg.seed))
    model.train()
    for start in range(0, x.shape[0], cfg.batch_size):
        idx = order[start : start + cfg.batch_size]
        out = model(x[idx])
        loss = F.cross_entropy(out, y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_case(
    name: str, arch: str, kwargs: dict, n: int, batch_size: int, repeats: int, budget_s: float, min_repeats: int = 3
) -> dict:
    in_shape = kwargs["in_shape"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, *in_shape, generator=gen)
    y = torch.randint(0, kwargs["num_classes"], (n,), generator=gen)
    data = TensorDataset(x, y)
    cfg = TrainConfig(epochs=1, batch_size=batch_size, lr=0.01, momentum=0.9, weight_decay=5e-4, seed=0)
    init = build_model(arch, seed=0, **kwargs)

    def run_fit() -> None:
        fit(copy.deepcopy(init), data, cfg, progress=False)

    def run_plain() -> None:
        plain_loop(copy.deepcopy(init), x, y, cfg)

    start = time.perf_counter()
    run_plain(), run_fit()  # warm-up (allocator, kernels)
    t_fit, t_plain = [], []
    for r in range(repeats):
        if r >= min_repeats and time.perf_counter() - start > budget_s:
            break  # keep the whole benchmark short on a loaded machine
        pair = [("plain", run_plain), ("fit", run_fit)]
        if r % 2:
            pair.reverse()
        for label, fn in pair:
            (t_fit if label == "fit" else t_plain).append(timed(fn))
    sps_fit = [n / t for t in t_fit]
    sps_plain = [n / t for t in t_plain]
    med_fit, med_plain = statistics.median(sps_fit), statistics.median(sps_plain)
    return {
        "case": name,
        "architecture": arch,
        "kwargs": {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()},
        "num_params": sum(p.numel() for p in init.parameters()),
        "examples": n,
        "batch_size": batch_size,
        "steps": cfg.steps_per_epoch(n),
        "repeats": len(t_fit),
        "fit_samples_per_second": med_fit,
        "plain_samples_per_second": med_plain,
        "ratio_fit_over_plain": med_fit / med_plain,
        # per interleaved pair (fit and plain ran back to back): robust to slow drifts of machine speed
        "ratio_median_of_pairs": statistics.median(tp / tf for tf, tp in zip(t_fit, t_plain)),
        "fit_samples_per_second_all": sps_fit,
        "plain_samples_per_second_all": sps_plain,
    }


def write_json_atomic(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="fewer examples (smoke run)")
    parser.add_argument(
        "--budget-seconds", type=float, default=90.0, help="stop repeating (after 3 repeats) once spent, split per case"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    scale = 4 if args.quick else 1
    cases = [
        ("mlp_3x512_mnist", "mlp", {"in_shape": (1, 28, 28), "num_classes": 10, "depth": 3, "width": 512}, 8192 // scale, 128),
        ("resnet20_w0.5_cifar", "resnet20", {"in_shape": (3, 32, 32), "num_classes": 10, "width": 0.5}, 1024 // scale, 128),
    ]
    t0 = time.perf_counter()
    budget = args.budget_seconds / len(cases)
    results = [bench_case(name, arch, kw, n, bs, args.repeats, budget) for name, arch, kw, n, bs in cases]
    report = {
        "benchmark": "modeconn.train.fit vs plain PyTorch loop (one epoch, SGD, same steps)",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "wall_seconds": time.perf_counter() - t0,
        "cases": results,
    }
    write_json_atomic(args.out, report)
    print(json.dumps(report, indent=2))
    for r in results:
        print(
            f"{r['case']:<24} fit {r['fit_samples_per_second']:9.0f} samples/s   "
            f"plain {r['plain_samples_per_second']:9.0f} samples/s   ratio {r['ratio_fit_over_plain']:.3f} "
            f"(median of pairs {r['ratio_median_of_pairs']:.3f})"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
