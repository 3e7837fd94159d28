"""Weight matching end to end with an FFN-sized space: the LAP by the sparse certified solver (``method="auto"``, the
default from 2048 units) against the dense solver (``SPARSE_MIN_N`` raised above the width), side by side (issue #20).

Model: the single-hidden-layer MLP 784 → 8192 → 10 made of the first 8192 hidden units of each trained
784 → 16384 → 10 model of ``bench_sparse_lap.py`` (same cache). Weight matching at default settings; reported:
wall time, objective, LAP seconds and counts, certificate failures and dense fallbacks, and whether both runs found
the same element.

Writes ``benchmarks/results/wm_sparse_lap.json``. Usage: ``python benchmarks/bench_wm_sparse_lap.py [--width 8192]``
"""

from __future__ import annotations

import argparse
import time

import torch

import modeconn as mc
from modeconn.match import lap as lap_mod
from modeconn.models import build_model

from _common import write_json
from bench_sparse_lap import trained_ffn_pair


def sub_model(sd: dict, width: int) -> torch.nn.Module:
    """The MLP 784 → ``width`` → 10 holding the first ``width`` hidden units of ``sd``."""
    model = build_model("mlp", in_shape=(1, 28, 28), num_classes=10, depth=1, width=width, seed=0)
    model.load_state_dict({"blocks.0.linear.weight": sd["blocks.0.linear.weight"][:width],
                           "blocks.0.linear.bias": sd["blocks.0.linear.bias"][:width],
                           "head.weight": sd["head.weight"][:, :width], "head.bias": sd["head.bias"]})
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=8192)
    args = ap.parse_args()
    torch.set_num_threads(1)
    a, b = (sub_model(sd, args.width) for sd in trained_ffn_pair())
    spec = mc.symmetry_spec(a, torch.randn(2, 1, 28, 28))
    out = {"width": args.width}
    for name, min_n in (("sparse", lap_mod.SPARSE_MIN_N), ("dense", args.width + 1)):
        lap_mod.SPARSE_MIN_N = min_n
        t = time.perf_counter()
        res = mc.weight_matching(spec, a.state_dict(), b.state_dict())
        st = res.stats
        out[name] = {"seconds": time.perf_counter() - t, "objective": res.objective, "element": res.element,
                     **{k: st[k] for k in ("restarts_run", "sweeps", "lap_seconds", "lap_calls", "lap_sparse_calls",
                                           "lap_certificate_failures", "lap_dense_fallbacks", "lap_skipped")}}
        print(name, {k: v for k, v in out[name].items() if k != "element"}, flush=True)
    out["same_element"] = spec.equal(out["sparse"].pop("element"), out["dense"].pop("element"))
    out["speedup"] = out["dense"]["seconds"] / out["sparse"]["seconds"]
    path = write_json("wm_sparse_lap", out)
    print(f"same element: {out['same_element']}, speed-up {out['speedup']:.1f}x; written {path}")


if __name__ == "__main__":
    main()
