"""Streamed merge I/O against the disk and against mergekit (issue #20 item 3).

1. *Disk*: sequential bandwidth of the filesystem the checkpoints live on, with ``dd`` — a file of ``--disk-gib`` GiB
   written from /dev/zero with ``conv=fdatasync`` (the time includes the flush to disk), then read back to /dev/null
   after dropping the page cache (``/proc/sys/vm/drop_caches``; where that is not permitted the read uses
   ``iflag=direct``, which bypasses the cache, and the JSON says so).
2. *Pair*: two Llama-shaped checkpoints (transformers' ``LlamaConfig``, random init: N(0, 0.02²), norms 1), fp16 in
   Hugging Face shards of ``--shard-mb`` MB with an index, written tensor by tensor (never a model in memory).
3. *Merge*, side by side in one run, alternating (A B A B …): ``modeconn merge A B --align none`` (the weighted
   average) and ``mergekit-yaml`` on the equivalent linear recipe (``dtype: float16``), each a fresh process under
   ``/usr/bin/time -v`` (its wall time and maximum resident set size), the page cache dropped before every run where
   permitted (else both read the inputs from the cache). The outputs are compared tensor by tensor (max |Δ|).

4. *Streaming phase*: in one fresh process (imports and the spec built first, not timed), the page cache dropped
   before each: :func:`modeconn.stream.stream_merge` of the pair and :func:`modeconn.stream.stream_apply` of a random
   permutation element to B — the streamed I/O itself, without the interpreter start-up (torch, transformers) that
   both command lines pay.

Throughput: the bytes a merge streams (every input tensor read once, the output written once) over its wall time,
and as a percentage of the disk: ``(in_bytes / read_bandwidth + out_bytes / write_bandwidth) / wall`` — the time the
disk alone needs for that traffic at its sequential speed, over the time the merge took (100% = disk-bound).

Writes ``benchmarks/results/stream_io.json``; every file lives under a temporary directory in ``--tmp`` (default:
``benchmarks/cache``, the repository's filesystem) and is deleted afterwards. Usage::

    python benchmarks/bench_stream_io.py [--layers 18] [--repeats 3] [--disk-gib 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import write_json

ROOT = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
LLAMA = {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 16,
         "vocab_size": 34816, "max_position_embeddings": 2048, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
"""The pair's shape: with 18 layers 0.302 B parameters."""


