"""ALBERT: a post-LN encoder whose embeddings live in a space of their own and whose layers are shared across depth.

Layout: ``embeddings.{word,position,token_type}_embeddings`` (size ``embedding_size`` E) summed →
``embeddings.LayerNorm`` → ``encoder.embedding_hidden_mapping_in`` (E → hidden H) writes the residual stream →
``num_hidden_layers`` applications of the layers of ``encoder.albert_layer_groups`` (layer ``i`` runs group
``i · num_hidden_groups // num_hidden_layers``; each group holds ``inner_group_num`` layers) → optional ``pooler``
+ tanh on the first token.

Spaces: the **embedding space** (E: the tables' columns, the embedding LayerNorm, ``embedding_hidden_mapping_in``'s
columns; in ``AlbertForMaskedLM`` also the prediction head's ``dense`` rows and ``LayerNorm`` and the ``decoder``'s
columns, since the decoder is tied to the word embeddings), the **residual stream** (H, post-LN as in BERT: no
orthogonal symmetry, no absorption), and per *stored* layer its heads and FFN units. A layer applied at several
depths is one set of weights, so it has one head/FFN permutation, which acts the same at every depth; the stream's
permutation is one for the whole model anyway.
"""

from __future__ import annotations

from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, base_path, join
from .bert import _is, example
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, Hidden, KVHead, QueryHead, Stream, Structure

CLASSES = ("AlbertModel", "AlbertForMaskedLM", "AlbertForSequenceClassification", "AlbertForTokenClassification",
           "AlbertForQuestionAnswering")
_STREAM_HEADS = {"AlbertForTokenClassification": "classifier", "AlbertForQuestionAnswering": "qa_outputs"}


def _layer(W: Walker, cfg, prefix: str, lp: str, acc: dict) -> None:
    """Bind one stored layer (its attention, FFN and both post-LNs)."""
    nh = cfg.num_attention_heads
    hd = cfg.hidden_size // nh
    q, k, v, o = (W.linear(f"{lp}.attention.{n}") for n in ("query", "key", "value", "dense"))
    up, down = W.linear(f"{lp}.ffn"), W.linear(f"{lp}.ffn_output")
    acc["norms"] += [W.norm(f"{lp}.attention.LayerNorm"), W.norm(f"{lp}.full_layer_layer_norm")]
    acc["readers"] += [*q.cols(), *k.cols(), *v.cols(), *up.cols()]
    acc["writers"] += [*o.rows(), *down.rows()]
    heads = tuple(QueryHead(q.rows(h * hd, hd), o.cols(h * hd, hd)) for h in range(nh))
    kv = tuple(KVHead(k.rows(h * hd, hd), v.rows(h * hd, hd), (h,)) for h in range(nh))
    acc["attentions"].append(Attention(join(prefix, lp, "attention"), hd, heads, kv))
    acc["ffns"].append(FFN(join(prefix, lp, "ffn"), up.out_features, up.rows(), down.cols(), (), str(cfg.hidden_act)))


def _embedding_space(W: Walker, base: str, cls_name: str, acc: dict) -> Hidden:
    """The embedding space, joined by the masked-LM head's transform where its decoder is tied to the word table."""
    emb = join(base, "embeddings")
    names = ("word_embeddings", "position_embeddings", "token_type_embeddings")
    writers = [W.param(f"{emb}.{n}", "weight", 1) for n in names]
    norms = list(W.norm(f"{emb}.LayerNorm").params())
    readers = list(W.linear(join(base, "encoder.embedding_hidden_mapping_in")).cols())
    if cls_name == "AlbertForMaskedLM":
        dense, decoder = W.linear("predictions.dense"), W.linear("predictions.decoder")
        acc["readers"] += dense.cols()
        acc["frozen"] += [k for k in (decoder.bias, W.key("", "predictions.bias")) if k]
        lnorm = W.norm("predictions.LayerNorm").params()
        if W.mod("predictions.decoder").weight is W.mod(f"{emb}.word_embeddings").weight:
            writers += [*dense.rows(), *lnorm]
            readers += decoder.cols()
        else:
            acc["hidden"].append(Hidden(join(W.prefix, "predictions"), dense.out_features, dense.rows(), decoder.cols(),
                                        lnorm, str(W.model.config.hidden_act)))
    return Hidden(join(W.prefix, emb), W.model.config.embedding_size, tuple(writers), tuple(readers), tuple(norms))


def _pooler(W: Walker, base: str, cls_name: str, acc: dict) -> None:
    pooler = join(base, "pooler")
    if not W.has(pooler):
        return
    pool = W.linear(pooler)
    acc["readers"] += pool.cols()
    if cls_name == "AlbertForSequenceClassification":
        out = W.linear("classifier")
        acc["hidden"].append(Hidden(join(W.prefix, pooler), pool.out_features, pool.rows(), out.cols(),
                                    activation="tanh"))
        acc["frozen"] += [out.bias] if out.bias else []
    elif pool.bias:
        acc["frozen"].append(pool.bias)  # the pooler output is a model output (or never read)


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    cls_name = next((n for n in CLASSES if _is(model, n)), None)
    if cls_name is None:
        raise UnsupportedOperationError(f"albert adapter: {type(model).__name__} is not supported "
                                        f"(supported: {', '.join(CLASSES)})")
    W = Walker(model, prefix, "albert")
    base = base_path(model)
    mapping = W.linear(join(base, "encoder.embedding_hidden_mapping_in"))
    acc: dict[str, list] = {"writers": list(mapping.rows()), "readers": [], "norms": [], "attentions": [], "ffns": [],
                            "hidden": [], "frozen": list(W.buffers())}
    for g in range(cfg.num_hidden_groups):
        for j in range(cfg.inner_group_num):
            _layer(W, cfg, prefix, join(base, f"encoder.albert_layer_groups.{g}.albert_layers.{j}"), acc)
    acc["hidden"].insert(0, _embedding_space(W, base, cls_name, acc))
    _pooler(W, base, cls_name, acc)
    if cls_name in _STREAM_HEADS:
        head = W.linear(_STREAM_HEADS[cls_name])
        acc["readers"] += head.cols()
        acc["frozen"] += [head.bias] if head.bias else []
    stream = Stream(cfg.hidden_size, tuple(acc["writers"]), tuple(acc["norms"]), tuple(acc["readers"]),
                    is_output=cls_name == "AlbertModel", post_norm=True)
    return Structure("albert", cfg.model_type, type(model).__name__, prefix, stream, tuple(acc["attentions"]),
                     tuple(acc["ffns"]), tuple(acc["hidden"]), frozen=tuple(acc["frozen"]),
                     notes=("post-LN; the embedding space (embedding_size) is its own; shared layers: one space each",))


ADAPTERS.register("albert")(Adapter(
    "albert", describe, example, CLASSES,
    absorb="albert is post-LN (x ← LN(x + f(x))), and its embedding LayerNorm sits on a space of its own: no scale can "
           "be folded into readers and there is no orthogonal residual symmetry to expose"))
