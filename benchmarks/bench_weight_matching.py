"""Weight matching: modeconn vs the `rebasin` package (PyPI), side by side in one run.

Pairs: two ResNet20×4 models (1×28×28 Fashion-MNIST shape, 10 classes) and two 3×512 MLPs, both at
their (seeded, independent) initialisation. For each pair: wall time of each implementation, the
objective Σ⟨θ_A, g·θ_B⟩ each reaches (computed by us on the returned weights, over the same tensors),
whether the result still computes the same function as B, and the share of our time spent in LAP solves.

Run: python benchmarks/bench_weight_matching.py   (needs `pip install rebasin`)
"""

from __future__ import annotations

import copy
import time

import torch

import modeconn as mc
from modeconn.models import build_model

from _common import write_json


def objective(spec, sd_a, sd_b) -> float:
    return float(sum((sd_a[k].float() * sd_b[k].float()).sum() for k, b in spec.tensors.items() if b))


def bench_pair(name: str, arch: str, kwargs: dict, in_shape, repeats: int = 3) -> dict:
    model_a = build_model(arch, in_shape=in_shape, num_classes=10, seed=0, **kwargs).eval()
    model_b = build_model(arch, in_shape=in_shape, num_classes=10, seed=1, **kwargs).eval()
    x = torch.randn(4, *in_shape, generator=torch.Generator().manual_seed(0))
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    spec = mc.symmetry_spec(model_a, x)
    out = {"pair": name, "params": sum(p.numel() for p in model_a.parameters()), "naive_objective": objective(spec, sd_a, sd_b)}

    ours, ours1, theirs = [], [], []
    for rep in range(repeats):
        t = time.perf_counter()
        spec_r = mc.symmetry_spec(model_a, x)
        res1 = mc.weight_matching(spec_r, sd_a, sd_b, restarts=1, seed=rep)
        ours1.append((time.perf_counter() - t, res1))
        t = time.perf_counter()
        res = mc.weight_matching(spec_r, sd_a, sd_b, seed=rep)
        ours.append((time.perf_counter() - t, res))

        from rebasin import PermutationCoordinateDescent

        torch.manual_seed(rep)
        mb = copy.deepcopy(model_b)
        t = time.perf_counter()
        pcd = PermutationCoordinateDescent(copy.deepcopy(model_a), mb, x)
        pcd.rebasin()
        theirs.append((time.perf_counter() - t, mb))

    def best(runs):
        return min(r[0] for r in runs)

    t_ours1, t_ours, t_theirs = best(ours1), best(ours), best(theirs)
    rb_sd = theirs[0][1].state_dict()
    with torch.no_grad():
        same_fn = torch.allclose(theirs[0][1](x), model_b(x), atol=1e-4)
    out.update(
        modeconn_1run_seconds=t_ours1,
        modeconn_1run_objective=ours1[0][1].objective,
        modeconn_seconds=t_ours,
        modeconn_objective=ours[0][1].objective,
        modeconn_restarts=ours[0][1].stats["restarts_run"],
        modeconn_lap_share=ours1[0][1].stats["lap_seconds"] / ours1[0][1].stats["seconds"],
        modeconn_spec_seconds_included=True,
        rebasin_seconds=t_theirs,
        rebasin_objective=objective(spec, sd_a, rb_sd),
        rebasin_preserves_function=bool(same_fn),
        speedup_1run=t_theirs / t_ours1,
        speedup_default=t_theirs / t_ours,
    )
    return out


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = [
        bench_pair("resnet20x4 (init)", "resnet20", dict(width=4.0, norm="batchnorm"), (1, 28, 28)),
        bench_pair("mlp 3x512 (init)", "mlp", dict(depth=3, width=512), (1, 28, 28)),
    ]
    path = write_json("weight_matching_vs_rebasin", {"rows": rows})
    for r in rows:
        print(
            f"{r['pair']}: modeconn {r['modeconn_1run_seconds']:.3f}s (1 run, obj {r['modeconn_1run_objective']:.2f}; "
            f"LAP {100 * r['modeconn_lap_share']:.0f}% of time) / {r['modeconn_seconds']:.3f}s ({r['modeconn_restarts']} runs, "
            f"obj {r['modeconn_objective']:.2f}) vs rebasin {r['rebasin_seconds']:.3f}s (obj {r['rebasin_objective']:.2f}); "
            f"speed-up {r['speedup_1run']:.1f}x / {r['speedup_default']:.1f}x; naive obj {r['naive_objective']:.2f}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