# -------------------------------------------------------------------------------------------------- disk
def drop_caches() -> bool:
    """Write back dirty pages and drop the page cache; False where that is not permitted (a container)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True
    except OSError:
        return False


def _dd(*args: str) -> float:
    t = time.perf_counter()
    subprocess.run(["dd", *args, "bs=16M", "status=none"], check=True)
    return time.perf_counter() - t


def disk_bandwidth(work: Path, gib: float, drop: bool = True) -> dict:
    """Sequential write (``conv=fdatasync``) and read bandwidth in bytes/s of a ``gib`` GiB file in ``work`` (the page
    cache dropped before the read unless ``drop`` is False: the read then bypasses it, ``iflag=direct``)."""
    file, count = work / "dd.bin", max(1, round(gib * 64))
    nbytes = count * (16 << 20)
    write_s = _dd("if=/dev/zero", f"of={file}", f"count={count}", "conv=fdatasync")
    dropped = drop and drop_caches()
    read_s = _dd(f"if={file}", "of=/dev/null", *(() if dropped else ("iflag=direct",)))
    file.unlink()
    return {"bytes": nbytes, "write_seconds": write_s, "read_seconds": read_s, "write_bytes_per_s": nbytes / write_s,
            "read_bytes_per_s": nbytes / read_s, "page_cache_dropped": dropped,
            "read_method": "dd after drop_caches" if dropped else "dd iflag=direct (page cache could not be dropped)"}


# -------------------------------------------------------------------------------------------------- pair
def make_checkpoint(out: Path, layers: int, seed: int, shard_bytes: int) -> dict:
    """A random Llama checkpoint in fp16 (shards + index + config.json), written tensor by tensor."""
    import transformers

    from modeconn.io.lazy import ShardLayout, write_like

    cfg = transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": layers})
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.dtype = "float16"
    with torch.device("meta"):
        skeleton = transformers.LlamaForCausalLM(cfg)
    shapes = {k: (torch.float16, tuple(t.shape)) for k, t in skeleton.state_dict().items()}
    gen = torch.Generator().manual_seed(seed)

    def produce(key: str) -> torch.Tensor:
        if key.endswith("norm.weight"):
            return torch.ones(shapes[key][1], dtype=torch.float16)
        return (torch.randn(shapes[key][1], generator=gen) * 0.02).half()

    write_like(out, ShardLayout.plan(shapes, shard_bytes), produce, files={"config.json": json.loads(cfg.to_json_string())})
    n = sum(torch.Size(s).numel() for _, s in shapes.values())
    return {"parameters": n, "fp16_bytes": 2 * n, "shards": len(list(out.glob("*.safetensors")))}


# ------------------------------------------------------------------------------------------------- merges
def commands(a: Path, b: Path, work: Path) -> dict[str, tuple[list[str], Path]]:
    """``{tool: (argv, output directory)}`` of the two merges (the same weighted average, fp16 out)."""
    recipe = work / "linear.yml"
    recipe.write_text(f"merge_method: linear\ndtype: float16\nmodels:\n  - model: {a}\n    parameters: {{weight: 0.5}}\n"
                      f"  - model: {b}\n    parameters: {{weight: 0.5}}\n")
    return {
        "modeconn": ([str(BIN / "modeconn"), "merge", str(a), str(b), "--align", "none", "--out",
                      str(work / "out_modeconn")], work / "out_modeconn"),
        "mergekit": ([str(BIN / "mergekit-yaml"), str(recipe), str(work / "out_mergekit"), "--quiet",
                      "--no-copy-tokenizer"], work / "out_mergekit"),
    }


def timed(argv: list[str], out: Path, drop: bool = True) -> dict:
    """One run under ``/usr/bin/time -v``: wall seconds and peak RSS (bytes) of the command (the page cache dropped
    first unless ``drop`` is False)."""
    shutil.rmtree(out, ignore_errors=True)  # the previous run's output, in this benchmark's temporary directory
    cache_dropped = drop and drop_caches()
    t = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1)) * 1024
    cpu = sum(float(re.search(rf"{what} time \(seconds\): ([\d.]+)", proc.stderr).group(1)) for what in ("User", "System"))
    return {"wall_seconds": wall, "cpu_seconds": cpu, "peak_rss_bytes": rss, "page_cache_dropped": cache_dropped}


def compare(x: Path, y: Path) -> float:
    """Max |Δ| over the tensors of two checkpoint directories (same keys required)."""
    from modeconn.io.lazy import LazyCheckpoint

    ca, cb = LazyCheckpoint(x), LazyCheckpoint(y)
    assert set(ca) == set(cb), set(ca) ^ set(cb)
    return max(float((ca[k].float() - cb[k].float()).abs().max()) for k in ca)


def phase_child(a: str, b: str, work: str) -> None:
    """Timed stream_merge and stream_apply in this process (page cache dropped before each); one JSON line."""
    from modeconn.stream import hf_checkpoint_spec, stream_apply, stream_merge

    spec = hf_checkpoint_spec(a)
    g = spec.random_element(seed=0)
    steps = {"merge": lambda: stream_merge(None, [a, b], f"{work}/phase_merge"),
             "apply": lambda: stream_apply(spec, b, g, f"{work}/phase_apply")}
    out = {}
    for name, run in steps.items():
        dropped = drop_caches()
        r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        run()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out[name] = {"seconds": time.perf_counter() - t, "page_cache_dropped": dropped,  # CPU: every thread's
                     "cpu_seconds": r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime}
        shutil.rmtree(f"{work}/phase_{name}")
    print(json.dumps(out), flush=True)


def phases(a: Path, b: Path, work: Path, model_bytes: int, disk: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--phase-child", str(a), str(b), str(work)], check=True,
                          stdout=subprocess.PIPE, text=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, reads in (("merge", 2), ("apply", 1)):
        r = res[name]
        disk_s = reads * model_bytes / disk["read_bytes_per_s"] + model_bytes / disk["write_bytes_per_s"]
        r.update(bytes_per_s=(reads + 1) * model_bytes / r["seconds"], percent_of_disk=100 * disk_s / r["seconds"])
        print(f"streaming phase {name}: {r['seconds']:.1f} s, {r['percent_of_disk']:.0f}% of the disk", flush=True)
    return res


def summary(runs: list[dict], in_bytes: int, out_bytes: int, disk: dict) -> dict:
    walls = sorted(r["wall_seconds"] for r in runs)
    median = walls[len(walls) // 2]
    disk_s = in_bytes / disk["read_bytes_per_s"] + out_bytes / disk["write_bytes_per_s"]
    return {"runs": runs, "median_wall_seconds": median, "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
            "bytes_per_s": (in_bytes + out_bytes) / median, "percent_of_disk": 100 * disk_s / median}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=18, help="decoder layers (18: 0.302 B parameters)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each tool (alternating)")
    ap.add_argument("--shard-mb", type=float, default=200.0, help="input shard size in MB")
    ap.add_argument("--disk-gib", type=float, default=1.0, help="size of the dd test file")
    ap.add_argument("--tmp", default=str(ROOT / "cache"), help="directory for the temporary files (deleted after)")
    ap.add_argument("--phase-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    load_before = os.getloadavg()
    if args.phase_child:
        phase_child(*args.phase_child)
        return
    Path(args.tmp).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_stream_io.", dir=args.tmp))
    try:
        disk = disk_bandwidth(work, args.disk_gib)
        print(f"disk: write {disk['write_bytes_per_s'] / 1e6:.0f} MB/s, read {disk['read_bytes_per_s'] / 1e6:.0f} MB/s "
              f"({disk['read_method']})", flush=True)
        a, b = work / "a", work / "b"
        info = make_checkpoint(a, args.layers, 0, int(args.shard_mb * 1e6))
        make_checkpoint(b, args.layers, 1, int(args.shard_mb * 1e6))
        runs: dict[str, list[dict]] = {"modeconn": [], "mergekit": []}
        cmds = commands(a, b, work)
        for r in range(args.repeats):
            for tool, (argv, out) in cmds.items():
                runs[tool].append(timed(argv, out))
                print(f"run {r + 1} {tool}: {runs[tool][-1]['wall_seconds']:.1f} s, peak RSS "
                      f"{runs[tool][-1]['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
        max_diff = compare(cmds["modeconn"][1], cmds["mergekit"][1])
        phase = phases(a, b, work, info["fp16_bytes"], disk)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    in_bytes, out_bytes = 2 * info["fp16_bytes"], info["fp16_bytes"]
    res = {"disk": disk, "model": {**LLAMA, "num_hidden_layers": args.layers, **info, "dtype_on_disk": "float16",
                                   "shard_mb": args.shard_mb},
           "streamed_bytes": {"read": in_bytes, "written": out_bytes},
           "modeconn": summary(runs["modeconn"], in_bytes, out_bytes, disk),
           "mergekit": summary(runs["mergekit"], in_bytes, out_bytes, disk),
           "max_abs_difference_modeconn_vs_mergekit": max_diff, "streaming_phase": phase,
           "threads": os.environ.get("OMP_NUM_THREADS"), "load_average_before": load_before,
           "load_average_after": os.getloadavg()}
    res["wall_ratio_modeconn_over_mergekit"] = res["modeconn"]["median_wall_seconds"] / res["mergekit"]["median_wall_seconds"]
    res["peak_rss_ratio_modeconn_over_mergekit"] = res["modeconn"]["peak_rss_bytes"] / res["mergekit"]["peak_rss_bytes"]
    print({k: res[k] for k in ("wall_ratio_modeconn_over_mergekit", "peak_rss_ratio_modeconn_over_mergekit")},
          {t: round(res[t]["percent_of_disk"], 1) for t in ("modeconn", "mergekit")})
    print(f"written {write_json('stream_io', res)}")


if __name__ == "__main__":
    main()
