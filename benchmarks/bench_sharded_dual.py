"""Per-rank peak memory of sharded dual matching (issue #21 items 2–3) on 1, 2 and 4 gloo processes, measured and
compared with the memory model (:mod:`modeconn.match.memory`).

For each size (GPT-NeoX decoders, random weights, fp32, vocabulary 1,024, context 64) the script writes two
Hugging Face checkpoints, absorbs them tensor by tensor (``stream_absorb``), weight-matches them once (the discrete
parts and the start; saved as safetensors), then runs ``dual_matching(..., shard=True)`` reading the absorbed
checkpoints: as one plain process, and under ``torchrun`` with 2 and 4 processes (gloo, loopback). Every process
first runs one step of the same sharded matching on a toy pair (d = 32, one layer: library imports, gloo, FSDP and
kernel initialisation — the fixed cost of a process, not modelled), then records its resident set just before the
call (``VmRSS``: interpreter, torch, the meta model, spec, loader) and its peak after it (``ru_maxrss``); the
*increment* is the difference — what the matching itself holds — and the model's prediction (``dual_memory``
without ``base``) is compared with it. The raw peak RSS is recorded too. All processes run with
``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors go back to the OS (glibc otherwise keeps large freed blocks in
its heap and the resident set stops tracking live memory) and one thread each.

Writes ``benchmarks/results/sharded_dual.json``, and ``docs/results/dual-memory/`` (``report.md`` and
``results.json``: the measured comparison and the Pythia table of :func:`modeconn.match.memory.pythia_table`).
``--report`` rewrites the latter from the former without measuring. Usage::

    python benchmarks/bench_sharded_dual.py [--steps 2] [--sizes S1,S2,S3,S4] [--merge] [--report]

``--merge`` keeps the sizes already in ``benchmarks/results/sharded_dual.json`` that this run does not measure (each
size records the commit it was measured at).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import write_json

SIZES = {
    "S1": {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 512},
    "S2": {"hidden_size": 256, "num_hidden_layers": 16, "num_attention_heads": 4, "intermediate_size": 1024},
    "S3": {"hidden_size": 512, "num_hidden_layers": 24, "num_attention_heads": 8, "intermediate_size": 2048},
    "S4": {"hidden_size": 1024, "num_hidden_layers": 20, "num_attention_heads": 16, "intermediate_size": 4096},
}
V, T, B = 1024, 64, 4
GROUPS = {"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible", "vo": "head_invertible",
          "ffn": "permutation"}
WORLDS = (1, 2, 4)


def _config(size: str) -> dict:
    return {**SIZES[size], "vocab_size": V, "max_position_embeddings": T, "rotary_pct": 0.25,
            "bos_token_id": 0, "eos_token_id": 0}


def setup(size: str, root: Path) -> None:
    """HF checkpoints hf0/hf1, absorbed abs0/abs1, the weight-matching element wm.safetensors, batches.pt."""
    import torch
    import transformers as T_
    from safetensors.torch import save_file

    from modeconn.match import weight_matching
    from modeconn.symmetry import hf
    from modeconn.symmetry.absorb_stream import AbsorbedView, stream_absorb

    for seed in (0, 1):
        torch.manual_seed(seed)
        T_.GPTNeoXForCausalLM(T_.GPTNeoXConfig(**_config(size))).save_pretrained(root / f"hf{seed}")
        stream_absorb(root / f"hf{seed}", root / f"abs{seed}")
    views = [AbsorbedView(root / f"hf{i}") for i in (0, 1)]
    spec = hf.hf_symmetry_spec(views[0].model, groups=GROUPS)
    wm = weight_matching(spec, views[0], views[1], seed=0, restarts=1, max_iter=2)
    save_file({k: v.contiguous() for k, v in wm.element.items()}, str(root / "wm.safetensors"))
    x = torch.randint(0, V, (3 * B, T), generator=torch.Generator().manual_seed(0))
    torch.save([(x[i:i + B], torch.roll(x[i:i + B], -1, 1)) for i in range(0, 3 * B, B)], root / "batches.pt")


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def warm_up() -> None:
    """One sharded step on a toy GPT-NeoX pair (d = 32, one layer), so that library and kernel initialisation is
    behind the baseline."""
    import torch
    import transformers as T_

    import modeconn as mc
    from modeconn.match import dual
    from modeconn.symmetry import hf

    cfg = T_.GPTNeoXConfig(**{**_config("S1"), "hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64})
    models = [mc.absorb_normalization(T_.GPTNeoXForCausalLM(cfg)) for _ in range(2)]
    spec = hf.hf_symmetry_spec(models[0], groups=GROUPS)
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    dual.dual_matching(spec, models[0], models[0].state_dict(), models[1].state_dict(), [(x, x)], shard=True,
                       steps=1, weight_alignment=spec.identity())


def worker(root: Path, steps: int, out: Path) -> None:
    """One rank: sharded dual matching of abs0/abs1; writes its record to ``out/rank{r}.json``."""
    import torch
    from safetensors.torch import load_file

    from modeconn.match import dual
    from modeconn.symmetry import hf
    from modeconn.symmetry.absorb_stream import AbsorbedView

    info = dual.init_distributed(device="cpu")
    model = AbsorbedView(root / "hf0").model
    spec = hf.hf_symmetry_spec(model, groups=GROUPS)
    loader = torch.load(root / "batches.pt", weights_only=True)
    wm = load_file(str(root / "wm.safetensors"))
    warm_up()
    gc.collect()
    before = _rss_kib()
    res = dual.dual_matching(spec, model, str(root / "abs0"), str(root / "abs1"), loader, shard=True, steps=steps,
                             lr=1e-3, weight_alignment=wm, seed=0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    record = {"rank": info.rank, "world": info.world_size, "rss_before_kib": before, "peak_kib": peak,
              "increment_kib": peak - before, "stored_bytes": res.stats["stored_bytes"], "seconds": res.stats["seconds"],
              "losses": res.history[0]}
    (out / f"rank{info.rank}.json").write_text(json.dumps(record))
    if info.initialized_here:
        torch.distributed.destroy_process_group()


def launch(root: Path, world: int, steps: int) -> list[dict]:
    out = Path(tempfile.mkdtemp(dir=root))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MALLOC_MMAP_THRESHOLD_": "65536"}
    me = [str(Path(__file__).resolve()), "--worker", str(root), "--out", str(out), "--steps", str(steps)]
    cmd = [sys.executable, *me] if world == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world), *me]
    subprocess.run(cmd, check=True, env=env, cwd=Path(__file__).resolve().parent)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def predicted(size: str, world: int, config: dict | None = None) -> dict:
    import torch

    from modeconn.match.memory import dual_memory

    return dual_memory(config or _config(size), world=world, dtype=torch.float32, batch=B, seq_len=T,
                       groups=GROUPS).to_json()


def repredict(payload: dict) -> dict:
    """``payload`` with every run's ``predicted`` and ``predicted_over_measured`` recomputed by the current model (so
    that ``--report`` reflects :mod:`modeconn.match.memory` as it is, not as it was when measured)."""
    for size, rec in payload["sizes"].items():
        for r in rec["runs"]:
            r["predicted"] = pred = predicted(size, r["world"], rec["config"])
            r["predicted_over_measured"] = (pred["total"] - pred["base"]) / r["peak_increment_bytes"]
    return payload


def measure(size: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"sharded-{size}-") as tmp:
        root = Path(tmp)
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--setup", size, "--root", str(root)],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        runs = {w: launch(root, w, steps) for w in WORLDS}
    one = max(r["increment_kib"] for r in runs[1]) * 1024
    one_raw = max(r["peak_kib"] for r in runs[1]) * 1024
    rows = []
    for w, ranks in runs.items():
        inc = max(r["increment_kib"] for r in ranks) * 1024
        raw = max(r["peak_kib"] for r in ranks) * 1024
        pred = predicted(size, w)
        rows.append({"world": w, "peak_increment_bytes": inc, "peak_rss_bytes": raw,
                     "rss_before_bytes": max(r["rss_before_kib"] for r in ranks) * 1024,
                     "increment_over_one_process_per_rank": inc / (one / w),
                     "rss_over_one_process_per_rank": raw / (one_raw / w),
                     "predicted": pred, "predicted_over_measured": (pred["total"] - pred["base"]) / inc,
                     "stored_bytes": ranks[0]["stored_bytes"], "seconds": max(r["seconds"] for r in ranks),
                     "losses": ranks[0]["losses"]})
        print(f"{size} W={w}: increment {inc / 2**20:.0f} MiB (one process / W: {one / w / 2**20:.0f} MiB), "
              f"predicted {(pred['total'] - pred['base']) / 2**20:.0f} MiB, peak RSS {raw / 2**20:.0f} MiB", flush=True)
    return {"config": _config(size), "params": _params(size), "steps": steps, "commit": _commit(), "runs": rows}


def _commit() -> str:
    """The repository's HEAD and whether its source tree differs from it (``+dirty``) — of this checkout: a run
    importing modeconn from elsewhere (``PYTHONPATH``) records the commit of that copy by hand."""
    here = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=here, capture_output=True, text=True)
    return head.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _params(size: str) -> int:
    from modeconn.match.memory import Shape

    return Shape.from_config(_config(size)).params


DOCS = Path(__file__).resolve().parents[1] / "docs" / "results" / "dual-memory"


def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f}"


def _gb(b: float) -> str:
    return f"{b / 1e9:,.1f}"


def report(payload: dict) -> Path:
    """``docs/results/dual-memory/report.md`` and ``results.json`` from the measurement ``payload``."""
    from modeconn.match.memory import pythia_table

    table = pythia_table()
    lines = ["# Sharded dual matching: per-rank memory, measured and modelled", "",
             "Written by `benchmarks/bench_sharded_dual.py` (measurements in `benchmarks/results/sharded_dual.json`); "
             "the model is `modeconn.match.memory.dual_memory` (terms in its docstring).", "",
             f"## Measured (CPU, gloo, fp32; batch {payload['batch']} × {payload['seq_len']} tokens, "
             f"{payload['steps']} steps)", "",
             "Increment: peak RSS minus the RSS just before `dual_matching` (after a warm-up step on a toy pair); "
             "*÷(1/N)*: the rank's increment over the one-process increment divided by N (target ≤ 1.2); "
             "*pred/meas*: the model's prediction over the measured increment (target within ±25%).", "",
             "| size | params | N | increment MiB | one-process/N MiB | ÷(1/N) | predicted MiB | pred/meas | "
             "peak RSS MiB | raw ÷(1/N) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for size, rec in payload["sizes"].items():
        one = rec["runs"][0]["peak_increment_bytes"]
        for r in rec["runs"]:
            pred = r["predicted"]["total"] - r["predicted"]["base"]
            lines.append(f"| {size} | {rec['params'] / 1e6:.1f} M | {r['world']} | {_mib(r['peak_increment_bytes'])} | "
                         f"{_mib(one / r['world'])} | {r['increment_over_one_process_per_rank']:.2f} | {_mib(pred)} | "
                         f"{r['predicted_over_measured']:.2f} | {_mib(r['peak_rss_bytes'])} | "
                         f"{r['rss_over_one_process_per_rank']:.2f} |")
    lines += ["", "## Pythia on 141 GB devices (bf16 endpoints, batch 8 × 2048 tokens, flash attention; model only)", "",
              "| model | params | devices | endpoints GB | leaf GB | transforms GB | activations GB | process GB | total GB | "
              "fits | largest batch that fits |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['model']} | {r['params'] / 1e9:.2f} B | {r['world']} | {_gb(r['endpoints'])} | {_gb(r['leaf'])} | "
                     f"{_gb(r['transforms'])} | {_gb(r['activations'])} | {_gb(r['process'])} | {_gb(r['total'])} | "
                     f"{'yes' if r['fits'] else 'no'} | {r['max_batch']} |")
    DOCS.mkdir(parents=True, exist_ok=True)
    (DOCS / "results.json").write_text(json.dumps({"measured": payload, "pythia": table}, indent=2))
    notes = DOCS / "notes.md"
    text = "\n".join(lines) + "\n" + (("\n" + notes.read_text()) if notes.exists() else "")
    (DOCS / "report.md").write_text(text)
    return DOCS / "report.md"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--setup")
    ap.add_argument("--worker", type=Path)
    ap.add_argument("--root", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--merge", action="store_true")
    args = ap.parse_args()
    if args.report:
        path = Path(__file__).resolve().parent / "results" / "sharded_dual.json"
        payload = repredict(json.loads(path.read_text()))
        path = write_json("sharded_dual", payload)
        return print(f"written to {path} and {report(payload)}")
    if args.setup:
        return setup(args.setup, args.root)
    if args.worker:
        return worker(args.worker, args.steps, args.out)
    path = Path(__file__).resolve().parent / "results" / "sharded_dual.json"
    sizes = json.loads(path.read_text())["sizes"] if args.merge and path.exists() else {}
    for s in args.sizes.split(","):
        sizes[s] = measure(s, args.steps)
    sizes = {s: sizes[s] for s in SIZES if s in sizes}
    path = write_json("sharded_dual", {"batch": B, "seq_len": T, "vocab": V, "dtype": "float32", "groups": GROUPS,
                                       "steps": args.steps, "worlds": list(WORLDS), "sizes": sizes,
                                       "malloc_mmap_threshold": 65536})
    print(f"written to {path} and {report(json.loads(path.read_text()))}")


if __name__ == "__main__":
    main()
