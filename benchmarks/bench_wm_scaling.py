"""How weight-matching time grows with width and depth (issue #8): fitted power-law exponents.

MLPs at initialisation (two seeds), one coordinate-descent run (``restarts=1``, greedy start) per pair:
width 64·{1, 2, 4, 8, 16} at depth 3, and depth {2, 4, 8, 16} at width 256. For each series the median of
``--repeats`` timings is fitted as t ∝ x^k on log–log axes (k reported with the LAP share of the time).
Expected: LAP cost O(n³) per space and cost-matrix products O(n²·fan) → k between 2 and 3 in width; linear
in depth at fixed width (plus more coordinate-descent sweeps on deeper nets).

Writes ``benchmarks/results/wm_scaling.json``. Usage::

    python benchmarks/bench_wm_scaling.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

import modeconn as mc
from _common import write_json
from modeconn.models import build_model


def time_wm(width: int, depth: int, repeats: int) -> dict:
    mk = lambda s: build_model("mlp", in_shape=(1, 28, 28), num_classes=10, width=width, depth=depth, seed=s)  # noqa: E731
    a, b = mk(0), mk(1)
    spec = mc.symmetry_spec(a, torch.zeros(2, 1, 28, 28))
    runs = [mc.weight_matching(spec, a.state_dict(), b.state_dict(), restarts=1) for _ in range(repeats)]
    secs = [r.stats["seconds"] for r in runs]
    return {"width": width, "depth": depth, "seconds": statistics.median(secs),
            "lap_seconds": statistics.median(r.stats["lap_seconds"] for r in runs),
            "iterations": runs[0].stats.get("iterations")}


def fit(rows: list[dict], key: str) -> float:
    return float(np.polyfit(np.log([r[key] for r in rows]), np.log([r["seconds"] for r in rows]), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    width_rows = [time_wm(64 * m, 3, args.repeats) for m in (1, 2, 4, 8, 16)]
    depth_rows = [time_wm(256, d, args.repeats) for d in (2, 4, 8, 16)]
    for r in width_rows + depth_rows:
        print(r, flush=True)
    res = {"width_series": width_rows, "depth_series": depth_rows,
           "width_exponent": fit(width_rows, "width"), "depth_exponent": fit(depth_rows, "depth")}
    print({k: v for k, v in res.items() if k.endswith("exponent")})
    print(f"written {write_json('wm_scaling', res)}")


if __name__ == "__main__":
    main()
