"""Weight matching: modeconn vs the `rebasin` package (PyPI), side by side in one run (issue #20).

Pairs: two *trained* models each — MLP 3×512 on MNIST and ResNet20×4 with BatchNorm on Fashion-MNIST, trained
briefly with modeconn's training API (``_trained.py``; cached in ``benchmarks/cache/``) — and the same
architectures at their (seeded, independent) initialisation. For each pair and repeat, one after the other:

* modeconn at default settings (greedy start, then restarts from kicks of the best until one fails to beat it, at
  most 4);
* modeconn with one run (``restarts=1``);
* modeconn with scratch restarts (``restart_init="scratch"``: the second run is the plain git re-basin run of the
  seed, so the result is never worse than it — the default before this benchmark's last change);
* modeconn with the defaults before issue #20 (``restart_rtol=None``, scratch: all 4 restarts, greedy / identity /
  random);
* rebasin's ``PermutationCoordinateDescent``.

Wall time includes tracing the symmetry spec (rebasin traces its model too). Reported: median wall time over the
repeats, the objective Σ⟨θ_A, g·θ_B⟩ each reaches over the tensors modeconn scores (parameters, not BatchNorm
running statistics; rebasin's computed by us on its returned weights), whether rebasin's result still computes B's
function, the restarts and sweeps that ran, LAP time.

Run: python benchmarks/bench_weight_matching.py [--repeats 3]   (needs `pip install rebasin`)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import modeconn as mc
from modeconn.match.weight import scored_keys
from modeconn.models import build_model

from _common import write_json
from _trained import trained_pair

ARCHS = {
    "mlp": ("mlp", dict(depth=3, width=512)),
    "resnet": ("resnet20", dict(width=4.0, norm="batchnorm")),
}
VARIANTS = {"default": {}, "1run": {"restarts": 1}, "scratch": {"restart_init": "scratch"},
            "old_default": {"restart_rtol": None, "restart_init": "scratch"}}


def objective(spec, sd_a, sd_b) -> float:
    """Σ⟨θ_A, θ_B⟩ over the tensors weight matching scores (parameters: BatchNorm statistics are not scored)."""
    return float(sum((sd_a[k].float() * sd_b[k].float()).sum() for k in scored_keys(spec, sd_a)))


def models(name: str, trained: bool):
    if trained:
        return trained_pair(name)
    arch, kwargs = ARCHS[name]
    return tuple(build_model(arch, in_shape=(1, 28, 28), num_classes=10, seed=s, **kwargs).eval() for s in (0, 1))


def bench_pair(name: str, trained: bool, repeats: int) -> dict:
    from rebasin import PermutationCoordinateDescent

    model_a, model_b = models(name, trained)
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    spec = mc.symmetry_spec(model_a, x)
    times: dict[str, list[float]] = {v: [] for v in (*VARIANTS, "rebasin")}
    results: dict = {}
    for rep in range(repeats):
        for v, kw in VARIANTS.items():
            t = time.perf_counter()
            res = mc.weight_matching(mc.symmetry_spec(model_a, x), sd_a, sd_b, seed=rep, **kw)
            times[v].append(time.perf_counter() - t)
            results.setdefault(v, res)
        torch.manual_seed(rep)
        mb = copy.deepcopy(model_b)
        t = time.perf_counter()
        PermutationCoordinateDescent(copy.deepcopy(model_a), mb, x).rebasin()
        times["rebasin"].append(time.perf_counter() - t)
        results.setdefault("rebasin", mb)
    med = {v: statistics.median(ts) for v, ts in times.items()}
    rb = results["rebasin"]
    with torch.no_grad():
        same_fn = torch.allclose(rb(x), model_b(x), atol=1e-4)
    out = {"pair": f"{name} ({'trained' if trained else 'init'})", "params": sum(p.numel() for p in model_a.parameters()),
           "naive_objective": objective(spec, sd_a, sd_b), "seconds_all": times,
           "rebasin_seconds": med["rebasin"], "rebasin_objective": objective(spec, sd_a, rb.state_dict()),
           "rebasin_preserves_function": bool(same_fn), "spec_seconds_included": True}
    for v in VARIANTS:
        st = results[v].stats
        out[v] = {"seconds": med[v], "objective": results[v].objective, "speedup_vs_rebasin": med["rebasin"] / med[v],
                  "restarts_run": st["restarts_run"], "restarts_stopped_by": st["restarts_stopped_by"],
                  "sweeps": st["sweeps"], "restart_objectives": st["restart_objectives"],
                  "lap_calls": st["lap_calls"], "lap_skipped": st["lap_skipped"], "lap_seconds": st["lap_seconds"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [bench_pair(name, trained, args.repeats) for trained in (True, False) for name in ARCHS]
    path = write_json("weight_matching_vs_rebasin", {"rows": rows, "repeats": args.repeats})
    for r in rows:
        d, one, old = r["default"], r["1run"], r["old_default"]
        print(f"{r['pair']}: default {d['seconds']:.3f}s obj {d['objective']:.2f} ({d['restarts_run']} runs, "
              f"{d['restarts_stopped_by']}) | 1 run {one['seconds']:.3f}s obj {one['objective']:.2f} | old default "
              f"{old['seconds']:.3f}s obj {old['objective']:.2f} | rebasin {r['rebasin_seconds']:.3f}s obj "
              f"{r['rebasin_objective']:.2f}; speed-up default {d['speedup_vs_rebasin']:.1f}x, 1 run "
              f"{one['speedup_vs_rebasin']:.1f}x")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
