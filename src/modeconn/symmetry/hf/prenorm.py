"""Table-driven description of pre-norm transformers: a Llama-like family is one :class:`Table` entry.

A pre-norm block reads the residual stream through a norm and adds what it computes back::

    x ← x + post_attn(attn(attn_norm(x)))          (post_attn: Gemma2 / OLMo2 only; attn_norm: absent in OLMo2)
    x ← x + post_mlp(mlp(mlp_norm(x)))             (parallel blocks: x ← x + attn(n(x)) + mlp(n or n₂(x)))

A :class:`Table` names, relative to the base model (``model.model``, ``model.transformer`` …, or where ``base``
finds it), the embeddings
that write the stream, the layer list, the attention projections (separate Q/K/V or one fused matrix in one of
the :data:`QKV_LAYOUTS`), the MLP (GLU with ``gate``/``up``, fused ``gate_up`` or a plain ``up``), the norms
(candidates tried in order: attribute names differ between configs of one family), the final norm and the
heads. :func:`describe` walks a model with it and returns the group-agnostic
:class:`~modeconn.symmetry.hf.structure.Structure`; :func:`register` turns an entry into an adapter.

Facts a table states because no module tells them: ``norm_offset`` (Gemma's RMSNorm scales by ``1 + w``),
``norm_kind`` (Cohere's ``CohereLayerNorm`` subtracts the mean though it looks like an RMSNorm: ``"layernorm"``),
``rotary`` (``"half"``: ``rotate_half`` pairs, ``"interleaved"``: GPT-J's ``rotate_every_two``, ``None``: no
RoPE), ``alibi`` (per-head ALiBi slopes are fixed by head index, so heads may not be permuted), ``clip_qkv``
(an elementwise clamp on Q/K/V commutes with permutations only), ``parallel`` (the MLP reads the attention
norm's output when it has no norm of its own). Q/K norms are recognised by their size: one ``head_dim`` weight
shared by every head (Qwen3) freezes the qk role; a weight over the whole projection (OLMo2) moves with the
rows and admits permutations only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, base_path, join, require, rotary_dims, token_inputs
from .moe import MoE, block
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, Hidden, KVHead, LinearRef, NormRef, QueryHead, Slice, Stream, Structure

QKV_LAYOUTS = ("blocks", "per_head", "grouped", "codegen")
"""Row layouts of a fused QKV matrix (``G`` key/value heads, ``r = heads/G`` query heads per group):
``blocks`` ``[Q₀…Q_{n−1} | K₀…K_{G−1} | V₀…V_{G−1}]`` (Phi-3, GPT-2, Falcon multi-query); ``per_head``
``[(Q₀ K₀ V₀) (Q₁ K₁ V₁) …]`` (GPT-NeoX, BLOOM, Falcon without multi-query; ``G = heads``); ``grouped``
``[(Q_{g r} … Q_{g r + r − 1} K_g V_g) for each group g]`` (Falcon's new decoder architecture); ``codegen``
four model-parallel chunks ``[Q_c | V_c | K_c]``, each holding a quarter of the heads (CodeGen)."""
_CODEGEN_CHUNKS = 4  # CodeGen's mp_num, fixed in its modeling code


def _codegen_row(head: int, part: int, heads: int, head_dim: int) -> int:
    """The first row of ``head``'s Q (part 0), V (1) or K (2) in CodeGen's fused QKV: chunk ``head // per``, then
    ``[Q | V | K]`` of ``per = heads / 4`` heads each."""
    per = heads // _CODEGEN_CHUNKS
    return (head // per * 3 * per + part * per + head % per) * head_dim

ConfigTest = Callable[[Any], bool]


@dataclass(frozen=True)
class Embedding:
    """A tensor that writes the stream: ``path.name`` with the stream on ``axis`` (token tables: 1; a ViT's
    ``(1, tokens, hidden)`` tokens: 2; CLIP's ``class_embedding``: 0), or a patch projection (``linear``: its
    output rows and bias). ``optional``: absent in some configs."""

    path: str
    name: str = "weight"
    axis: int = 1
    linear: bool = False
    optional: bool = False


@dataclass(frozen=True)
class Table:
    """One pre-norm family (see the module docstring). Names are relative to the base model; ``*_norm`` are
    candidate names, the first that exists is used (``()``: the block has none). ``frozen``: modules of a layer whose
    parameters no group moves (Apertus's xIELU activation, BEiT's per-head relative position bias tables);
    ``shared_frozen``: such modules of the base model (BEiT's shared position bias), less the tensors bound
    elsewhere; ``stream_readers``: further tensors reading the final norm's output along ``axis`` (the key/value
    columns of SigLIP's pooling attention, read as a whole with the probe it queries by); ``layer_scales``: per-channel
    scales of what a block writes, ``module.param`` relative to the layer (DINOv2's ``layer_scale1.lambda1``; skipped
    where absent): they move with the stream; ``head_copies``: the heads read the concatenation of this many
    poolings of the stream (DINOv2's classifier: the CLS token and the patch mean); ``final_norm``: a name or a
    function of the config choosing it (BEiT: the pooler's norm under mean pooling); ``attention``: a function
    ``(walker, table, model, prefix, layer path, base) →`` :class:`LayerAttention` describing a layer's attention
    that Q/K/V projections do not (multi-head latent attention, :mod:`.mla`); ``moe``: where the MLP's
    Mixture-of-Experts parts are (:mod:`.moe`; a layer without them is dense)."""

    family: str
    classes: tuple[str, ...]
    embeddings: tuple[Embedding, ...] = (Embedding("embed_tokens"),)
    embed_norm: str | None = None
    layers: str = "layers"
    attn: str = "self_attn"
    qkv: tuple[str, str, str] | str = ("q_proj", "k_proj", "v_proj")
    qkv_layout: str | Callable[[Any], str] = "blocks"
    o: str = "o_proj"
    mlp: str = "mlp"
    up: str = "up_proj"
    gate: str | None = "gate_proj"
    gate_up: str | None = None
    down: str = "down_proj"
    attn_norm: tuple[str, ...] = ("input_layernorm",)
    mlp_norm: tuple[str, ...] = ("post_attention_layernorm",)
    post_norms: tuple[str | None, str | None] = (None, None)
    parallel: bool | ConfigTest = False
    final_norm: str | Callable[[Any], str] = "norm"
    heads: tuple[str, ...] = ("lm_head", "score", "classifier", "qa_outputs")
    head_copies: int = 1
    final_norm_feeds_heads: bool = True
    returns_stream: tuple[str, ...] = ()
    rotary: str | None | Callable[[Any], str | None] = "half"
    alibi: bool | ConfigTest = False
    clip_qkv: ConfigTest = staticmethod(lambda cfg: False)
    activation: Callable[[Any], str] = staticmethod(lambda cfg: str(getattr(cfg, "hidden_act", "")))
    norm_offset: float = 0.0
    norm_kind: str | None = None
    requires: tuple[tuple[str, ConfigTest, str], ...] = ()
    example: Callable[[nn.Module, torch.Generator], dict[str, torch.Tensor]] = staticmethod(token_inputs)
    absorb: str | None = None
    config_of: Callable[[nn.Module], Any] = staticmethod(lambda m: m.config)
    frozen: tuple[str, ...] = ()
    shared_frozen: tuple[str, ...] = ()
    moe: MoE | None = None
    stream_readers: tuple[Embedding, ...] = ()
    layer_scales: tuple[str, ...] = ()
    base: Callable[[nn.Module], str] = staticmethod(base_path)
    attention: Callable[..., LayerAttention] | None = None


@dataclass(frozen=True)
class LayerAttention:
    """One layer's attention as :func:`describe` consumes it: the layer, the projections reading the stream, the
    output projection writing it, frozen keys, and hidden spaces inside the attention (latent projections)."""

    attention: Attention
    readers: tuple[LinearRef, ...]
    o: LinearRef
    frozen: tuple[str, ...] = ()
    hidden: tuple[Hidden, ...] = ()


def _resolve(flag: bool | ConfigTest | str | Callable[[Any], str], cfg: Any) -> Any:
    return flag(cfg) if callable(flag) else flag


@dataclass(frozen=True)
class _Proj:
    """One layer's Q/K/V: readers of the stream and per-head row slices."""

    readers: tuple[LinearRef, ...]
    q: Callable[[int], tuple[Slice, ...]]
    k: Callable[[int], tuple[Slice, ...]]
    v: Callable[[int], tuple[Slice, ...]]
    n_kv: int


def _projections(W: Walker, t: Table, cfg: Any, ap: str, nh: int, hd: int) -> _Proj:
    if not isinstance(t.qkv, str):
        q, k, v = (W.linear(join(ap, n)) for n in t.qkv)
        n_kv = k.out_features // hd
        require(q.out_features == nh * hd and k.out_features == n_kv * hd == v.out_features, t.family,
                "num_key_value_heads", n_kv, "q/k/v projections of heads·head_dim rows")
        return _Proj((q, k, v), lambda h: q.rows(h * hd, hd), lambda j: k.rows(j * hd, hd),
                     lambda j: v.rows(j * hd, hd), n_kv)
    f = W.linear(join(ap, t.qkv))
    layout = _resolve(t.qkv_layout, cfg)
    n_kv = (f.out_features // hd - nh) // 2 if layout not in ("per_head", "codegen") else nh
    require(n_kv >= 1 and nh % n_kv == 0 and f.out_features == (nh + 2 * n_kv) * hd, t.family, "num_key_value_heads",
            n_kv, f"a divisor of the {nh} heads, with {t.qkv} of (heads + 2·kv_heads)·head_dim rows")
    rep = nh // n_kv
    if layout == "blocks":
        offs = (lambda h: h * hd, lambda j: (nh + j) * hd, lambda j: (nh + n_kv + j) * hd)
    elif layout == "per_head":
        offs = (lambda h: 3 * h * hd, lambda j: (3 * j + 1) * hd, lambda j: (3 * j + 2) * hd)
    elif layout == "codegen":
        require(nh % _CODEGEN_CHUNKS == 0, t.family, "n_head", nh, f"a multiple of {_CODEGEN_CHUNKS}")
        offs = (lambda h: _codegen_row(h, 0, nh, hd), lambda j: _codegen_row(j, 2, nh, hd),
                lambda j: _codegen_row(j, 1, nh, hd))
    elif layout == "grouped":
        offs = (lambda h: ((h // rep) * (rep + 2) + h % rep) * hd, lambda j: (j * (rep + 2) + rep) * hd,
                lambda j: (j * (rep + 2) + rep + 1) * hd)
    else:
        raise UnsupportedOperationError(f"{t.family} adapter: QKV layout {layout!r} is not one of {QKV_LAYOUTS}")
    qo, ko, vo = offs
    return _Proj((f,), lambda h: f.rows(qo(h), hd), lambda j: f.rows(ko(j), hd), lambda j: f.rows(vo(j), hd), n_kv)


def _qk_norms(W: Walker, ap: str, nh: int, n_kv: int, hd: int) -> tuple[str | None, tuple[str, ...], list, list]:
    """``(scope, frozen keys, per-head q slices, per-kv-head k slices)`` of the Q/K norms in ``ap``, if any.

    Scopes: ``"head"`` — one ``head_dim`` norm shared by every head (Qwen3, Gemma3): frozen, it pins the qk role;
    ``"full"`` — one norm over the whole projection (OLMo2): its weights move with the Q/K rows; ``"separate"`` —
    a different norm per head (StableLM's per-head LayerNorms, Cohere's ``(heads, head_dim)`` weight): frozen, and
    neither heads nor Q/K dims may move."""
    names = next(((q, k) for q, k in _QK_NORM_NAMES if W.has(join(ap, q))), None)
    none: tuple[list, list] = ([()] * nh, [()] * n_kv)
    if names is None:
        return None, (), *none
    mods = {join(ap, n): W.mod(join(ap, n)) for n in names}
    keys = tuple(W.key(p, n) for p, m in mods.items() for n, _ in m.named_parameters())
    if any(getattr(m, "weight", None) is not None and m.weight.ndim != 1 or hasattr(m, "norms") for m in mods.values()):
        return "separate", keys, *none
    refs = [W.norm(p) for p in mods]
    if any(r.size == hd for r in refs):
        return "head", keys, *none
    qn, kn = refs
    if qn.size != nh * hd or kn.size != n_kv * hd:
        raise UnsupportedOperationError(f"{W.family} adapter: Q/K norms of sizes {qn.size}/{kn.size} in {ap!r} fit "
                                        f"neither head_dim={hd} nor the projections ({nh * hd}/{n_kv * hd})")
    q = [tuple(Slice(p.key, 0, h * hd, hd) for p in qn.params()) for h in range(nh)]
    k = [tuple(Slice(p.key, 0, j * hd, hd) for p in kn.params()) for j in range(n_kv)]
    return "full", (), q, k


_QK_NORM_NAMES = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"), ("query_layernorm", "key_layernorm"))
_QK_NORM_FROZEN = {"head": ("qk",), "separate": ("heads", "qk")}


def _attention(W: Walker, t: Table, model: nn.Module, prefix: str, lp: str, base: str) -> LayerAttention:
    cfg = t.config_of(model)
    ap = join(lp, t.attn)
    nh = cfg.num_attention_heads
    o = W.linear(join(ap, t.o))
    require(o.in_features % nh == 0, t.family, "num_attention_heads", nh, f"a divisor of {t.o}'s {o.in_features} inputs")
    hd = o.in_features // nh
    p = _projections(W, t, cfg, ap, nh, hd)
    scope, frozen, qn, kn = _qk_norms(W, ap, nh, p.n_kv, hd)
    rep = nh // p.n_kv
    heads = tuple(QueryHead((*p.q(h), *qn[h]), o.cols(h * hd, hd)) for h in range(nh))
    kv = tuple(KVHead((*p.k(j), *kn[j]), p.v(j), tuple(range(j * rep, (j + 1) * rep))) for j in range(p.n_kv))
    style = _resolve(t.rotary, cfg)
    rot = rotary_dims(model, base, W.mod(ap), hd) if style else 0
    frozen_roles = (("heads",) if _resolve(t.alibi, cfg) else ()) + _QK_NORM_FROZEN.get(scope, ())
    perm_only = (("qk", "vo") if t.clip_qkv(cfg) else ()) + (("qk",) if scope == "full" else ())
    att = Attention(join(prefix, ap), hd, heads, kv, rot, style, tuple(dict.fromkeys(frozen_roles)),
                    tuple(dict.fromkeys(perm_only)))
    return LayerAttention(att, p.readers, o, frozen)


def _ffn(W: Walker, t: Table, cfg: Any, prefix: str, mp: str) -> tuple[FFN, tuple[LinearRef, ...], LinearRef]:
    """The dense FFN at the MLP path ``mp``."""
    down = W.linear(join(mp, t.down))
    if t.gate_up is not None:
        gu = W.linear(join(mp, t.gate_up))
        n = gu.out_features // 2
        require(2 * n == gu.out_features == 2 * down.in_features, t.family, "intermediate_size", n,
                f"{t.gate_up} of 2·intermediate_size rows ([gate | up])")
        return FFN(join(prefix, mp), n, gu.rows(n, n), down.cols(), gu.rows(0, n), t.activation(cfg)), (gu,), down
    up = W.linear(join(mp, t.up))
    gate = W.linear(join(mp, t.gate)) if t.gate else None
    readers = (up,) if gate is None else (gate, up)
    return (FFN(join(prefix, mp), up.out_features, up.rows(), down.cols(), gate.rows() if gate else (),
                t.activation(cfg)), readers, down)


def _first(W: Walker, lp: str, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that is a module of the layer (``nn.Identity``: none, as ModernBERT's first layer)."""
    return next((join(lp, n) for n in names if W.has(join(lp, n)) and not isinstance(W.mod(join(lp, n)), nn.Identity)),
                None)


def _block_norms(W: Walker, t: Table, cfg: Any, lp: str, attn_readers: tuple, mlp_readers: tuple) -> list[NormRef]:
    """The norms reading the stream (with their readers) and the post-norms on the branch outputs."""
    an, mn = _first(W, lp, t.attn_norm), _first(W, lp, t.mlp_norm)
    parallel = bool(_resolve(t.parallel, cfg))
    if mn is None and an is not None and not parallel:
        raise UnsupportedOperationError(f"{t.family} adapter: {lp!r} has no pre-MLP norm (tried {list(t.mlp_norm)}) "
                                        "and the block is not parallel")
    share = mn is None and an is not None  # parallel block with one norm: the MLP reads it too
    out = []
    if an is not None:
        out.append(W.norm(an, (*attn_readers, *(mlp_readers if share else ())), t.norm_offset, t.norm_kind))
    if mn is not None:
        out.append(W.norm(mn, mlp_readers, t.norm_offset, t.norm_kind))
    out += [W.norm(join(lp, n), (), t.norm_offset, t.norm_kind) for n in t.post_norms if n is not None]
    return out


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _leaf(path: str) -> str:
    return path.rpartition(".")[2]


def _layer_frozen(W: Walker, t: Table, lp: str, names: tuple[str, ...] | None = None) -> list[str]:
    """The parameters of the modules ``names`` (default ``t.frozen``) under ``lp`` (an activation with parameters of
    its own, a per-head position bias table)."""
    out = []
    for name in t.frozen if names is None else names:
        path = join(lp, name)
        if W.has(path):
            out += [W.key(path, n) for n, _ in W.mod(path).named_parameters()]
    return out


def _layer_scales(W: Walker, t: Table, lp: str) -> list[Slice]:
    out = []
    for name in t.layer_scales:
        path = join(lp, _parent(name))
        if W.has(path) and isinstance(getattr(W.mod(path), _leaf(name), None), torch.Tensor):
            out.append(W.param(path, _leaf(name), 0))
    return out


def _present(W: Walker, base: str, e: Embedding) -> bool:
    path = join(base, e.path)
    return not e.optional or (W.has(path) and isinstance(getattr(W.mod(path), e.name, None), torch.Tensor))


def _embeddings(W: Walker, t: Table, base: str) -> list[Slice]:
    out: list[Slice] = []
    for e in t.embeddings:
        path = join(base, e.path)
        if not _present(W, base, e):
            continue
        out += W.linear(path).rows() if e.linear else [W.param(path, e.name, e.axis)]
    return out


def describe(t: Table, model: nn.Module, prefix: str) -> Structure:
    """The :class:`Structure` of ``model`` (an instance of one of ``t.classes``) by the table ``t``.

    Raises SpecError (a config option the table does not support, naming the field) or UnsupportedOperationError
    (a module the table names is missing or of an unexpected type)."""
    cfg = t.config_of(model)
    names = {c.__name__ for c in type(model).__mro__}
    if not names & set(t.classes):
        raise UnsupportedOperationError(f"{t.family} adapter: {type(model).__name__} is not supported (supported: "
                                        f"{', '.join(t.classes)})")
    for field, ok, supported in t.requires:
        require(ok(getattr(cfg, field, None)), t.family, field, getattr(cfg, field, None), supported)
    W = Walker(model, prefix, t.family)
    base = t.base(model)
    H = cfg.hidden_size
    writers, readers, norms, attentions, ffns, frozen = _embeddings(W, t, base), [], [], [], [], list(W.buffers())
    hidden: list[Hidden] = []
    experts: list = []
    if t.embed_norm is not None:
        norms.append(W.norm(join(base, t.embed_norm), (), t.norm_offset, t.norm_kind))
    for i in range(cfg.num_hidden_layers):
        lp = join(base, f"{t.layers}.{i}")
        la = (t.attention or _attention)(W, t, model, prefix, lp, base)
        mlp = block(W, t.moe, join(lp, t.mlp), H, t.activation(cfg), lambda mp: _ffn(W, t, cfg, prefix, mp))
        norms += _block_norms(W, t, cfg, lp, la.readers, mlp.readers)
        readers += [c for r in (*la.readers, *mlp.readers) for c in r.cols()]
        writers += [*la.o.rows(), *mlp.writers]
        attentions.append(la.attention)
        ffns += mlp.ffns
        experts += mlp.experts
        hidden += la.hidden
        frozen += [*la.frozen, *_layer_frozen(W, t, lp)]
        writers += _layer_scales(W, t, lp)
    readers += [W.param(join(base, e.path), e.name, e.axis) for e in t.stream_readers if _present(W, base, e)]
    named = {sl.key for sl in (*writers, *readers)}
    frozen += [k for k in _layer_frozen(W, t, base, t.shared_frozen) if k not in named]
    heads = W.heads_reading(t.heads, H * t.head_copies)
    norms.append(W.norm(join(base, _resolve(t.final_norm, cfg)), heads if t.final_norm_feeds_heads else (),
                        t.norm_offset, t.norm_kind))
    readers += [c for h in heads for i in range(t.head_copies) for c in h.cols(i * H, H)]
    frozen += [h.bias for h in heads if h.bias]
    is_output = not heads or type(model).__name__ in t.returns_stream
    stream = Stream(H, tuple(writers), tuple(norms), tuple(readers), is_output=is_output)
    return Structure(t.family, model.config.model_type, type(model).__name__, prefix, stream, tuple(attentions), tuple(ffns),
                     tuple(hidden), frozen=tuple(frozen), experts=tuple(experts))


TABLES: dict[str, Table] = {}
"""Every registered table by family name."""


def register(t: Table, *model_types: str) -> Table:
    """Register ``t`` as the adapter of ``model_types`` (default: its family name); returns it."""
    TABLES[t.family] = t
    for mt in model_types or (t.family,):
        ADAPTERS.register(mt)(Adapter(t.family, lambda m, p, t=t: describe(t, m, p), t.example, t.classes, t.absorb))
    return t
