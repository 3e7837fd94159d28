"""What the mergekit parity tests share: mergekit's own entry point on a recipe, and a checkpoint's tensors."""

from __future__ import annotations

from pathlib import Path

import torch

from modeconn.io.lazy import LazyCheckpoint


def run_mergekit(recipe: dict, out: Path, seed: int, *, copy_tokenizer: bool = False) -> None:
    """``mergekit-yaml``'s merge (``mergekit.merge.run_merge``) of ``recipe`` into ``out`` on the CPU, seeded."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    run_merge(MergeConfiguration.model_validate(recipe), str(out),
              MergeOptions(random_seed=seed, copy_tokenizer=copy_tokenizer, quiet=True, out_shard_size=1 << 30))


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint directory ``path``, by name."""
    ckpt = LazyCheckpoint(path)
    return {k: ckpt[k].clone() for k in ckpt}
