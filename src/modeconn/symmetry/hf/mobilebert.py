"""MobileBERT: bottleneck blocks around a narrow attention/FFN stack, with ``NoNorm`` (an elementwise affine).

Layout (``E`` = ``embedding_size``, ``H`` = ``hidden_size``, ``B`` = ``intra_bottleneck_size``): the word table (E)
is read as a trigram ``[x_{t+1} | x_t | x_{t−1}]`` (3E) by ``embedding_transformation`` (→ H), plus position and
token-type tables (H) and ``embeddings.LayerNorm``: the **residual stream** (H). Each layer::

    b = NoNorm(bottleneck.input.dense(x))                 (B: the layer's intra-block space)
    s = NoNorm(bottleneck.attention.dense(x))             (B: the shared query/key input)
    a = NoNorm(attention.output.dense(attn(q=s, k=s, v=x)) + b)
    a = NoNorm(ffn_i.output.dense(act(ffn_i.intermediate.dense(a))) + a)        (num_feedforward_networks − 1 times)
    a = NoNorm(output.dense(act(intermediate.dense(a))) + a)
    x = NoNorm(output.bottleneck.dense(a) + x)

Spaces: the stream; per layer the intra-block space (``b``'s writers, every NoNorm on it, the FFNs' inputs, the
bottleneck output's columns) and the shared query/key input space; heads; every FFN. NoNorm commutes with
permutations. The masked-LM head's transform output (H) splits: its first E channels are read by the decoder tied
to the word table (they move with the word table's **embedding space**, E), the rest by ``cls.predictions.dense``
(a hidden space). Other wirings (``use_bottleneck_attention``, ``key_query_shared_bottleneck=False``, no
bottleneck) are refused naming the field.
"""

from __future__ import annotations

from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, base_path, join, require
from .bert import _is, example
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, Hidden, KVHead, NormRef, QueryHead, Slice, Stream, Structure

CLASSES = ("MobileBertModel", "MobileBertForMaskedLM", "MobileBertForSequenceClassification",
           "MobileBertForTokenClassification", "MobileBertForQuestionAnswering")
_STREAM_HEADS = {"MobileBertForTokenClassification": "classifier", "MobileBertForQuestionAnswering": "qa_outputs"}
_REQUIRED = (("use_bottleneck", True), ("use_bottleneck_attention", False), ("key_query_shared_bottleneck", True))


def _affine(W: Walker, path: str) -> tuple[Slice, ...]:
    """The parameters of a NoNorm / LayerNorm at ``path`` (both commute with permutations)."""
    return tuple(W.param(path, n, 0) for n in ("weight", "bias") if getattr(W.mod(path), n, None) is not None)


def _ffn(W: Walker, prefix: str, path: str, up: str, down: str, act: str, space: dict) -> FFN:
    u, d = W.linear(join(path, up)), W.linear(join(path, down))
    space["readers"] += u.cols()
    space["writers"] += d.rows()
    return FFN(join(prefix, path), u.out_features, u.rows(), d.cols(), (), act)


def _layer(W: Walker, cfg, prefix: str, lp: str, acc: dict) -> None:
    nh, act = cfg.num_attention_heads, str(cfg.hidden_act)
    inp, shared = W.linear(f"{lp}.bottleneck.input.dense"), W.linear(f"{lp}.bottleneck.attention.dense")
    q, k, v, o = (W.linear(f"{lp}.attention.{n}") for n in ("self.query", "self.key", "self.value", "output.dense"))
    out = W.linear(f"{lp}.output.bottleneck.dense")
    acc["readers"] += [*inp.cols(), *shared.cols(), *v.cols()]
    acc["writers"] += out.rows()
    acc["norms"].append(f"{lp}.output.bottleneck.LayerNorm")
    intra = {"writers": [*inp.rows(), *o.rows()], "readers": [*out.cols()],
             "norms": [*_affine(W, f"{lp}.bottleneck.input.LayerNorm"), *_affine(W, f"{lp}.attention.output.LayerNorm"),
                       *_affine(W, f"{lp}.output.LayerNorm")]}
    for i in range(cfg.num_feedforward_networks - 1):
        acc["ffns"].append(_ffn(W, prefix, f"{lp}.ffn.{i}", "intermediate.dense", "output.dense", act, intra))
        intra["norms"] += _affine(W, f"{lp}.ffn.{i}.output.LayerNorm")
    acc["ffns"].append(_ffn(W, prefix, lp, "intermediate.dense", "output.dense", act, intra))
    acc["hidden"] += [
        Hidden(join(prefix, lp, "bottleneck.input"), inp.out_features, tuple(intra["writers"]), tuple(intra["readers"]),
               tuple(intra["norms"])),
        Hidden(join(prefix, lp, "bottleneck.attention"), shared.out_features, shared.rows(), (*q.cols(), *k.cols()),
               _affine(W, f"{lp}.bottleneck.attention.LayerNorm"))]
    hd = q.out_features // nh
    heads = tuple(QueryHead(q.rows(h * hd, hd), o.cols(h * hd, hd)) for h in range(nh))
    kv = tuple(KVHead(k.rows(h * hd, hd), v.rows(h * hd, hd), (h,)) for h in range(nh))
    acc["attentions"].append(Attention(join(prefix, lp, "attention"), hd, heads, kv))


