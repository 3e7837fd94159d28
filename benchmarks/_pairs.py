"""A Llama-shaped checkpoint pair whose right alignment is known, for the merge benchmarks (issue #38).

A: random init (N(0, 0.02²), norms 1), written tensor by tensor in Hugging Face shards (never a model in memory).
B: a permuted, perturbed copy of A — ``g·A + noise·0.02·N(0, 1)`` for a random element ``g`` of the checkpoint's
permutation spec (:func:`modeconn.stream.hf_checkpoint_spec`: residual, per-head q·k and v·o, FFN spaces), norms
left at 1 — so aligning B to A must find ``g⁻¹``. :func:`recovered` checks a merge of the pair against A without
the element: where ``g⁻¹`` was found, every unit of the merge is ``A + noise/2`` (cosine ≈ 1 with A's unit);
where a unit was mismatched it is the average of two unrelated units (cosine ≈ 0.7).

Shapes: :data:`LLAMA2_7B` at ``scale = 1`` (6.74 B parameters, 13.5 GB in bf16); ``scale`` shrinks the head
dimension, the FFN and the vocabulary (32 heads kept), ``layers`` the depth, for smoke tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

LLAMA2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
             "num_hidden_layers": 32, "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
             "tie_word_embeddings": False}
HUB_SHARD_BYTES = 10 * 10**9 // 2
"""Llama-2-7b-hf's safetensors shards are ≤ 10 GB in fp32 terms: two shards of ≤ 5 GB of bf16 each side."""
MATCH_COS = 0.9
"""A merged unit whose cosine with A's unit of the same index is above this came from an aligned pair."""


def llama_config(scale: float = 1.0, layers: int | None = None) -> dict:
    """:data:`LLAMA2_7B` with head dimension, FFN and vocabulary scaled by ``scale`` and ``layers`` decoder layers."""
    heads = LLAMA2_7B["num_attention_heads"]
    head_dim = max(4, 2 * round(64 * scale))
    return {**LLAMA2_7B, "hidden_size": heads * head_dim,
            "intermediate_size": max(16, round(LLAMA2_7B["intermediate_size"] * scale)),
            "vocab_size": max(64, round(LLAMA2_7B["vocab_size"] * scale)),
            "num_hidden_layers": layers or LLAMA2_7B["num_hidden_layers"]}


def _write_a(out: Path, cfg: dict, seed: int, shard_bytes: int, dtype: torch.dtype) -> dict:
    import transformers

    from modeconn.io.lazy import ShardLayout, write_like

    config = transformers.LlamaConfig(**cfg)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = str(dtype).removeprefix("torch.")
    with torch.device("meta"):
        skeleton = transformers.LlamaForCausalLM(config)
    shapes = {k: (dtype, tuple(t.shape)) for k, t in skeleton.state_dict().items()}
    gen = torch.Generator().manual_seed(seed)

    def produce(key: str) -> torch.Tensor:
        if key.endswith("norm.weight"):
            return torch.ones(shapes[key][1], dtype=dtype)
        return (torch.randn(shapes[key][1], generator=gen) * 0.02).to(dtype)

    write_like(out, ShardLayout.plan(shapes, shard_bytes), produce,
               files={"config.json": json.loads(config.to_json_string())})
    n = sum(torch.Size(s).numel() for _, s in shapes.values())
    return {"parameters": n, "bytes": n * dtype.itemsize, "fp32_bytes": 4 * n,
            "shards": len(list(out.glob("*.safetensors")))}


def write_pair(work: Path, cfg: dict, *, seed: int = 0, noise: float = 0.1, shard_bytes: int = HUB_SHARD_BYTES,
               dtype: torch.dtype = torch.bfloat16) -> dict:
    """``work/a``, ``work/b`` (B = g·A perturbed) and ``work/planted.safetensors`` (g); returns the pair's sizes."""
    from safetensors.torch import save_file

    from modeconn.io.lazy import LazyCheckpoint, write_like
    from modeconn.stream import hf_checkpoint_spec

    a, b = work / "a", work / "b"
    info = _write_a(a, cfg, seed, shard_bytes, dtype)
    spec = hf_checkpoint_spec(a)
    g = spec.random_element(seed=seed + 1)
    src = LazyCheckpoint(a)
    gen = torch.Generator().manual_seed(seed + 2)

    def produce(key: str) -> torch.Tensor:
        t = spec.apply_tensor(key, src[key].float(), g)
        if not key.endswith("norm.weight"):
            t += noise * 0.02 * torch.randn(t.shape, generator=gen)
        return t.to(dtype)

    write_like(b, src, produce, files={"config.json": a / "config.json"}, inputs=[a])
    save_file({s: p.contiguous() for s, p in g.items()}, work / "planted.safetensors")
    return {**info, "noise": noise, "dtype": str(dtype), "spaces": len(spec.spaces)}


def recovered(merged: Path, a: Path) -> dict:
    """Per 2-D tensor, the fraction of its rows and of its columns whose cosine with A's row / column of the same
    index is above :data:`MATCH_COS` (1.0 everywhere: the planted permutation was recovered exactly)."""
    from modeconn.io.lazy import LazyCheckpoint

    m, ref = LazyCheckpoint(merged), LazyCheckpoint(a)
    fractions = {}
    for key in ref:
        x, y = m[key].float(), ref[key].float()
        if x.dim() != 2:
            continue
        rows = torch.nn.functional.cosine_similarity(x, y, dim=1)
        cols = torch.nn.functional.cosine_similarity(x, y, dim=0)
        fractions[key] = min(float((rows > MATCH_COS).float().mean()), float((cols > MATCH_COS).float().mean()))
    return {"min_fraction": min(fractions.values()), "mean_fraction": sum(fractions.values()) / len(fractions),
            "tensors_not_recovered": sorted(k for k, v in fractions.items() if v < 1.0)[:20]}
