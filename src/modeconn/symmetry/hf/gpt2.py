"""GPT-2 adapter.

Layout: ``wte`` + ``wpe`` → blocks (``ln_1`` → ``attn.c_attn`` → ``attn.c_proj``; ``ln_2`` → ``mlp.c_fc`` → act →
``mlp.c_proj``) → ``ln_f`` → ``lm_head`` (tied to ``wte`` by default).

Every projection is a ``Conv1D`` whose weight is ``(in, out)`` (transposed w.r.t. ``nn.Linear``): output
units are *columns* (axis 1), inputs rows (axis 0). ``c_attn`` stacks ``[q | k | v]`` along the output axis,
each ``[heads × head_dim]`` (the forward splits the output in three, then views ``(heads, head_dim)``).

Tied ``wte``/``lm_head``: one tensor in two state-dict keys; the spec binds ``wte`` (it writes the stream)
and records ``lm_head.weight`` as its alias, so it is transformed once and stays tied.
No rotary embeddings: the qk spaces cover whole heads. Cross-attention (``add_cross_attention``) is not
supported.
"""

from __future__ import annotations

from torch import nn

from ._common import Walker, base_path, join, require, token_inputs
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, KVHead, QueryHead, Stream, Structure

HEADS = ("lm_head", "score", "classifier", "qa_outputs")
CLASSES = ("GPT2Model", "GPT2LMHeadModel", "GPT2ForSequenceClassification", "GPT2ForTokenClassification",
           "GPT2ForQuestionAnswering")


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    require(not getattr(cfg, "add_cross_attention", False), "gpt2", "add_cross_attention", True, "False")
    W = Walker(model, prefix, "gpt2")
    base = base_path(model)
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    hd = H // nh
    writers = [W.param(join(base, "wte"), "weight", 1), W.param(join(base, "wpe"), "weight", 1)]
    readers, norms, attentions, ffns = [], [], [], []
    for i in range(cfg.num_hidden_layers):
        lp = join(base, f"h.{i}")
        qkv, proj = W.linear(f"{lp}.attn.c_attn"), W.linear(f"{lp}.attn.c_proj")
        fc, fc_out = W.linear(f"{lp}.mlp.c_fc"), W.linear(f"{lp}.mlp.c_proj")
        require(qkv.out_features == 3 * H, "gpt2", "n_embd", H, "c_attn with 3·n_embd outputs")
        norms += [W.norm(f"{lp}.ln_1", [qkv]), W.norm(f"{lp}.ln_2", [fc])]
        readers += [*qkv.cols(), *fc.cols()]
        writers += [*proj.rows(), *fc_out.rows()]
        heads = tuple(QueryHead(qkv.rows(h * hd, hd), proj.cols(h * hd, hd)) for h in range(nh))
        kv = tuple(KVHead(qkv.rows(H + h * hd, hd), qkv.rows(2 * H + h * hd, hd), (h,)) for h in range(nh))
        attentions.append(Attention(join(prefix, lp, "attn"), hd, heads, kv))
        ffns.append(FFN(join(prefix, lp, "mlp"), fc.out_features, fc.rows(), fc_out.cols(), (),
                        str(cfg.activation_function)))
    heads_ = W.heads_reading(HEADS, H)
    norms.append(W.norm(join(base, "ln_f"), heads_))
    readers += [c for h in heads_ for c in h.cols()]
    frozen = (*(h.bias for h in heads_ if h.bias), *W.buffers())
    stream = Stream(H, tuple(writers), tuple(norms), tuple(readers), is_output=not heads_)
    return Structure("gpt2", cfg.model_type, type(model).__name__, prefix, stream, tuple(attentions),
                     tuple(ffns), frozen=frozen)


ADAPTERS.register("gpt2")(Adapter("gpt2", describe, lambda m, g: token_inputs(m, g), CLASSES))
