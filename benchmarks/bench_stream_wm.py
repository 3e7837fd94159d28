"""Streaming weight matching of two ~1B-parameter checkpoints (issue #8): wall time and peak RSS vs the model size.

Two GPT-NeoX checkpoints of Pythia-1B's shape (hidden 2048, 16 layers, 8 heads, FFN 8192, vocab 50304, rotary 25%,
untied embed_in / embed_out: 1.01 B parameters) with random init, fp16 on disk in ~1 GB shards plus config.json and
model.safetensors.index.json. They are written without ever holding a model in memory: every tensor is drawn from a
seeded generator when the shard writer asks for it (:func:`modeconn.io.lazy.write_like` on a
:meth:`~modeconn.io.lazy.ShardLayout.plan`), so generation peaks at one fp32 tensor.

Each measured step runs in a fresh subprocess and reports its own peak RSS (``VmHWM``, resident file-mapped pages
included):

* ``baseline``: Python + torch + modeconn imported, the spec built from config.json and the shard headers (for a
  table family such as GPT-NeoX without transformers' model classes: :mod:`modeconn.symmetry.hf.skeleton`) — what
  every streaming run pays before touching a weight;
* ``wm``: that plus streaming weight matching — ``restarts=1`` and ``--max-iter`` sweeps after the greedy start, or
  with ``--defaults`` every option at its default (restarts from kicks until one fails to beat the best, sweeps until
  one changes nothing); torch's threads: ``OMP_NUM_THREADS`` (the JSON records it, and the CPU seconds of the step);
* ``apply``: that plus writing B aligned (:func:`modeconn.stream.stream_apply`), spot-checked against
  ``spec.apply_tensor`` on a few tensors.

Target: peak RSS of ``wm`` < 25% of one model's fp32 size (4.05 GB). Writes ``benchmarks/results/stream_wm.json``;
the checkpoints live in a temporary directory under ``--tmp`` (default /tmp) and are deleted afterwards. Usage::

    python benchmarks/bench_stream_wm.py [--max-iter 2 | --defaults] [--layers 16] [--shard-gb 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import write_json

PYTHIA_1B = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 8, "intermediate_size": 8192,
             "vocab_size": 50304, "rotary_pct": 0.25, "max_position_embeddings": 2048, "tie_word_embeddings": False,
             "use_parallel_residual": True, "bos_token_id": 0, "eos_token_id": 0}


HEAVY = ("transformers.modeling_utils", "torch._dynamo", "torch.distributed.tensor", "torchvision", "scipy")
"""Modules whose presence in a step's process the JSON records (the model classes pull in the first four)."""


