"""Swin (transformers' ``SwinModel`` / ``SwinForImageClassification``): one channel space per stage.

Layout: a patch projection and ``embeddings.norm`` (optional absolute position embeddings) write stage 0; each stage
``i`` runs pre-norm windowed-attention blocks (``layernorm_before`` → Q/K/V → ``o_proj``; ``layernorm_after`` →
``fc1`` → GELU → ``fc2``) on its ``C_i`` channels; its ``downsample`` (patch merging) concatenates 2×2 neighbouring
tokens into ``[x₀ | x₁ | x₂ | x₃]`` (4·C_i), normalises them (``norm``) and ``reduction`` writes stage ``i + 1``.
The model ends with ``layernorm`` and average pooling; the classifier reads the pooled channels.

Spaces: each stage's channels (a hidden space; the last stage is the stream, the base model's output): the block
writers and norms, its readers, and the patch merging's ``norm`` parameters and ``reduction`` columns in each of
the four concatenated blocks alike; per block the heads — each head's column of the block's relative position bias
table moves with it (the bias is indexed by head) —, Q/K and V/O dims per head, and the FFN.
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, base_path, join, pixel_inputs
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, Hidden, KVHead, QueryHead, Slice, Stream, Structure

CLASSES = ("SwinModel", "SwinForImageClassification")
_MERGED = 4  # patch merging concatenates 2 × 2 tokens


def _block(W: Walker, cfg, prefix: str, bp: str, heads: int, space: dict, acc: dict) -> None:
    ap = f"{bp}.attention"
    q, k, v, o = (W.linear(f"{ap}.{n}") for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    up, down = W.linear(f"{bp}.mlp.fc1"), W.linear(f"{bp}.mlp.fc2")
    table = W.param(f"{ap}.relative_position_bias", "relative_position_bias_table", 1)
    space["writers"] += [*o.rows(), *down.rows()]
    space["readers"] += [*q.cols(), *k.cols(), *v.cols(), *up.cols()]
    space["norms"] += [f"{bp}.layernorm_before", f"{bp}.layernorm_after"]
    hd = q.out_features // heads
    qh = tuple(QueryHead(q.rows(h * hd, hd), o.cols(h * hd, hd), extra=(table.sub(h, 1),)) for h in range(heads))
    kv = tuple(KVHead(k.rows(h * hd, hd), v.rows(h * hd, hd), (h,)) for h in range(heads))
    acc["attentions"].append(Attention(join(prefix, ap), hd, qh, kv))
    acc["ffns"].append(FFN(join(prefix, bp, "mlp"), up.out_features, up.rows(), down.cols(), (), str(cfg.hidden_act)))


def _params(W: Walker, paths: list[str]) -> list[Slice]:
    """The weight and bias of the LayerNorms at ``paths``."""
    return [W.param(p, n, 0) for p in paths for n in ("weight", "bias") if getattr(W.mod(p), n, None) is not None]


def _merge(W: Walker, dp: str, C: int, space: dict) -> list[Slice]:
    """Stage ``i``'s side of its patch merging (four blocks of C in ``norm`` and ``reduction``'s columns); returns the
    reduction's rows, which write stage ``i + 1``."""
    red = W.linear(f"{dp}.reduction")
    space["merge_norms"] += [s.sub(j * C, C) for s in _params(W, [f"{dp}.norm"]) for j in range(_MERGED)]
    space["readers"] += [c for j in range(_MERGED) for c in red.cols(j * C, C)]
    return list(red.rows())


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    cls_name = next((c.__name__ for c in type(model).__mro__ if c.__name__ in CLASSES), None)
    if cls_name is None:
        raise UnsupportedOperationError(f"swin adapter: {type(model).__name__} is not supported "
                                        f"(supported: {', '.join(CLASSES)})")
    W = Walker(model, prefix, "swin")
    base = base_path(model)
    emb = join(base, "embeddings")
    first = [*W.linear(f"{emb}.patch_embeddings.projection").rows(), *(W.param(emb, n, 2) for n in
             ("position_embeddings", "mask_token") if isinstance(getattr(W.mod(emb), n, None), torch.Tensor))]
    spaces = [{"writers": first, "norms": [f"{emb}.norm"], "readers": [], "merge_norms": []}]
    acc: dict = {"attentions": [], "ffns": []}
    for i, depth in enumerate(cfg.depths):
        lp = join(base, f"encoder.layers.{i}")
        for j in range(depth):
            _block(W, cfg, prefix, f"{lp}.blocks.{j}", cfg.num_heads[i], spaces[-1], acc)
        if W.has(f"{lp}.downsample"):
            writes = _merge(W, f"{lp}.downsample", int(cfg.embed_dim * 2 ** i), spaces[-1])
            spaces.append({"writers": writes, "norms": [], "readers": [], "merge_norms": []})
    last = spaces[-1]
    heads = W.heads_reading(("classifier",), cfg.hidden_size)
    last["readers"] += [c for h in heads for c in h.cols()]
    hidden = tuple(Hidden(join(prefix, base, f"encoder.layers.{i}"), int(cfg.embed_dim * 2 ** i), tuple(s["writers"]),
                          tuple(s["readers"]), (*_params(W, s["norms"]), *s["merge_norms"]))
                   for i, s in enumerate(spaces[:-1]))
    norms = tuple(W.norm(p) for p in last["norms"])
    norms += (W.norm(join(base, "layernorm"), heads),)
    stream = Stream(cfg.hidden_size, (*last["writers"], *last["merge_norms"]), norms, tuple(last["readers"]),
                    is_output=not heads)
    return Structure("swin", cfg.model_type, type(model).__name__, prefix, stream, tuple(acc["attentions"]),
                     tuple(acc["ffns"]), hidden, frozen=(*W.buffers(), *(h.bias for h in heads if h.bias)),
                     notes=("one channel space per stage; relative position bias columns move with their heads",))



ADAPTERS.register("swin")(Adapter(
    "swin", describe, pixel_inputs, CLASSES,
    absorb="swin's stages change width through patch merging, whose LayerNorm normalises the concatenated tokens "
           "before the reduction: there is no single stream to rotate"))
