"""An aligned merge of two 7B-shaped checkpoints on one machine (issue #38 item 2).

The pair (``_pairs.py``): Llama-2-7B's shape — hidden 4096, FFN 11008, 32 layers × 32 heads, vocabulary 32000, untied
head: 6.74 B parameters — in bf16, sharded like the hub checkpoint (two ≤ 5 GB shards and an index per model, 13.5 GB
each), B a permuted, perturbed copy of A (``g·A + 0.1·0.02·N(0, 1)``), so aligning B to A must find ``g⁻¹``. Written
once (tensor by tensor, never a model in memory); every output is deleted after its run.

Measured, each command a fresh process under ``/usr/bin/time -v`` with the page cache dropped first where permitted
(``bench_stream_io.timed``):

* ``weight``: ``modeconn merge A B --align weight`` at its defaults — wall, CPU seconds, peak RSS, the streaming
  weight-matching objective, LAP seconds, and the recovered fraction of the planted permutation
  (:func:`_pairs.recovered`: every unit of the merge against A's unit of the same index);
* ``none``: ``modeconn merge A B --align none`` (the weighted average) and ``mergekit``: ``mergekit-yaml`` on the
  same linear recipe (skipped with ``--skip-mergekit`` or when it is not installed), side by side;
* the disk: sequential write/read bandwidth with ``dd`` (``bench_stream_io.disk_bandwidth``), and per command the
  fraction of it reached — the time the disk alone needs for the bytes the command must move (each input read once,
  the output written once) over its wall time (weight matching reads the inputs once per sweep besides: its fraction
  is a lower bound).

Targets (issue #38): ``weight`` ≤ 30 min wall and ≤ 2.5 GiB peak RSS on a 2-core machine with the planted permutation
recovered exactly; ``none`` ≤ 1.0× mergekit's wall time at ≤ its RSS. The full size needs about 2.2× one model's bf16
bytes free under ``--tmp`` (the pair and one output; checked before anything is written). ``--scale`` / ``--layers``
shrink the pair (``--scale 0.02 --layers 2``: a smoke test in seconds). Writes ``benchmarks/results/bench_7b.json``
(or ``--json``). Usage::

    python benchmarks/bench_7b.py [--tmp /work/bench7b] [--scale 1] [--layers 32] [--skip-mergekit]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import write_json
from _pairs import HUB_SHARD_BYTES, llama_config, recovered, write_pair
from bench_stream_io import commands, disk_bandwidth, timed

TARGETS = {"weight_wall_seconds": 30 * 60, "weight_peak_rss_bytes": 2.5 * 2**30, "none_over_mergekit_wall": 1.0}


def check_space(tmp: Path, model_bytes: int) -> dict:
    """Refuse (SystemExit) unless ``tmp`` has room for the pair and one output, with 10% to spare."""
    need = int(3 * model_bytes * 1.1)
    free = shutil.disk_usage(tmp).free
    if free < need:
        sys.exit(f"{tmp}: {free / 1e9:.1f} GB free, the benchmark needs {need / 1e9:.1f} GB (pair + one output)")
    return {"free_bytes_before": free, "needed_bytes": need}


def model_bytes(cfg: dict, dtype: torch.dtype) -> int:
    """Bytes of one checkpoint of ``cfg`` (from the meta-device model, nothing allocated)."""
    import transformers

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    return sum(t.numel() for t in model.state_dict().values()) * dtype.itemsize


def disk_fraction(run: dict, in_bytes: int, out_bytes: int, disk: dict) -> float:
    """The disk's time for reading ``in_bytes`` and writing ``out_bytes`` at its sequential speed, over the wall."""
    return (in_bytes / disk["read_bytes_per_s"] + out_bytes / disk["write_bytes_per_s"]) / run["wall_seconds"]


def run_weight(a: Path, b: Path, work: Path, drop: bool) -> dict:
    out = work / "merged_weight"
    argv = [sys.executable, "-m", "modeconn", "merge", str(a), str(b), "--align", "weight", "--out", str(out)]
    run = timed(argv, out, drop)
    (al,) = json.loads((out / "merge.json").read_text())["alignments"]
    st = al["stats"]
    run.update(objective=al["objective"], lap_seconds=st["lap_seconds"], lap_calls=st["lap_calls"],
               sweeps=st["sweeps"], restarts_run=st["restarts_run"], recovered=recovered(out, a))
    shutil.rmtree(out)
    return run


