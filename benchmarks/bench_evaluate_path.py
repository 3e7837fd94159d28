"""Overhead of ``modeconn.evaluate_path`` (25 λ, BatchNorm reset) against the bare forward passes it needs
(issue #8; target ratio ≤ 1.2).

The bare loop does exactly the same work by hand: for each λ, θ(λ) = (1−λ)θ_A + λθ_B loaded into one model,
BatchNorm statistics reset and re-estimated with ``momentum=None`` over the same training batches (interior λ
only, as evaluate_path does), then an eval-mode pass over the test batches accumulating summed
cross-entropy and correct counts. Same model (ResNet20×0.5 with BatchNorm), same data (Fashion-MNIST, 1,000
test images, 10 BN batches of 128), same thread count; runs interleaved after a warm-up, median of repeats.

Writes ``benchmarks/results/evaluate_path_overhead.json``. Usage::

    python benchmarks/bench_evaluate_path.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from _common import write_json
from modeconn.data import load_dataset, make_loader
from modeconn.models import build_model
from modeconn.path import evaluate_path


def bare(model, sd_a, sd_b, test_batches, bn_batches, lambdas):
    out = []
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for lam in lambdas:
            sd = {k: (torch.lerp(v.float(), sd_b[k].float(), lam) if v.is_floating_point() else v) for k, v in sd_a.items()}
            model.load_state_dict(sd)
            if 0 < lam < 1:
                for m in bns:
                    m.reset_running_stats()
                    m.momentum = None
                model.train()
                for x in bn_batches:
                    model(x)
            model.eval()
            loss, correct, n = 0.0, 0, 0
            for x, y in test_batches:
                logits = model(x)
                loss += F.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(1) == y).sum().item()
                n += len(y)
            out.append((loss / n, correct / n))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    bundle = load_dataset("fashion-mnist", limit_train=2000)
    test = torch.utils.data.Subset(bundle.test, range(1000))
    mk = lambda s: build_model("resnet20", in_shape=bundle.input_shape, num_classes=10, seed=s, width=0.5)  # noqa: E731
    model, sd_a, sd_b = mk(0), mk(0).state_dict(), mk(1).state_dict()
    test_loader = make_loader(test, 500)
    bn_loader = make_loader(bundle.train, 128, shuffle=True, seed=0)
    test_batches = list(test_loader)
    bn_batches = [x for i, (x, _) in zip(range(10), bn_loader)]  # both sides use exactly these batches
    lambdas = [i / 24 for i in range(25)]

    def run_lib():
        return evaluate_path(model, sd_a, sd_b, test_loader, lambdas=25, bn="reset", bn_loader=[(x,) for x in bn_batches])

    def run_bare():
        return bare(mk(0), sd_a, sd_b, test_batches, bn_batches, lambdas)

    curve, ref = run_lib(), run_bare()  # warm-up, and the two must agree
    max_diff = max(abs(a - b[0]) for a, b in zip(curve.values("eval", "loss"), ref))
    lib_t, bare_t = [], []
    for i in range(args.repeats):
        for name, fn, acc in (("lib", run_lib, lib_t), ("bare", run_bare, bare_t))[:: 1 if i % 2 == 0 else -1]:
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    res = {"evaluate_path_seconds": statistics.median(lib_t), "bare_seconds": statistics.median(bare_t),
           "ratio": statistics.median(lib_t) / statistics.median(bare_t),
           "ratio_of_fastest": min(lib_t) / min(bare_t), "max_loss_difference": max_diff,
           "lib_runs": lib_t, "bare_runs": bare_t, "target": 1.2}
    print(res)
    print(f"written {write_json('evaluate_path_overhead', res)}")


if __name__ == "__main__":
    main()
