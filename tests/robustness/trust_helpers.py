"""Helpers shared by the trust modules of issue #14 (``test_trust_*.py``): one trained pair of small digits MLPs
(trained once per process), their checkpoint directories, and a quick ``run_path`` call."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from modeconn.data import load_dataset
from modeconn.recipes.path import run_path
from modeconn.io import save_checkpoint
from modeconn.models import build_model
from modeconn.train import TrainConfig, fit

# LLPF settings that run in about a second on the digits MLPs (6 ticks, ≤ 5 refinement steps each)
FAST_LLPF = {"ticks": 6, "step": 0.3, "lr": 0.05, "threshold": 0.3, "min_steps": 1, "max_steps": 5, "batch_size": 64,
             "checkpoint_every": 2}
# a schedule far too short for its step: the last segment jumps ~85 % of the way to B
TRUNCATED_LLPF = {"ticks": 3, "step": 0.05, "lr": 0.05, "threshold": 0.3, "min_steps": 1, "max_steps": 3, "batch_size": 64}


@cache
def digits():
    return load_dataset("digits")


def mlp(seed: int = 0):
    return build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=2, width=32, seed=seed)


@cache
def _trained_state_dicts() -> tuple[dict, dict]:
    sds = []
    for seed in (0, 1):
        m = mlp(seed)
        fit(m, digits().train, TrainConfig(epochs=6, lr=0.05, batch_size=64, seed=seed, weight_decay=0.0,
                                           warmup_epochs=0), progress=False)
        sds.append({k: v.detach().clone() for k, v in m.state_dict().items()})
    return sds[0], sds[1]


def trained_pair():
    """Two independently trained digits MLPs (fresh module objects; the weights are computed once per process)."""
    out = []
    for seed, sd in zip((0, 1), _trained_state_dicts(), strict=True):
        m = mlp(seed)
        m.load_state_dict(sd)
        out.append(m.eval())
    return out[0], out[1]


def save_pair(root: Path) -> tuple[Path, Path]:
    a, b = trained_pair()
    return save_checkpoint(root / "a", a), save_checkpoint(root / "b", b)


def with_train_limit(n: int):
    """The digits bundle with only the first ``n`` training examples (as ``--limit-train n`` would give)."""
    b = digits()
    return replace(b, train=TensorDataset(*(t[:n] for t in b.train.tensors)))


def quick_run(out: Path, method: str = "llpf", options: dict | None = None, *, bundle=None, **kw) -> dict:
    """``run_path`` on the trained pair with a small evaluation (200 examples per split, 1 sub-point)."""
    a, b = trained_pair()
    opts = dict(FAST_LLPF) if options is None and method == "llpf" else dict(options or {})
    kw = {"eval_limit": 200, "sub_points": 1, "bn_batches": 1, "log": lambda s: None, **kw}
    return run_path(out, method, a, b, bundle or digits(), opts, **kw)


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (relative path → bytes)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def has_nan(point: dict[str, torch.Tensor]) -> bool:
    return any(bool(torch.isnan(v).any()) for v in point.values() if v.is_floating_point())
