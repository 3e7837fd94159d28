"""GPT-NeoX (Pythia) adapter.

Layout: ``embed_in`` → layers (``input_layernorm`` → fused ``attention.query_key_value`` → ``attention.dense``;
``post_attention_layernorm`` → ``mlp.dense_h_to_4h`` → act → ``mlp.dense_4h_to_h``) → ``final_layer_norm`` →
``lm_head`` (untied by default). Parallel (``use_parallel_residual=True``: ``x + attn(ln1(x)) + mlp(ln2(x))``)
and sequential residuals have the same symmetries: both norms read the stream, both blocks write it.

Fused QKV: the output rows of ``query_key_value`` are laid out ``[heads × (q, k, v) × head_dim]`` (the
forward views them as ``(heads, 3·head_dim)`` and chunks the last dim), so head ``h``'s query rows are
``[3h·hd, 3h·hd + hd)``, its keys the next ``hd`` and its values the ``hd`` after.

Rotary: the first ``rotary_ndims = int(head_dim · rotary_pct)`` dims of each Q/K head are rotated with
``rotate_half`` (dim ``i`` with dim ``i + rotary_ndims/2`` at frequency ``θ_i``). A permutation of these dims
never commutes with RoPE (even moving whole pairs moves them to another frequency), so the qk permutation
spaces cover the ``head_dim − rotary_ndims`` non-rotary dims only; rotary dims stay frozen.
"""

from __future__ import annotations

from torch import nn

from ._common import Walker, base_path, join, require, rotary_dims, token_inputs
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, KVHead, QueryHead, Stream, Structure

HEADS = ("lm_head", "score", "classifier", "qa_outputs")
CLASSES = ("GPTNeoXModel", "GPTNeoXForCausalLM", "GPTNeoXForSequenceClassification", "GPTNeoXForTokenClassification",
           "GPTNeoXForQuestionAnswering")


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    W = Walker(model, prefix, "gpt_neox")
    base = base_path(model)
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    require(H % nh == 0, "gpt_neox", "hidden_size", H, f"a multiple of num_attention_heads={nh}")
    hd = H // nh
    writers = [W.param(join(base, "embed_in"), "weight", 1)]
    readers, norms, attentions, ffns = [], [], [], []
    for i in range(cfg.num_hidden_layers):
        lp = join(base, f"layers.{i}")
        qkv, dense = W.linear(f"{lp}.attention.query_key_value"), W.linear(f"{lp}.attention.dense")
        up, down = W.linear(f"{lp}.mlp.dense_h_to_4h"), W.linear(f"{lp}.mlp.dense_4h_to_h")
        require(qkv.out_features == 3 * H, "gpt_neox", "hidden_size", H, "fused QKV of 3·hidden_size rows")
        norms += [W.norm(f"{lp}.input_layernorm", [qkv]), W.norm(f"{lp}.post_attention_layernorm", [up])]
        readers += [*qkv.cols(), *up.cols()]
        writers += [*dense.rows(), *down.rows()]
        rot = rotary_dims(model, base, W.mod(f"{lp}.attention"), hd)
        heads = tuple(QueryHead(qkv.rows(3 * h * hd, hd), dense.cols(h * hd, hd)) for h in range(nh))
        kv = tuple(KVHead(qkv.rows(3 * h * hd + hd, hd), qkv.rows(3 * h * hd + 2 * hd, hd), (h,)) for h in range(nh))
        attentions.append(Attention(join(prefix, lp, "attention"), hd, heads, kv, rot, "half"))
        ffns.append(FFN(join(prefix, lp, "mlp"), up.out_features, up.rows(), down.cols(), (), str(cfg.hidden_act)))
    heads_ = W.heads_reading(HEADS, H)
    norms.append(W.norm(join(base, "final_layer_norm"), heads_))
    readers += [c for h in heads_ for c in h.cols()]
    frozen = (*(h.bias for h in heads_ if h.bias), *W.buffers())
    stream = Stream(H, tuple(writers), tuple(norms), tuple(readers), is_output=not heads_)
    return Structure("gpt_neox", cfg.model_type, type(model).__name__, prefix, stream, tuple(attentions),
                     tuple(ffns), frozen=frozen)


ADAPTERS.register("gpt_neox")(
    Adapter("gpt_neox", describe, lambda m, g: token_inputs(m, g), CLASSES)
)