def _embedding_space(W: Walker, cfg, emb: str, cls_name: str, acc: dict) -> Hidden:
    """The word table's space (E): its columns, the trigram blocks of ``embedding_transformation``'s columns and,
    in the masked LM, the transform's first E output channels read by the tied decoder."""
    E = cfg.embedding_size
    et = W.linear(f"{emb}.embedding_transformation")
    blocks = 3 if cfg.trigram_input else 1
    writers = [W.param(f"{emb}.word_embeddings", "weight", 1)]
    readers = [c for j in range(blocks) for c in et.cols(j * E, E)]
    norms: list[Slice] = []
    if cls_name == "MobileBertForMaskedLM":
        dense, decoder = W.linear("cls.predictions.transform.dense"), W.linear("cls.predictions.decoder")
        ln = _affine(W, "cls.predictions.transform.LayerNorm")
        require(W.mod("cls.predictions.decoder").weight is W.mod(f"{emb}.word_embeddings").weight, "mobilebert",
                "tie_word_embeddings", False, "True (the decoder is the word table)")
        acc["readers"] += dense.cols()
        acc["frozen"] += [k for k in (decoder.bias, W.key("", "cls.predictions.bias")) if k]
        rest = cfg.hidden_size - E
        writers += dense.rows(0, E)
        norms += [Slice(x.key, 0, 0, E) for x in ln]
        readers += decoder.cols()
        acc["hidden"].append(Hidden(join(W.prefix, "cls.predictions.transform"), rest, dense.rows(E, rest),
                                    (W.param("cls.predictions.dense", "weight", 0),),
                                    tuple(Slice(x.key, 0, E, rest) for x in ln), str(cfg.hidden_act)))
    return Hidden(join(W.prefix, emb, "word_embeddings"), E, tuple(writers), tuple(readers), tuple(norms))


def _pooler(W: Walker, base: str, cls_name: str, acc: dict) -> None:
    pooler = join(base, "pooler.dense")
    pool = W.linear(pooler) if W.has(pooler) else None
    if cls_name == "MobileBertForSequenceClassification":
        out = W.linear("classifier")
        acc["frozen"] += [out.bias] if out.bias else []
        if pool is None:  # classifier_activation=False: the classifier reads the first token of the stream
            acc["readers"] += out.cols()
            return
        acc["hidden"].append(Hidden(join(W.prefix, base, "pooler"), pool.out_features, pool.rows(), out.cols(),
                                    activation="tanh"))
    elif pool is not None and pool.bias:
        acc["frozen"].append(pool.bias)  # the pooler output is a model output (or never read)
    if pool is not None:
        acc["readers"] += pool.cols()


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    for f, v in _REQUIRED:
        require(getattr(cfg, f) == v, "mobilebert", f, getattr(cfg, f), repr(v))
    require(cfg.trigram_input or cfg.embedding_size != cfg.hidden_size, "mobilebert", "trigram_input", False,
            "True, or embedding_size ≠ hidden_size (embedding_transformation in use)")
    cls_name = next((n for n in CLASSES if _is(model, n)), None)
    if cls_name is None:
        raise UnsupportedOperationError(f"mobilebert adapter: {type(model).__name__} is not supported "
                                        f"(supported: {', '.join(CLASSES)})")
    W = Walker(model, prefix, "mobilebert")
    base = base_path(model)
    emb = join(base, "embeddings")
    acc: dict = {"writers": [*W.linear(f"{emb}.embedding_transformation").rows(),
                             *(W.param(f"{emb}.{n}", "weight", 1) for n in ("position_embeddings", "token_type_embeddings"))],
                 "readers": [], "norms": [f"{emb}.LayerNorm"], "attentions": [], "ffns": [], "hidden": [],
                 "frozen": list(W.buffers())}
    for i in range(cfg.num_hidden_layers):
        _layer(W, cfg, prefix, join(base, f"encoder.layer.{i}"), acc)
    acc["hidden"].insert(0, _embedding_space(W, cfg, emb, cls_name, acc))
    _pooler(W, base, cls_name, acc)
    if cls_name in _STREAM_HEADS:
        head = W.linear(_STREAM_HEADS[cls_name])
        acc["readers"] += head.cols()
        acc["frozen"] += [head.bias] if head.bias else []
    norms = tuple(NormRef(join(prefix, p), "layernorm" if isinstance(W.mod(p), nn.LayerNorm) else "affine", 0.0,
                          cfg.hidden_size, W.key(p, "weight"), W.key(p, "bias")) for p in acc["norms"])
    stream = Stream(cfg.hidden_size, tuple(acc["writers"]), norms, tuple(acc["readers"]),
                    is_output=cls_name == "MobileBertModel", post_norm=True)
    return Structure("mobilebert", cfg.model_type, type(model).__name__, prefix, stream, tuple(acc["attentions"]),
                     tuple(acc["ffns"]), tuple(acc["hidden"]), frozen=tuple(acc["frozen"]),
                     notes=("bottleneck blocks with NoNorm: an intra-block and a shared query/key space per layer",))


ADAPTERS.register("mobilebert")(Adapter(
    "mobilebert", describe, example, CLASSES,
    absorb="mobilebert's NoNorm layers sit on the stream after each residual addition (post-norm): no scale can be "
           "folded into readers and there is no orthogonal residual symmetry to expose"))