def run_plain(a: Path, b: Path, work: Path, tools: list[str], drop: bool) -> dict:
    """``merge --align none`` and mergekit's linear merge, each output deleted after its run."""
    out = {}
    for tool, (argv, dest) in commands(a, b, work).items():
        if tool not in tools:
            continue
        if tool == "modeconn":
            argv = [sys.executable, "-m", "modeconn", *argv[1:]]
        out[tool] = timed(argv, dest, drop)
        shutil.rmtree(dest)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", default="/work/bench7b", help="where the pair and the outputs are written (emptied after)")
    ap.add_argument("--scale", type=float, default=1.0, help="width scale (1: Llama-2-7B)")
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (32: Llama-2-7B)")
    ap.add_argument("--noise", type=float, default=0.1, help="B = g·A + noise·0.02·N(0, 1)")
    ap.add_argument("--shard-bytes", type=int, default=HUB_SHARD_BYTES, help="shard size in bytes (hub: 5 GB bf16)")
    ap.add_argument("--disk-gib", type=float, default=4.0, help="size of the dd file for the disk bandwidth")
    ap.add_argument("--skip-mergekit", action="store_true", help="no mergekit run")
    ap.add_argument("--keep-cache", action="store_true", help="never drop the page cache (a smoke test on a shared machine)")
    ap.add_argument("--json", help="output JSON (default benchmarks/results/bench_7b.json)")
    args = ap.parse_args()
    cfg = llama_config(args.scale, args.layers)
    nbytes = model_bytes(cfg, torch.bfloat16)
    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    space = check_space(tmp, nbytes)
    work = Path(tempfile.mkdtemp(prefix="bench_7b.", dir=tmp))
    tools = ["modeconn"] + ([] if args.skip_mergekit or shutil.which("mergekit-yaml", path=str(Path(sys.executable).parent))
                            is None else ["mergekit"])
    try:
        disk = disk_bandwidth(work, args.disk_gib, not args.keep_cache)
        print(f"disk: write {disk['write_bytes_per_s'] / 1e6:.0f} MB/s, read {disk['read_bytes_per_s'] / 1e6:.0f} MB/s",
              flush=True)
        t = time.perf_counter()
        pair = write_pair(work, cfg, noise=args.noise, shard_bytes=args.shard_bytes)
        pair["write_seconds"] = time.perf_counter() - t
        print(f"pair of {pair['parameters'] / 1e9:.3f} B parameters written in {pair['write_seconds']:.0f} s", flush=True)
        a, b = work / "a", work / "b"
        weight = run_weight(a, b, work, not args.keep_cache)
        weight["disk_fraction_lower_bound"] = disk_fraction(weight, 2 * nbytes, nbytes, disk)
        print(f"merge --align weight: {weight['wall_seconds']:.0f} s wall, {weight['cpu_seconds']:.0f} s CPU, peak RSS "
              f"{weight['peak_rss_bytes'] / 2**30:.2f} GiB, recovered {weight['recovered']['min_fraction']:.4f}", flush=True)
        plain = run_plain(a, b, work, tools, not args.keep_cache)
        for tool, run in plain.items():
            run["disk_fraction"] = disk_fraction(run, 2 * nbytes, nbytes, disk)
            print(f"{tool} linear merge: {run['wall_seconds']:.0f} s wall, peak RSS "
                  f"{run['peak_rss_bytes'] / 2**30:.2f} GiB, {100 * run['disk_fraction']:.0f}% of the disk", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {"model": {**cfg, **pair, "scale": args.scale}, "disk": disk, "disk_space": space, "weight": weight,
           "plain": plain, "targets": TARGETS,
           "targets_met": {"weight_wall": weight["wall_seconds"] <= TARGETS["weight_wall_seconds"],
                           "weight_rss": weight["peak_rss_bytes"] <= TARGETS["weight_peak_rss_bytes"],
                           "planted_recovered_exactly": weight["recovered"]["min_fraction"] == 1.0}}
    if "mergekit" in plain:
        none, mk = plain["modeconn"], plain["mergekit"]
        res["none_over_mergekit"] = {"wall": none["wall_seconds"] / mk["wall_seconds"],
                                     "rss": none["peak_rss_bytes"] / mk["peak_rss_bytes"]}
        res["targets_met"]["none_vs_mergekit"] = (res["none_over_mergekit"]["wall"] <= TARGETS["none_over_mergekit_wall"]
                                                  and res["none_over_mergekit"]["rss"] <= 1.0)
    print(f"written {write_json('bench_7b', res, args.json)}")


if __name__ == "__main__":
    main()
