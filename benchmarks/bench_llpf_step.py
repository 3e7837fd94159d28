"""The cost of one gradient evaluation inside LLPF against one plain SGD step of the same model and batch.

LLPF runs model-to-model between two random initialisations of the model (the cost of a tick does not depend on
the weights' values) with the schedule ``modeconn path --budget B`` gives it (:meth:`LLPFConfig.for_budget`:
≈ 2·√B ticks), every tick refined for exactly its fair share (``threshold=-1`` never stops a tick early), points
recorded as ``modeconn path`` records them (at most 64 stored) and the run checkpointed to disk every 10 ticks —
so its time per gradient evaluation carries everything a tick does: the move, the variance correction and the
projection, the refinement, recording and checkpointing. The baseline is the minimal training loop: the same
batches drawn by index, forward, cross-entropy, ``zero_grad``, ``backward``, ``torch.optim.SGD(lr).step()`` (no
momentum: LLPF refines with plain SGD), as many steps as LLPF spent. Runs alternate (after a warm-up of each) and
the medians over the repeats are reported, wall and CPU time (the CPU time is the robust one on a shared
machine), with LLPF's time split by part. The evaluation of the stored points (``evaluate_found_path``: BatchNorm
recomputed per point, one continuity sub-point per segment) is timed separately, per evaluated model.

Writes ``benchmarks/results/llpf_step.json`` atomically and prints it. Usage::

    python benchmarks/bench_llpf_step.py [--budget 1000] [--repeats 5] [--case mlp] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from _common import write_json
from modeconn.data import DatasetBundle
from modeconn.models import build_model
from modeconn.path import LLPFConfig, llpf_m2m
from modeconn.path import llpf as llpf_mod
from modeconn.path.methods import evaluate_found_path

CASES = {
    "mlp 3x512 (the demo's pair), batch 128": ("mlp", dict(in_shape=(1, 8, 8), num_classes=10, width=512, depth=3), 128),
    "resnet20x0.5 with BatchNorm, 1x28x28, batch 64": (
        "resnet20", dict(in_shape=(1, 28, 28), num_classes=10, width=0.5, norm="batchnorm"), 64),
}
PARTS = ("_refine", "_project", "_record", "_checkpoint", "_flush")
LR = 0.01


@contextmanager
def clocks():
    """Both clocks: ``{"wall", "cpu"}`` seconds of the block."""
    out: dict[str, float] = {}
    w, c = time.perf_counter(), time.process_time()
    yield out
    out.update(wall=time.perf_counter() - w, cpu=time.process_time() - c)


def plain_sgd(model: torch.nn.Module, data: TensorDataset, batch_size: int, steps: int) -> None:
    x, y = data.tensors
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(0)
    model.train()
    perm, pos = torch.randperm(len(x), generator=gen), 0
    for _ in range(steps):
        if pos + batch_size > len(perm):
            perm, pos = torch.randperm(len(x), generator=gen), 0
        idx = perm[pos:pos + batch_size]
        pos += batch_size
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


@contextmanager
def part_timers(times: dict[str, float]):
    """Time the parts of an LLPF tick (CPU seconds, summed into ``times``) by wrapping ``_Run``'s methods."""
    saved = {name: getattr(llpf_mod._Run, name) for name in PARTS}

    def timed(name, fn):
        def wrapper(self, *a, **k):
            c = time.process_time()
            try:
                return fn(self, *a, **k)
            finally:
                times[name] += time.process_time() - c
        return wrapper

    for name, fn in saved.items():
        setattr(llpf_mod._Run, name, timed(name, fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(llpf_mod._Run, name, fn)


def llpf_options(budget: int, batch_size: int) -> dict:
    ticks = LLPFConfig(budget=budget).for_budget().ticks
    return {"budget": budget, "threshold": -1.0, "min_steps": 1, "lr": LR, "batch_size": batch_size,
            "record_every": max(1, -(-ticks // 64)), "checkpoint_every": 10}


def bench_case(name: str, arch: str, kwargs: dict, batch_size: int, budget: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(max(4096, 8 * batch_size), *kwargs["in_shape"], generator=gen)
    data = TensorDataset(x, torch.randint(0, kwargs["num_classes"], (len(x),), generator=gen))
    a, b = build_model(arch, seed=0, **kwargs), build_model(arch, seed=1, **kwargs)
    sd_a, sd_b = a.state_dict(), b.state_dict()
    opts = llpf_options(budget, batch_size)

    def run_llpf(d=None):
        if d is not None:
            return llpf_m2m(a, sd_a, sd_b, data, out_dir=f"{d}/run", **opts)
        with tempfile.TemporaryDirectory() as d:
            return llpf_m2m(a, sd_a, sd_b, data, out_dir=f"{d}/run", **opts)

    keep = tempfile.TemporaryDirectory()
    path = run_llpf(keep.name)  # warm-up; its grad evals are the baseline's steps, its points evaluated below
    steps = int(path.compute["grad_evals"])
    plain_sgd(copy.deepcopy(a), data, batch_size, min(steps, 20))
    llpf_t, sgd_t, parts = [], [], defaultdict(float)
    for r in range(repeats):
        order = ("llpf", "sgd") if r % 2 == 0 else ("sgd", "llpf")
        for which in order:
            if which == "llpf":
                with part_timers(parts), clocks() as t:
                    run_llpf()
                llpf_t.append(t)
            else:
                with clocks() as t:
                    plain_sgd(copy.deepcopy(a), data, batch_size, steps)
                sgd_t.append(t)
    med = {k: {c: statistics.median(t[c] for t in ts) / steps * 1e3 for c in ("wall", "cpu")}
           for k, ts in (("llpf", llpf_t), ("sgd", sgd_t))}
    bundle = DatasetBundle(name="random", train=data, val=None, test=TensorDataset(*(t[:512] for t in data.tensors)),
                           input_shape=tuple(kwargs["in_shape"]), num_classes=kwargs["num_classes"],
                           classes=tuple(map(str, range(kwargs["num_classes"]))), source="random")
    with clocks() as ev:
        curve = evaluate_found_path(path, a, bundle, eval_limit=512, bn_batches=5, sub_points=1)
    models = len(curve.lambdas) + (len(curve.lambdas) - 1) * curve.sub_points
    keep.cleanup()
    llpf_cpu = statistics.median(t["cpu"] for t in llpf_t)
    return {
        "case": name, "budget": budget, "grad_evals": steps, "ticks": path.info["ticks_done"],
        "stored_points": len(path), "record_every": opts["record_every"], "repeats": repeats,
        "ms_per_grad_eval": med,
        "ratio_cpu": med["llpf"]["cpu"] / med["sgd"]["cpu"], "ratio_wall": med["llpf"]["wall"] / med["sgd"]["wall"],
        "llpf_cpu_share_by_part": {k: parts[k] / repeats / llpf_cpu for k in PARTS},
        "evaluation": {"models_evaluated": models, "examples_per_split": 512, "bn_batches": 5,
                       "wall_s": ev["wall"], "cpu_s": ev["cpu"], "cpu_ms_per_model": ev["cpu"] / models * 1e3},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="budget 100, 1 repeat, not written")
    ap.add_argument("--case", default="", help="only the cases whose name contains this")
    args = ap.parse_args()
    torch.set_num_threads(1)
    budget, repeats = (100, 1) if args.quick else (args.budget, args.repeats)
    results = []
    for name, (arch, kw, bs) in ((k, v) for k, v in CASES.items() if args.case in k):
        results.append(bench_case(name, arch, kw, bs, budget, repeats))
        print(json.dumps(results[-1]), flush=True)
    payload = {"what": "ms per gradient evaluation: LLPF (everything a tick does) vs a plain SGD step, same model "
                       "and batch; medians over interleaved repeats", "cases": results,
               "max_ratio_cpu": max(r["ratio_cpu"] for r in results)}
    print(json.dumps(payload, indent=2))
    if not args.quick:
        print("written:", write_json("llpf_step", payload))


if __name__ == "__main__":
    main()
