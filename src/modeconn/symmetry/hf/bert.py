"""BERT adapter (post-LN encoder; all-MiniLM-L6-v2 is a BertModel).

Layout: ``embeddings.{word,position,token_type}_embeddings`` summed → ``embeddings.LayerNorm`` → layers
(``attention.self.{query,key,value}`` → ``attention.output.dense`` → ``LN(x + ·)`` (``attention.output.LayerNorm``);
``intermediate.dense`` → act → ``output.dense`` → ``LN(x + ·)`` (``output.LayerNorm``)) → optional
``pooler.dense`` + tanh on the first token.

Post-LN: every LayerNorm sits *on* the residual stream (``x ← LN(x + f(x))``). LayerNorm commutes with
permutations, so the stream is one permutation space (every embedding, every block output, every
LayerNorm's weight and bias, every reader), but not with rotations: there is no orthogonal residual symmetry
and normalization absorption does not apply (the scale/shift cannot leave the stream).

Heads: ``BertModel`` returns the stream (``last_hidden_state``) and the pooler output, so by default the
stream and the pooler output are frozen (qk/vo/ffn spaces only; ``permute_outputs=True`` permutes the
stream too). ``BertForSequenceClassification``/``BertForMultipleChoice``: the pooler output is a hidden space
read by ``classifier``. ``BertForTokenClassification``/``BertForQuestionAnswering``: the head reads the
stream. ``BertForMaskedLM``: ``cls.predictions.transform`` (dense + act + LayerNorm) feeds ``decoder``, tied
to ``word_embeddings`` (then the transform's output space *is* the stream's permutation) and ``decoder.bias``
to ``cls.predictions.bias``. Decoders (``is_decoder``/``add_cross_attention``) are not supported.
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, base_path, join, require, token_inputs
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, Hidden, KVHead, QueryHead, Stream, Structure

POOLER_HEADS = {"BertForSequenceClassification": "classifier", "BertForMultipleChoice": "classifier"}
STREAM_HEADS = {"BertForTokenClassification": "classifier", "BertForQuestionAnswering": "qa_outputs"}
CLASSES = ("BertModel", *POOLER_HEADS, *STREAM_HEADS, "BertForMaskedLM")


def _is(model: nn.Module, name: str) -> bool:
    return any(c.__name__ == name for c in type(model).__mro__)


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    for f in ("is_decoder", "add_cross_attention"):
        require(not getattr(cfg, f, False), "bert", f, True, "False (encoder only)")
    pet = getattr(cfg, "position_embedding_type", "absolute")
    require(pet in (None, "absolute"), "bert", "position_embedding_type", pet, "'absolute'")
    cls_name = next((n for n in CLASSES if _is(model, n)), None)
    if cls_name is None:
        raise UnsupportedOperationError(f"bert adapter: {type(model).__name__} is not supported (supported: {', '.join(CLASSES)})")
    W = Walker(model, prefix, "bert")
    base = base_path(model)
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    hd = H // nh
    emb = join(base, "embeddings")
    writers = [W.param(f"{emb}.{n}_embeddings", "weight", 1) for n in ("word", "position", "token_type")]
    readers, norms, attentions, ffns, hidden = [], [], [], [], []
    frozen = list(W.buffers())
    layers = [join(base, f"encoder.layer.{i}") for i in range(cfg.num_hidden_layers)]
    pending = W.norm(f"{emb}.LayerNorm")  # each post-LN's readers are the next block's q/k/v
    for lp in layers:
        q, k, v = (W.linear(f"{lp}.attention.self.{n}") for n in ("query", "key", "value"))
        o = W.linear(f"{lp}.attention.output.dense")
        up, down = W.linear(f"{lp}.intermediate.dense"), W.linear(f"{lp}.output.dense")
        norms.append(_with_readers(pending, (q, k, v)))
        norms.append(W.norm(f"{lp}.attention.output.LayerNorm", [up]))
        pending = W.norm(f"{lp}.output.LayerNorm")
        readers += [*q.cols(), *k.cols(), *v.cols(), *up.cols()]
        writers += [*o.rows(), *down.rows()]
        heads = tuple(QueryHead(q.rows(h * hd, hd), o.cols(h * hd, hd)) for h in range(nh))
        kv = tuple(KVHead(k.rows(h * hd, hd), v.rows(h * hd, hd), (h,)) for h in range(nh))
        attentions.append(Attention(join(prefix, lp, "attention"), hd, heads, kv))
        ffns.append(FFN(join(prefix, lp, "intermediate"), up.out_features, up.rows(), down.cols(), (),
                        str(cfg.hidden_act)))
    stream_heads = []
    pooler = join(base, "pooler.dense")
    has_pooler = W.has(join(base, "pooler")) and W.mod(join(base, "pooler")) is not None
    if has_pooler:
        pool = W.linear(pooler)
        readers += pool.cols()
        if cls_name in POOLER_HEADS:
            clf = W.linear(POOLER_HEADS[cls_name])
            hidden.append(Hidden(join(prefix, base, "pooler"), pool.out_features, pool.rows(), clf.cols(),
                                 activation="tanh"))
            frozen += [clf.bias] if clf.bias else []
        else:
            frozen += [pool.bias] if pool.bias else []  # the pooler output is a model output
    if cls_name in STREAM_HEADS:
        head = W.linear(STREAM_HEADS[cls_name])
        stream_heads.append(head)
        frozen += [head.bias] if head.bias else []
    if cls_name == "BertForMaskedLM":
        t, ln, dec = "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.decoder"
        dense, decoder = W.linear(t), W.linear(dec)
        tied = W.mod(dec).weight is W.mod(f"{emb}.word_embeddings").weight
        stream_heads.append(dense)  # reads the stream; its rows and bias write the transform space
        frozen += [k for k in (decoder.bias, W.key("cls.predictions", "bias")) if k]
        lnorm = W.norm(ln, [decoder])
        hidden.append(Hidden(join(prefix, "cls.predictions.transform"), dense.out_features, dense.rows(),
                             decoder.cols(), lnorm.params(), str(cfg.hidden_act), joins_stream=tied))
    norms.append(_with_readers(pending, tuple(stream_heads)))
    readers += [c for h in stream_heads for c in h.cols()]
    is_output = cls_name == "BertModel"
    stream = Stream(H, tuple(writers), tuple(norms), tuple(readers), is_output=is_output, post_norm=True)
    return Structure("bert", cfg.model_type, type(model).__name__, prefix, stream, tuple(attentions), tuple(ffns),
                     tuple(hidden), frozen=tuple(frozen),
                     notes=("post-LN: LayerNorm parameters act on the stream; no orthogonal residual symmetry",))


def _with_readers(n, readers):
    from dataclasses import replace

    return replace(n, readers=tuple(readers))


def example(model: nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    x = token_inputs(model, gen)
    ids = x["input_ids"]
    n_types = getattr(model.config, "type_vocab_size", 1)
    x["token_type_ids"] = torch.randint(0, max(1, n_types), ids.shape, generator=gen)
    mask = torch.ones_like(ids)
    mask[-1, -2:] = 0  # some padding, so the attention mask path is exercised
    x["attention_mask"] = mask
    if _is(model, "BertForMultipleChoice"):
        x = {k: v[:, None].expand(-1, 2, -1).contiguous() for k, v in x.items()}
    return x


ADAPTERS.register("bert")(
    Adapter("bert", describe, example, CLASSES,
            absorb="BERT is post-LN (x ← LN(x + f(x))): each LayerNorm's scale and shift act on the residual stream "
                   "itself, so they cannot be folded into the next linear layers and LayerNorm cannot become a "
                   "parameter-free RMSNorm; there is no orthogonal residual symmetry to expose")
)