def peak_rss_bytes() -> int:
    """This process's peak resident set size: ``VmHWM`` of /proc/self/status (Linux), else ``ru_maxrss``.

    ``ru_maxrss`` is not used on Linux: a child started with fork + exec inherits the parent's high-water mark
    (the kernel carries the forked copy's peak across exec), so it would report the generator's peak."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_checkpoint(out: Path, layers: int, seed: int, shard_bytes: int) -> dict:
    """A random Pythia-1B-shaped GPT-NeoX checkpoint in fp16, written tensor by tensor."""
    import transformers

    from modeconn.io.lazy import ShardLayout, write_like
    from modeconn.io.hf import checkpoint_tensor_names

    cfg = transformers.GPTNeoXConfig(**{**PYTHIA_1B, "num_hidden_layers": layers})
    cfg.architectures = ["GPTNeoXForCausalLM"]
    cfg.dtype = "float16"
    with torch.device("meta"):
        skeleton = transformers.GPTNeoXForCausalLM(cfg)
    names = checkpoint_tensor_names(skeleton)  # the names save_pretrained writes (embed_out.weight)
    shapes = {names[k]: (torch.float16, tuple(t.shape)) for k, t in skeleton.state_dict().items()}
    gen = torch.Generator().manual_seed(seed)

    def produce(key: str) -> torch.Tensor:
        shape = shapes[key][1]
        t = torch.randn(shape, generator=gen) * 0.02
        if key.endswith(("layernorm.weight", "layer_norm.weight")):
            t += 1.0
        return t.half()

    files = {"config.json": json.loads(cfg.to_json_string())}
    write_like(out, ShardLayout.plan(shapes, shard_bytes), produce, files=files)
    n = sum(torch.Size(s).numel() for _, s in shapes.values())
    return {"parameters": n, "fp16_bytes": 2 * n, "fp32_bytes": 4 * n,
            "shards": sorted(p.name for p in out.glob("*.safetensors"))}


def child(step: str, a: str, b: str, work: str, max_iter: int | None) -> None:
    """One measured step in this (fresh) process; prints one JSON line with its numbers."""
    t0 = time.perf_counter()
    from modeconn.io.lazy import LazyCheckpoint
    from modeconn.stream import hf_checkpoint_spec, stream_apply, stream_weight_matching

    spec = hf_checkpoint_spec(a)
    out: dict = {"step": step, "import_and_spec_seconds": time.perf_counter() - t0, "spaces": len(spec.spaces)}
    if step == "wm":
        stamps: list = []

        def progress(stage: str, done: int, total: int) -> None:
            if done == 0:
                stamps.append((stage, time.perf_counter() - t0))
                print(f"[{time.perf_counter() - t0:7.1f} s] {stage} ({total} spaces)", file=sys.stderr, flush=True)

        t, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        opts = {} if max_iter is None else {"restarts": 1, "max_iter": max_iter}
        res = stream_weight_matching(spec, a, b, progress=progress, **opts)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        st = res.stats
        out.update(seconds=time.perf_counter() - t, cpu_seconds=r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime,
                   threads=torch.get_num_threads(), objective=res.objective, history=res.history,
                   upper_bound=st["upper_bound"], lap_seconds=st["lap_seconds"], lap_calls=st["lap_calls"],
                   lap_skipped=st["lap_skipped"], sweeps=st["sweeps"], restarts_run=st["restarts_run"],
                   restarts_stopped_by=st["restarts_stopped_by"], stages=stamps)
        from safetensors.torch import save_file

        save_file({s: p.contiguous() for s, p in res.element.items()}, f"{work}/element.safetensors")
    elif step == "apply":
        from safetensors.torch import load_file

        g = load_file(f"{work}/element.safetensors")
        t = time.perf_counter()
        stream_apply(spec, b, g, f"{work}/b_aligned")
        out["seconds"] = time.perf_counter() - t
        src, dst = LazyCheckpoint(b), LazyCheckpoint(f"{work}/b_aligned")
        checked = [k for k in dst if "embed" in k or k.endswith("layers.3.mlp.dense_h_to_4h.weight")]
        for k in checked:
            assert torch.equal(dst[k], spec.apply_tensor(k, src[k], g)), k
        out["spot_checked"] = checked
    out["peak_rss_bytes"] = peak_rss_bytes()
    out["heavy_modules_imported"] = sorted(m for m in HEAVY if m in sys.modules)
    print(json.dumps(out), flush=True)


def run_child(step: str, a: Path, b: Path, work: Path, max_iter: int | None) -> dict:
    cmd = [sys.executable, __file__, "--child", step, "--a", str(a), "--b", str(b), "--work", str(work),
           *(("--defaults",) if max_iter is None else ("--max-iter", str(max_iter)))]
    t = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["wall_seconds"] = time.perf_counter() - t
    gib = res["peak_rss_bytes"] / 2**30
    print(f"{step}: {res['wall_seconds']:.1f} s wall, peak RSS {gib:.3f} GiB", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-iter", type=int, default=2, help="coordinate-descent sweeps after the greedy start")
    ap.add_argument("--defaults", action="store_true", help="weight matching at its defaults (no --max-iter)")
    ap.add_argument("--layers", type=int, default=16, help="transformer layers (16: Pythia-1B)")
    ap.add_argument("--shard-gb", type=float, default=1.0, help="maximum shard size in GB")
    ap.add_argument("--tmp", default="/tmp", help="where the checkpoints are written (and deleted afterwards)")
    ap.add_argument("--child", choices=["baseline", "wm", "apply"], help=argparse.SUPPRESS)
    ap.add_argument("--a", help=argparse.SUPPRESS)
    ap.add_argument("--b", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    max_iter = None if args.defaults else args.max_iter
    if args.child:
        child(args.child, args.a, args.b, args.work, max_iter)
        return

    work = Path(tempfile.mkdtemp(prefix="bench_stream_wm.", dir=args.tmp))
    try:
        t = time.perf_counter()
        a, b = work / "a", work / "b"
        info = make_checkpoint(a, args.layers, 0, int(args.shard_gb * 1e9))
        make_checkpoint(b, args.layers, 1, int(args.shard_gb * 1e9))
        gen_seconds = time.perf_counter() - t
        print(f"two checkpoints of {info['parameters'] / 1e9:.3f} B parameters ({info['shards']}) written in "
              f"{gen_seconds:.0f} s; generator peak RSS {peak_rss_bytes() / 2**30:.3f} GiB", flush=True)
        steps = {s: run_child(s, a, b, work, max_iter) for s in ("baseline", "wm", "apply")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wm, base = steps["wm"], steps["baseline"]
    fp32 = info["fp32_bytes"]
    res = {
        "model": {**PYTHIA_1B, "num_hidden_layers": args.layers, **info, "dtype_on_disk": "float16"},
        "settings": {**({"weight_matching": "defaults"} if max_iter is None else {"restarts": 1, "max_iter": max_iter}),
                     "shard_gb": args.shard_gb, "chunk": 1 << 20, "threads": os.environ.get("OMP_NUM_THREADS")},
        "generation_seconds": gen_seconds,
        "steps": steps,
        "wm_peak_rss_gib": wm["peak_rss_bytes"] / 2**30,
        "baseline_peak_rss_gib": base["peak_rss_bytes"] / 2**30,
        "apply_peak_rss_gib": steps["apply"]["peak_rss_bytes"] / 2**30,
        "model_fp32_gib": fp32 / 2**30,
        "wm_peak_rss_over_fp32_model": wm["peak_rss_bytes"] / fp32,
        "wm_peak_rss_above_baseline_over_fp32_model": (wm["peak_rss_bytes"] - base["peak_rss_bytes"]) / fp32,
        "target": "peak RSS of the wm step < 25% of one model's fp32 size",
        "target_met": wm["peak_rss_bytes"] < 0.25 * fp32,
    }
    print({k: v for k, v in res.items() if k not in ("steps", "model")})
    print(f"written {write_json('stream_wm', res)}")


if __name__ == "__main__":
    main()
