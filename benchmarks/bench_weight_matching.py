"""Weight matching: modeconn vs the `rebasin` package (PyPI), side by side in one run (issue #20).

Pairs: two *trained* models each — MLP 3×512 on MNIST and ResNet20×4 with BatchNorm on Fashion-MNIST, trained
briefly with modeconn's training API (``_trained.py``; cached in ``benchmarks/cache/``) — and the same
architectures at their (seeded, independent) initialisation. For each pair and repeat, one after the other:

* modeconn at default settings (one run from the greedy start);
* modeconn with kick restarts (``restarts=4``: then restarts from kicks of the best until one fails to beat it — the
  default before one run became it);
* modeconn with scratch restarts (``restarts=4, restart_init="scratch"``: the second run is the plain git re-basin
  run of the seed, so the result is never worse than it);
* modeconn with the defaults before issue #20 (``restart_rtol=None``, scratch: all 4 restarts, greedy / identity /
  random);
* rebasin's ``PermutationCoordinateDescent``.

Wall time includes tracing the symmetry spec (rebasin traces its model too). Reported: median wall and CPU
(process) time over the repeats (CPU time is the steadier of the two when other jobs share the machine), the
objective Σ⟨θ_A, g·θ_B⟩ each reaches over the tensors modeconn scores (parameters, not BatchNorm running statistics;
rebasin's computed by us on its returned weights), whether rebasin's result still computes B's function, whether
each variant's objective is at least rebasin's in every repeat (same seed), the restarts and sweeps that ran, LAP
time.

Run: python benchmarks/bench_weight_matching.py [--repeats 5]   (needs `pip install rebasin`)
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
VARIANTS = {"default": {}, "kicks": {"restarts": 4}, "scratch": {"restarts": 4, "restart_init": "scratch"},
            "old_default": {"restarts": 4, "restart_rtol": None, "restart_init": "scratch"}}


def objective(spec, sd_a, sd_b) -> float:
    """Σ⟨θ_A, θ_B⟩ over the tensors weight matching scores (parameters: BatchNorm statistics are not scored)."""
    return float(sum((sd_a[k].float() * sd_b[k].float()).sum() for k in scored_keys(spec, sd_a)))


def models(name: str, trained: bool):
    if trained:
        return trained_pair(name)
    arch, kwargs = ARCHS[name]
    return tuple(build_model(arch, in_shape=(1, 28, 28), num_classes=10, seed=s, **kwargs).eval() for s in (0, 1))


def _timed(name: str, wall: dict, cpu: dict, fn):
    """``fn()``, its wall and CPU (process) seconds appended to ``wall[name]`` and ``cpu[name]``."""
    t, c = time.perf_counter(), time.process_time()
    res = fn()
    wall[name].append(time.perf_counter() - t)
    cpu[name].append(time.process_time() - c)
    return res


def bench_pair(name: str, trained: bool, repeats: int) -> dict:
    from rebasin import PermutationCoordinateDescent

    model_a, model_b = models(name, trained)
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    spec = mc.symmetry_spec(model_a, x)
    names = (*VARIANTS, "rebasin")
    times: dict[str, list[float]] = {v: [] for v in names}
    cpu: dict[str, list[float]] = {v: [] for v in names}
    objectives: dict[str, list[float]] = {v: [] for v in names}
    results: dict = {}
    for rep in range(repeats):
        for v, kw in VARIANTS.items():
            res = _timed(v, times, cpu, lambda: mc.weight_matching(mc.symmetry_spec(model_a, x), sd_a, sd_b, seed=rep, **kw))
            objectives[v].append(res.objective)
            results.setdefault(v, res)
        torch.manual_seed(rep)
        mb = copy.deepcopy(model_b)
        _timed("rebasin", times, cpu, PermutationCoordinateDescent(copy.deepcopy(model_a), mb, x).rebasin)
        objectives["rebasin"].append(objective(spec, sd_a, mb.state_dict()))
        results.setdefault("rebasin", mb)
    med = {v: statistics.median(ts) for v, ts in times.items()}
    med_cpu = {v: statistics.median(ts) for v, ts in cpu.items()}
    rb = results["rebasin"]
    with torch.no_grad():
        same_fn = torch.allclose(rb(x), model_b(x), atol=1e-4)
    out = {"pair": f"{name} ({'trained' if trained else 'init'})", "params": sum(p.numel() for p in model_a.parameters()),
           "naive_objective": objective(spec, sd_a, sd_b), "seconds_all": times, "cpu_seconds_all": cpu,
           "objectives_all": objectives, "rebasin_seconds": med["rebasin"], "rebasin_cpu_seconds": med_cpu["rebasin"],
           "rebasin_objective": objectives["rebasin"][0], "rebasin_preserves_function": bool(same_fn),
           "spec_seconds_included": True}
    for v in VARIANTS:
        st = results[v].stats
        out[v] = {"seconds": med[v], "cpu_seconds": med_cpu[v], "objective": results[v].objective,
                  "speedup_vs_rebasin": med["rebasin"] / med[v], "cpu_speedup_vs_rebasin": med_cpu["rebasin"] / med_cpu[v],
                  "objective_at_least_rebasin_every_repeat": all(
                      o >= r for o, r in zip(objectives[v], objectives["rebasin"], strict=True)),
                  "restarts_run": st["restarts_run"], "restarts_stopped_by": st["restarts_stopped_by"],
                  "sweeps": st["sweeps"], "restart_objectives": st["restart_objectives"],
                  "lap_calls": st["lap_calls"], "lap_skipped": st["lap_skipped"], "lap_seconds": st["lap_seconds"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [bench_pair(name, trained, args.repeats) for trained in (True, False) for name in ARCHS]
    path = write_json("weight_matching_vs_rebasin", {"rows": rows, "repeats": args.repeats})
    for r in rows:
        d, kicks, old = r["default"], r["kicks"], r["old_default"]
        print(f"{r['pair']}: default {d['seconds']:.3f}s obj {d['objective']:.2f} | kicks {kicks['seconds']:.3f}s obj "
              f"{kicks['objective']:.2f} ({kicks['restarts_run']} runs, {kicks['restarts_stopped_by']}) | old default "
              f"{old['seconds']:.3f}s obj {old['objective']:.2f} | rebasin {r['rebasin_seconds']:.3f}s obj "
              f"{r['rebasin_objective']:.2f}; speed-up default {d['speedup_vs_rebasin']:.1f}x, kicks "
              f"{kicks['speedup_vs_rebasin']:.1f}x")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
