"""Llama adapter (RMSNorm, SwiGLU, grouped-query attention, rotary embeddings on every head dim).

Layout: ``embed_tokens`` → layers (``input_layernorm`` → ``self_attn.{q,k,v}_proj`` → ``self_attn.o_proj``;
``post_attention_layernorm`` → ``mlp.{gate,up}_proj`` → ``act(gate)·up`` → ``mlp.down_proj``) → ``norm`` →
``lm_head`` (tied to ``embed_tokens`` iff ``tie_word_embeddings``).

GQA: ``num_key_value_heads`` K/V heads, each shared by ``num_attention_heads / num_key_value_heads``
consecutive query heads (``repeat_kv``). A K/V head's transform must act on the Q rows / O columns of every
query head of its group: one vo space per K/V head binds its V rows and the O columns of all its query heads.

Rotary: Llama rotates all ``head_dim`` dims of Q and K (``rotate_half``: dim ``i`` with ``i + head_dim/2``
at frequency ``θ_i``); no permutation of Q/K dims commutes with RoPE, so there are no qk permutation spaces
(only 2×2 rotation-commuting blocks per pair would be; a future group). The number of rotary dims is read
from the model's rotary embedding, so partial-rotary variants get qk spaces on the non-rotary dims.
"""

from __future__ import annotations

from torch import nn

from ._common import Walker, base_path, join, require, rotary_dims, token_inputs
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, KVHead, QueryHead, Stream, Structure

HEADS = ("lm_head", "score", "classifier", "qa_outputs")
CLASSES = ("LlamaModel", "LlamaForCausalLM", "LlamaForSequenceClassification", "LlamaForTokenClassification",
           "LlamaForQuestionAnswering")


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    W = Walker(model, prefix, "llama")
    base = base_path(model)
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    nkv = getattr(cfg, "num_key_value_heads", None) or nh
    require(nh % nkv == 0, "llama", "num_key_value_heads", nkv, f"a divisor of num_attention_heads={nh}")
    rep = nh // nkv
    writers = [W.param(join(base, "embed_tokens"), "weight", 1)]
    readers, norms, attentions, ffns = [], [], [], []
    for i in range(cfg.num_hidden_layers):
        lp = join(base, f"layers.{i}")
        attn = W.mod(f"{lp}.self_attn")
        q, k, v, o = (W.linear(f"{lp}.self_attn.{n}_proj") for n in "qkvo")
        gate, up, down = (W.linear(f"{lp}.mlp.{n}_proj") for n in ("gate", "up", "down"))
        hd = q.out_features // nh
        require(q.out_features == nh * hd and k.out_features == nkv * hd, "llama", "head_dim",
                getattr(cfg, "head_dim", None), "q/k/v projections of heads·head_dim rows")
        norms += [W.norm(f"{lp}.input_layernorm", [q, k, v]), W.norm(f"{lp}.post_attention_layernorm", [gate, up])]
        readers += [*q.cols(), *k.cols(), *v.cols(), *gate.cols(), *up.cols()]
        writers += [*o.rows(), *down.rows()]
        rot = rotary_dims(model, base, attn, hd)
        heads = tuple(QueryHead(q.rows(h * hd, hd), o.cols(h * hd, hd)) for h in range(nh))
        kv = tuple(KVHead(k.rows(j * hd, hd), v.rows(j * hd, hd), tuple(range(j * rep, (j + 1) * rep)))
                   for j in range(nkv))
        attentions.append(Attention(join(prefix, lp, "self_attn"), hd, heads, kv, rot, "half"))
        ffns.append(FFN(join(prefix, lp, "mlp"), up.out_features, up.rows(), down.cols(), gate.rows(),
                        str(cfg.hidden_act)))
    heads_ = W.heads_reading(HEADS, H)
    norms.append(W.norm(join(base, "norm"), heads_))
    readers += [c for h in heads_ for c in h.cols()]
    frozen = (*(h.bias for h in heads_ if h.bias), *W.buffers())
    stream = Stream(H, tuple(writers), tuple(norms), tuple(readers), is_output=not heads_)
    return Structure("llama", cfg.model_type, type(model).__name__, prefix, stream, tuple(attentions),
                     tuple(ffns), frozen=frozen)


ADAPTERS.register("llama")(Adapter("llama", describe, lambda m, g: token_inputs(m, g), CLASSES))
