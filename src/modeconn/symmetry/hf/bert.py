"""Post-LN encoders: BERT (all-MiniLM-L6-v2 is a BertModel), RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT — one :class:`PostLN`
table entry each (:data:`POST_LN`); BERT's names are described below, the others differ only in names and heads.

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

from dataclasses import dataclass, field

import torch
from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, base_path, join, require, token_inputs
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, Hidden, KVHead, QueryHead, Stream, Structure


@dataclass(frozen=True)
class PostLN:
    """One post-LN encoder family (names relative to the base model unless said otherwise).

    ``pooled``: per task class, ``(dense, out, activation)`` — a hidden space written by ``dense`` (reading the
    stream's first token; ``None``: the base model's ``pooler.dense``) and read by the top-level ``out``.
    ``stream_heads``: per task class, the top-level head reading the stream. ``mlm``: per class, the masked-LM
    head ``(dense, LayerNorm, decoder, extra bias key)`` (top-level paths); the decoder may be tied to the word
    embeddings."""

    family: str
    base_classes: tuple[str, ...]
    embeddings: tuple[str, ...] = ("word_embeddings", "position_embeddings", "token_type_embeddings")
    layers: str = "encoder.layer"
    qkv: tuple[str, str, str] = ("attention.self.query", "attention.self.key", "attention.self.value")
    o: str = "attention.output.dense"
    attn_norm: str = "attention.output.LayerNorm"
    up: str = "intermediate.dense"
    down: str = "output.dense"
    out_norm: str = "output.LayerNorm"
    attn_path: str = "attention"
    ffn_path: str = "intermediate"
    pooled: dict[str, tuple[str | None, str, str]] = field(default_factory=dict)
    stream_heads: dict[str, str] = field(default_factory=dict)
    mlm: dict[str, tuple[str, str, str, str]] = field(default_factory=dict)
    activation: str = "hidden_act"

    @property
    def classes(self) -> tuple[str, ...]:
        return (*self.base_classes, *self.pooled, *self.stream_heads, *self.mlm)


def _is(model: nn.Module, name: str) -> bool:
    return any(c.__name__ == name for c in type(model).__mro__)


def _layer(W: Walker, t: PostLN, cfg, prefix: str, lp: str, pending, acc: dict) -> object:
    """Bind one layer; returns the pending LayerNorm (read by the next layer's Q/K/V or the heads)."""
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    hd = H // nh
    q, k, v = (W.linear(join(lp, n)) for n in t.qkv)
    o = W.linear(join(lp, t.o))
    up, down = W.linear(join(lp, t.up)), W.linear(join(lp, t.down))
    acc["norms"] += [_with_readers(pending, (q, k, v)), W.norm(join(lp, t.attn_norm), [up])]
    acc["readers"] += [*q.cols(), *k.cols(), *v.cols(), *up.cols()]
    acc["writers"] += [*o.rows(), *down.rows()]
    heads = tuple(QueryHead(q.rows(h * hd, hd), o.cols(h * hd, hd)) for h in range(nh))
    kv = tuple(KVHead(k.rows(h * hd, hd), v.rows(h * hd, hd), (h,)) for h in range(nh))
    acc["attentions"].append(Attention(join(prefix, lp, t.attn_path), hd, heads, kv))
    acc["ffns"].append(FFN(join(prefix, lp, t.ffn_path), up.out_features, up.rows(), down.cols(), (),
                           str(getattr(cfg, t.activation))))
    return W.norm(join(lp, t.out_norm))


def _parent(path: str, levels: int) -> str:
    parts = path.split(".")
    return ".".join(parts[:-levels]) if len(parts) > levels else path


def _heads(W: Walker, t: PostLN, cls_name: str, base: str, emb: str, prefix: str, acc: dict) -> list:
    """Bind the pooler, the pooled / stream / masked-LM heads of ``cls_name``; returns the stream's heads."""
    cfg = W.model.config
    stream_heads = []
    pooler = join(base, "pooler")
    pool = W.linear(f"{pooler}.dense") if W.has(pooler) and W.mod(pooler) is not None else None
    if pool is not None:
        acc["readers"] += pool.cols()
    if cls_name in t.pooled:
        dense_path, out_path, act = t.pooled[cls_name]
        dense = pool if dense_path is None else W.linear(dense_path)
        if dense_path is not None:
            stream_heads.append(dense)
        out = W.linear(out_path)
        name = join(prefix, pooler) if dense_path is None else join(prefix, _parent(dense_path, 1))
        acc["hidden"].append(Hidden(name, dense.out_features, dense.rows(), out.cols(), activation=act))
        acc["frozen"] += [out.bias] if out.bias else []
    elif pool is not None:
        acc["frozen"] += [pool.bias] if pool.bias else []  # the pooler output is a model output
    if cls_name in t.stream_heads:
        head = W.linear(t.stream_heads[cls_name])
        stream_heads.append(head)
        acc["frozen"] += [head.bias] if head.bias else []
    if cls_name in t.mlm:
        dpath, ln, dec, extra_bias = t.mlm[cls_name]
        dense, decoder = W.linear(dpath), W.linear(dec)
        tied = W.mod(dec).weight is W.mod(f"{emb}.{t.embeddings[0]}").weight
        stream_heads.append(dense)  # reads the stream; its rows and bias write the transform space
        acc["frozen"] += [k for k in (decoder.bias, W.key("", extra_bias)) if k]
        lnorm = W.norm(ln, [decoder])
        acc["hidden"].append(Hidden(join(prefix, _parent(dpath, 1)), dense.out_features, dense.rows(), decoder.cols(),
                                    lnorm.params(), str(getattr(cfg, t.activation)), joins_stream=tied))
    return stream_heads


def describe_post_ln(t: PostLN, model: nn.Module, prefix: str) -> Structure:
    """The :class:`Structure` of a post-LN encoder ``model`` by the table ``t`` (see the module docstring)."""
    cfg = model.config
    for f in ("is_decoder", "add_cross_attention"):
        require(not getattr(cfg, f, False), t.family, f, True, "False (encoder only)")
    pet = getattr(cfg, "position_embedding_type", "absolute")
    require(pet in (None, "absolute"), t.family, "position_embedding_type", pet, "'absolute'")
    emb_size = getattr(cfg, "embedding_size", cfg.hidden_size)
    require(emb_size == cfg.hidden_size, t.family, "embedding_size", emb_size, f"hidden_size ({cfg.hidden_size})")
    cls_name = next((n for n in t.classes if _is(model, n)), None)
    if cls_name is None:
        raise UnsupportedOperationError(f"{t.family} adapter: {type(model).__name__} is not supported "
                                        f"(supported: {', '.join(t.classes)})")
    W = Walker(model, prefix, t.family)
    base = base_path(model)
    emb = join(base, "embeddings")
    acc: dict[str, list] = {"writers": [W.param(f"{emb}.{n}", "weight", 1) for n in t.embeddings if W.has(f"{emb}.{n}")],
                            "readers": [], "norms": [], "attentions": [], "ffns": [], "hidden": [],
                            "frozen": list(W.buffers())}
    pending = W.norm(f"{emb}.LayerNorm")  # each post-LN's readers are the next block's q/k/v
    for i in range(cfg.num_hidden_layers):
        pending = _layer(W, t, cfg, prefix, join(base, f"{t.layers}.{i}"), pending, acc)
    stream_heads = _heads(W, t, cls_name, base, emb, prefix, acc)
    acc["norms"].append(_with_readers(pending, tuple(stream_heads)))
    acc["readers"] += [c for h in stream_heads for c in h.cols()]
    stream = Stream(cfg.hidden_size, tuple(acc["writers"]), tuple(acc["norms"]), tuple(acc["readers"]),
                    is_output=cls_name in t.base_classes, post_norm=True)
    return Structure(t.family, cfg.model_type, type(model).__name__, prefix, stream, tuple(acc["attentions"]),
                     tuple(acc["ffns"]), tuple(acc["hidden"]), frozen=tuple(acc["frozen"]),
                     notes=("post-LN: LayerNorm parameters act on the stream; no orthogonal residual symmetry",))


def _with_readers(n, readers):
    from dataclasses import replace

    return replace(n, readers=tuple(readers))


def example(model: nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    x = token_inputs(model, gen)
    ids = x["input_ids"]
    n_types = getattr(model.config, "type_vocab_size", None)
    if n_types is not None:  # DistilBERT has no token types
        x["token_type_ids"] = torch.randint(0, max(1, n_types), ids.shape, generator=gen)
    mask = torch.ones_like(ids)
    mask[-1, -2:] = 0  # some padding, so the attention mask path is exercised
    x["attention_mask"] = mask
    if _is(model, "BertForMultipleChoice"):
        x = {k: v[:, None].expand(-1, 2, -1).contiguous() for k, v in x.items()}
    return x


_ABSORB = ("{} is post-LN (x ← LN(x + f(x))): each LayerNorm's scale and shift act on the residual stream itself, so "
           "they cannot be folded into the next linear layers and LayerNorm cannot become a parameter-free RMSNorm; "
           "there is no orthogonal residual symmetry to expose")
_ROBERTA_MLM = ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias")


def _roberta_like(family: str, prefix: str) -> PostLN:
    """RoBERTa's layout under the class names ``{prefix}Model``, ``{prefix}ForMaskedLM`` … (XLM-RoBERTa)."""
    return PostLN(family, (f"{prefix}Model",),
                  pooled={f"{prefix}ForSequenceClassification": ("classifier.dense", "classifier.out_proj", "tanh")},
                  stream_heads={f"{prefix}ForTokenClassification": "classifier",
                                f"{prefix}ForQuestionAnswering": "qa_outputs"},
                  mlm={f"{prefix}ForMaskedLM": _ROBERTA_MLM})


POST_LN = (
    PostLN("bert", ("BertModel",),
           pooled={"BertForSequenceClassification": (None, "classifier", "tanh"),
                   "BertForMultipleChoice": (None, "classifier", "tanh")},
           stream_heads={"BertForTokenClassification": "classifier", "BertForQuestionAnswering": "qa_outputs"},
           mlm={"BertForMaskedLM": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                    "cls.predictions.decoder", "cls.predictions.bias")}),
    _roberta_like("roberta", "Roberta"),
    _roberta_like("xlm-roberta", "XLMRoberta"),
    PostLN("electra", ("ElectraModel",),
           pooled={"ElectraForSequenceClassification": ("classifier.dense", "classifier.out_proj", "gelu")},
           stream_heads={"ElectraForTokenClassification": "classifier", "ElectraForQuestionAnswering": "qa_outputs"}),
    PostLN("distilbert", ("DistilBertModel",), embeddings=("word_embeddings", "position_embeddings"),
           layers="transformer.layer", qkv=("attention.q_lin", "attention.k_lin", "attention.v_lin"),
           o="attention.out_lin", attn_norm="sa_layer_norm", up="ffn.lin1", down="ffn.lin2", out_norm="output_layer_norm",
           ffn_path="ffn",
           pooled={"DistilBertForSequenceClassification": ("pre_classifier", "classifier", "relu")},
           stream_heads={"DistilBertForTokenClassification": "classifier", "DistilBertForQuestionAnswering": "qa_outputs"},
           activation="activation"),
)
for _t in POST_LN:
    ADAPTERS.register(_t.family)(Adapter(_t.family, lambda m, p, t=_t: describe_post_ln(t, m, p), example, _t.classes,
                                         absorb=_ABSORB.format(_t.family)))
