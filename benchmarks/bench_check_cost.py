"""Cost of ``modeconn check A B`` against ``modeconn barrier A B`` on the same pair, both through the command line
(issue #19; acceptance: check ≤ 20 % of barrier).

The pair is the README's first-steps pair: two MLPs (3 × 512) trained 2 epochs on MNIST with seeds 0 and 1
(``modeconn train``, skipped when the checkpoints exist). Each command runs as its own process (import, loading,
data and the work, i.e. what a user waits for), ``--repeats`` times, alternating; the medians are compared.
``barrier`` runs with its defaults (naive, weight and activation matching, 25 λ, every train and test example) and
again with ``--eval-limit`` (the README uses 2000); ``check`` with its defaults.

Writes ``benchmarks/results/check_cost.json``. Usage::

    python benchmarks/bench_check_cost.py [--ckpt DIR] [--eval-limit 2000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import write_json

CLI = [sys.executable, "-m", "modeconn"]


def run(args: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(CLI + args, check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", type=Path, default=Path("ckpt-check-cost"))
    ap.add_argument("--eval-limit", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    for seed, name in ((0, "a"), (1, "b")):
        if not (a.ckpt / name / "config.json").exists():
            run(["train", "--out", str(a.ckpt / name), "--dataset", "mnist", "--seed", str(seed), "--epochs", "2",
                 "-m", "width=512", "-m", "depth=3"])
    pair = [str(a.ckpt / "a"), str(a.ckpt / "b")]
    limited = f"barrier --eval-limit {a.eval_limit}"
    times: dict[str, list[float]] = {"check": [], "barrier": [], limited: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            times["check"].append(run(["check", *pair, "--out", f"{tmp}/check{r}"]))
            times["barrier"].append(run(["barrier", *pair, "--out", f"{tmp}/barrier{r}"]))
            times[limited].append(run(["barrier", *pair, "--eval-limit", str(a.eval_limit), "--out", f"{tmp}/lim{r}"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = {k: med["check"] / med[k] for k in ("barrier", limited)}
    out = write_json("check_cost", {"pair": "MNIST MLP 3×512, 2 epochs, seeds 0 / 1", "seconds": times,
                                    "median_seconds": med, "ratio_check_to": ratios})
    print(f"median seconds {med}, check / barrier {ratios} -> {out}")


if __name__ == "__main__":
    main()
