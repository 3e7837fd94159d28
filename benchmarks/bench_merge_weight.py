"""``modeconn merge A B --align weight`` at its defaults on two 0.3 B Llama checkpoints (issue #20).

The pair of ``bench_stream_io.py`` (``LlamaConfig``, hidden 1024, 18 layers, FFN 2816, vocab 34816: 0.302 B
parameters, random init, fp16 in four ≤ 200 MB shards). Each command is a fresh process under ``/usr/bin/time -v``
(wall time, CPU time of every thread, peak RSS), with the page cache warm (the inputs were just written; weight
matching reads them several times either way):

* ``default``: ``modeconn merge A B --align weight --out …`` — every weight-matching option at its default (one
  run from the greedy start, sweeps until one changes nothing);
* ``kicks``: the same with ``--restarts 4`` (restarts from kicks of the best until one fails to beat it: the
  default before one run became it);
* ``one_run``: the same with ``--restarts 1 --max-iter 2`` (one run, two sweeps: the setting the issue measured as
  reaching the old defaults' objective).

Reported per command: the streaming weight-matching objective, restarts and sweeps that ran, LAP seconds and calls
(from the output's ``merge.json``), and the threads torch used (``OMP_NUM_THREADS``, or torch's default). Writes
``benchmarks/results/merge_weight.json``; the checkpoints live in a temporary directory under ``--tmp`` and are
deleted afterwards. Usage::

    python benchmarks/bench_merge_weight.py [--layers 18] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from _common import write_json
from bench_stream_io import BIN, ROOT, make_checkpoint, timed

VARIANTS = {"default": [], "kicks": ["--restarts", "4"], "one_run": ["--restarts", "1", "--max-iter", "2"]}


def run_variant(a: Path, b: Path, work: Path, extra: list[str]) -> dict:
    out = work / "merged"
    res = timed([str(BIN / "modeconn"), "merge", str(a), str(b), "--align", "weight", "--out", str(out), *extra], out)
    rec = json.loads((out / "merge.json").read_text())
    (al,) = rec["alignments"]
    st = al["stats"]
    res.update(objective=al["objective"], restarts_run=st["restarts_run"], sweeps=st["sweeps"],
               restarts_stopped_by=st["restarts_stopped_by"], lap_seconds=st["lap_seconds"], lap_calls=st["lap_calls"],
               lap_skipped=st["lap_skipped"], wm_seconds=st["seconds"])
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=18, help="decoder layers (18: 0.302 B parameters)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each variant (alternating)")
    ap.add_argument("--shard-mb", type=float, default=200.0, help="input shard size in MB")
    ap.add_argument("--tmp", default=str(ROOT / "cache"), help="directory for the temporary files (deleted after)")
    args = ap.parse_args()
    Path(args.tmp).mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_merge_weight.", dir=args.tmp))
    try:
        a, b = work / "a", work / "b"
        info = make_checkpoint(a, args.layers, 0, int(args.shard_mb * 1e6))
        make_checkpoint(b, args.layers, 1, int(args.shard_mb * 1e6))
        runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for _ in range(args.repeats):
            for name, extra in VARIANTS.items():
                t = time.perf_counter()
                runs[name].append(run_variant(a, b, work, extra))
                r = runs[name][-1]
                print(f"{name}: {time.perf_counter() - t:.1f} s wall, {r['cpu_seconds']:.1f} s CPU, objective "
                      f"{r['objective']:.4f}, runs {r['restarts_run']} ({r['restarts_stopped_by']}), sweeps "
                      f"{r['sweeps']}, LAP {r['lap_seconds']:.1f} s in {r['lap_calls']} calls", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {"model": {"layers": args.layers, **info}, "threads": os.environ.get("OMP_NUM_THREADS",
           f"torch default ({torch.get_num_threads()})"), "load_average_after": os.getloadavg(), "runs": runs,
           "median_wall_seconds": {v: sorted(r["wall_seconds"] for r in rs)[len(rs) // 2] for v, rs in runs.items()}}
    print(f"written {write_json('merge_weight', res)}")


if __name__ == "__main__":
    main()
