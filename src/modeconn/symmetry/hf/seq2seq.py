"""Encoder–decoders: T5 (mT5, UMT5), BART, mBART, Pegasus, Whisper.

Two residual streams: the encoder's (its embeddings, every encoder block's writers, norms and readers, and the
decoder's cross-attention **K/V columns**, which read the encoder's output) and the decoder's (its embeddings, every
decoder block, cross-attention's **Q columns and O rows**, the LM head). Each attention block (encoder self-attention,
decoder self-attention, cross-attention) has its own heads; each FFN its own hidden units.

Tied token embeddings join the two streams: T5 and BART (with ``tie_word_embeddings``) read the encoder's and the
decoder's tokens from one table (``shared``), whose columns then write both streams, so both streams must carry one
permutation — described as one stream (``Structure.stream``). Where the tables are separate (BART untied, Whisper:
audio features enter the encoder through two convolutions), the encoder stream is a space of its own
(``Structure.encoder_stream``). ``encoder_last_hidden_state`` (returned with the logits) carries the encoder
stream's permutation.

T5: pre-norm with ``T5LayerNorm`` (scale-only RMSNorm); relative position bias: one table of ``num_buckets × heads``
in the first block of each stack, whose bias is added to every layer's scores of that stack (UMT5: a table per
layer), so head permutations of self-attention are frozen with the tables; cross-attention has no bias and its heads
are free. BART: learned positions, ``layernorm_embedding`` on the stream, post-norm blocks; mBART: the same with
pre-norm blocks and final norms; Pegasus: pre-norm without ``layernorm_embedding``, its sinusoidal position tables
stored in the checkpoint (they move with the streams like learned ones). ``final_logits_bias`` is a buffer (frozen).
Normalization absorption is not offered: post-norm (BART), two streams, the T5 head's ``d_model^-1/2`` scaling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, base_path, join, token_inputs
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, Hidden, KVHead, LinearRef, QueryHead, Slice, Stream, Structure


@dataclass
class _Side:
    """One residual stream being collected: writers (out), norms on it, readers (in)."""

    writers: list[Slice] = field(default_factory=list)
    norms: list = field(default_factory=list)
    readers: list[Slice] = field(default_factory=list)

    def stream(self, size: int, is_output: bool, post_norm: bool) -> Stream:
        return Stream(size, tuple(self.writers), tuple(self.norms), tuple(self.readers), is_output, post_norm)


@dataclass
class _Model:
    """What describing one encoder–decoder accumulates."""

    W: Walker
    enc: _Side
    dec: _Side
    attentions: list[Attention] = field(default_factory=list)
    ffns: list[FFN] = field(default_factory=list)
    hidden: list[Hidden] = field(default_factory=list)
    frozen: list[str] = field(default_factory=list)

    def attention(self, path: str, names: tuple[str, str, str, str], heads: int, q_side: _Side, kv_side: _Side,
                  frozen_roles: tuple[str, ...] = ()) -> tuple[LinearRef, ...]:
        """Bind one attention block: Q reads ``q_side``, K/V read ``kv_side``, O writes ``q_side``."""
        q, k, v, o = (self.W.linear(join(path, n)) for n in names)
        hd = q.out_features // heads
        q_side.readers += q.cols()
        kv_side.readers += [*k.cols(), *v.cols()]
        q_side.writers += o.rows()
        qh = tuple(QueryHead(q.rows(h * hd, hd), o.cols(h * hd, hd)) for h in range(heads))
        kv = tuple(KVHead(k.rows(h * hd, hd), v.rows(h * hd, hd), (h,)) for h in range(heads))
        self.attentions.append(Attention(join(self.W.prefix, path), hd, qh, kv, frozen_roles=frozen_roles))
        return q, k, v

    def ffn(self, path: str, up: str, down: str, act: str, side: _Side, gate: str | None = None) -> tuple[LinearRef, ...]:
        u, d = self.W.linear(join(path, up)), self.W.linear(join(path, down))
        g = self.W.linear(join(path, gate)) if gate else None
        side.readers += [*u.cols(), *(g.cols() if g else ())]
        side.writers += d.rows()
        self.ffns.append(FFN(join(self.W.prefix, path), u.out_features, u.rows(), d.cols(), g.rows() if g else (), act))
        return (u, g) if g else (u,)

    def norm(self, path: str, side: _Side, readers=()) -> None:
        side.norms.append(self.W.norm(path, readers))

    def structure(self, family: str, model: nn.Module, size: int, is_output: bool, post_norm: bool,
                  notes: tuple[str, ...]) -> Structure:
        dec = self.dec.stream(size, is_output, post_norm)
        enc = None if self.enc is self.dec else self.enc.stream(size, is_output, post_norm)
        return Structure(family, model.config.model_type, type(model).__name__, self.W.prefix, dec,
                         tuple(self.attentions), tuple(self.ffns), tuple(self.hidden),
                         frozen=(*self.frozen, *self.W.buffers()), notes=notes, encoder_stream=enc)


def _sides(W: Walker, enc_table: str | None, dec_table: str) -> tuple[_Side, _Side]:
    """One stream for both when the encoder's and the decoder's token tables are one tensor, else two."""
    shared = enc_table is not None and W.mod(enc_table).weight is W.mod(dec_table).weight
    enc = _Side()
    return (enc, enc) if shared else (enc, _Side())


def _is(model: nn.Module, names: tuple[str, ...]) -> bool:
    return any(c.__name__ in names for c in type(model).__mro__)


def _shared_table(W: Walker, base: str, m: _Model, tables: tuple[str, ...]) -> None:
    """``shared``: bound with the stream whose table it is tied to; unused (frozen) when untied from both."""
    path = join(base, "shared")
    if not W.has(path):
        return
    for t, side in zip(tables, (m.enc, m.dec), strict=True):
        if W.mod(path).weight is W.mod(t).weight:
            side.writers.append(W.param(path, "weight", 1))
            return
    m.frozen.append(W.key(path, "weight"))


# ------------------------------------------------------------------ T5, mT5, UMT5
_T5_BASE = ("Model", "EncoderModel")
_T5_NOTES = ("pre-norm T5LayerNorm (scale only); self-attention heads frozen with the relative position bias",)


def _t5_classes(prefix: str) -> tuple[str, ...]:
    return (f"{prefix}Model", f"{prefix}ForConditionalGeneration", f"{prefix}EncoderModel")


def _t5_stack(m: _Model, cfg, stack: str, side: _Side, enc: _Side) -> list[LinearRef]:
    """Bind one T5 stack (``encoder`` / ``decoder``); returns the cross-attention K/V (read the encoder's final norm)."""
    W, nh, act = m.W, cfg.num_heads, str(cfg.dense_act_fn)
    decoder = stack == "decoder"
    kv = []
    for i in range(cfg.num_decoder_layers if decoder else cfg.num_layers):
        lp = f"{stack}.block.{i}.layer"
        m.norm(f"{lp}.0.layer_norm", side, m.attention(f"{lp}.0.SelfAttention", ("q", "k", "v", "o"), nh, side, side,
                                                        ("heads",)))
        if decoder:
            q, k, v = m.attention(f"{lp}.1.EncDecAttention", ("q", "k", "v", "o"), nh, side, enc)
            m.norm(f"{lp}.1.layer_norm", side, (q,))
            kv += [k, v]
        f = f"{lp}.{2 if decoder else 1}"
        gated = W.has(f"{f}.DenseReluDense.wi_0")
        m.norm(f"{f}.layer_norm", side, m.ffn(f"{f}.DenseReluDense", "wi_1" if gated else "wi", "wo", act, side,
                                              "wi_0" if gated else None))
    for k in W.model.state_dict():
        if k.startswith(f"{stack}.") and ".relative_attention_bias." in k:
            m.frozen.append(W.key("", k))
    return kv


def describe_t5(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    family = cfg.model_type
    W = Walker(model, prefix, family)
    has_decoder = W.has("decoder")
    enc, dec = _sides(W, "encoder.embed_tokens", "decoder.embed_tokens") if has_decoder else (_Side(), None)
    m = _Model(W, enc, dec if dec is not None else enc)
    for table, side in (("encoder.embed_tokens", m.enc), ("decoder.embed_tokens", m.dec if has_decoder else None)):
        if side is not None:
            side.writers.append(W.param(table, "weight", 1))
    _shared_table(W, "", m, ("encoder.embed_tokens", "decoder.embed_tokens" if has_decoder else "encoder.embed_tokens"))
    _t5_stack(m, cfg, "encoder", m.enc, m.enc)
    if has_decoder:
        kv = _t5_stack(m, cfg, "decoder", m.dec, m.enc)
        m.norm("encoder.final_layer_norm", m.enc, kv)
        heads = W.heads_reading(("lm_head",), cfg.d_model)
        m.dec.readers += [c for h in heads for c in h.cols()]
        m.norm("decoder.final_layer_norm", m.dec, heads)
    else:
        m.norm("encoder.final_layer_norm", m.enc)
    is_output = not _is(model, tuple(c for c in ADAPTERS.get(family).classes if "ForConditional" in c))
    return m.structure(family, model, cfg.d_model, is_output, False, _T5_NOTES)


def _seq2seq_example(model: nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    x = token_inputs(model, gen)
    ids = x["input_ids"]
    mask = torch.ones_like(ids)
    mask[-1, -2:] = 0  # padding in the encoder: the cross-attention mask path runs
    x["attention_mask"] = mask
    if _has_decoder(model):
        x["decoder_input_ids"] = torch.randint(0, model.config.vocab_size, (ids.shape[0], 5), generator=gen)
    return x


def _has_decoder(model: nn.Module) -> bool:
    return getattr(model, "decoder", None) is not None or getattr(getattr(model, "model", None), "decoder", None) is not None


# ------------------------------------------------------------------ BART, mBART, Whisper
@dataclass(frozen=True)
class BartLike:
    """A BART-style encoder–decoder. ``pre_norm``: norms before each block and a final ``layer_norm`` per stack
    (mBART, Whisper); else post-norm blocks (BART). ``embed_norm``: ``layernorm_embedding`` on each stack's stream."""

    family: str
    prefix: str
    pre_norm: bool
    embed_norm: bool = True
    head: str = "lm_head"

    @property
    def classes(self) -> tuple[str, ...]:
        return (f"{self.prefix}Model", f"{self.prefix}ForConditionalGeneration")


_QKVO = ("q_proj", "k_proj", "v_proj", "out_proj")


def _bart_stack(m: _Model, t: BartLike, cfg, stack: str, side: _Side, heads: int, layers: int) -> list[LinearRef]:
    W, act = m.W, str(cfg.activation_function)
    if W.has(f"{stack}.embed_positions"):
        side.writers.append(W.param(f"{stack}.embed_positions", "weight", 1))
    if t.embed_norm:
        m.norm(f"{stack}.layernorm_embedding", side)
    kv = []
    for i in range(layers):
        lp = f"{stack}.layers.{i}"
        qkv = m.attention(f"{lp}.self_attn", _QKVO, heads, side, side)
        m.norm(f"{lp}.self_attn_layer_norm", side, qkv if t.pre_norm else ())
        if stack.endswith("decoder"):
            q, k, v = m.attention(f"{lp}.encoder_attn", _QKVO, heads, side, m.enc)
            m.norm(f"{lp}.encoder_attn_layer_norm", side, (q,) if t.pre_norm else ())
            kv += [k, v]
        up = m.ffn(lp, "fc1", "fc2", act, side)
        m.norm(f"{lp}.final_layer_norm", side, up if t.pre_norm else ())
    return kv


def describe_bart(t: BartLike, model: nn.Module, prefix: str) -> Structure:
    """The :class:`Structure` of a BART-like ``model`` by the table ``t`` (see the module docstring)."""
    cfg = model.config
    if not _is(model, t.classes):
        raise UnsupportedOperationError(f"{t.family} adapter: {type(model).__name__} is not supported "
                                        f"(supported: {', '.join(t.classes)})")
    W = Walker(model, prefix, t.family)
    base = base_path(model)
    enc_path, dec_path = join(base, "encoder"), join(base, "decoder")
    enc_table = f"{enc_path}.embed_tokens" if W.has(f"{enc_path}.embed_tokens") else None
    enc, dec = _sides(W, enc_table, f"{dec_path}.embed_tokens")
    m = _Model(W, enc, dec)
    if enc_table is not None:
        m.enc.writers.append(W.param(enc_table, "weight", 1))
    else:
        _whisper_front(m, cfg, enc_path)
    m.dec.writers.append(W.param(f"{dec_path}.embed_tokens", "weight", 1))
    _shared_table(W, base, m, (enc_table or f"{dec_path}.embed_tokens", f"{dec_path}.embed_tokens"))
    _bart_stack(m, t, cfg, enc_path, m.enc, cfg.encoder_attention_heads, cfg.encoder_layers)
    kv = _bart_stack(m, t, cfg, dec_path, m.dec, cfg.decoder_attention_heads, cfg.decoder_layers)
    heads = W.heads_reading((t.head,), cfg.d_model)
    m.dec.readers += [c for h in heads for c in h.cols()]
    if t.pre_norm:
        m.norm(f"{enc_path}.layer_norm", m.enc, kv)
        m.norm(f"{dec_path}.layer_norm", m.dec, heads)
    note = "pre-norm LayerNorm" if t.pre_norm else "post-norm: LayerNorm acts on the streams"
    return m.structure(t.family, model, cfg.d_model, _is(model, (t.classes[0],)), not t.pre_norm, (note,))


def _whisper_front(m: _Model, cfg, enc: str) -> None:
    """Whisper's audio front: ``conv1`` (mel bins → d_model, GELU) writes a hidden space read by ``conv2``, which
    writes the encoder stream; ``conv1``'s input columns read the features (not a space)."""
    c1, c2 = m.W.linear(f"{enc}.conv1"), m.W.linear(f"{enc}.conv2")
    m.hidden.append(Hidden(join(m.W.prefix, enc, "conv1"), c1.out_features, c1.rows(), c2.cols(), activation="gelu"))
    m.enc.writers += c2.rows()


def _whisper_example(model: nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    cfg = model.config
    return {"input_features": torch.randn(2, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=gen),
            "decoder_input_ids": torch.randint(0, cfg.vocab_size, (2, 5), generator=gen)}


_NO_ABSORB = ("{}: normalization absorption is not offered for encoder–decoders ({}); permutations of both streams, "
              "heads and FFNs are")

for _p, _f in (("T5", "t5"), ("MT5", "mt5"), ("UMT5", "umt5")):
    ADAPTERS.register(_f)(Adapter(_f, describe_t5, _seq2seq_example, _t5_classes(_p),
                                  absorb=_NO_ABSORB.format(_f, "a tied head scales the stream by d_model^-1/2")))
for _t, _why, _ex in ((BartLike("bart", "Bart", pre_norm=False), "post-norm", _seq2seq_example),
                      (BartLike("mbart", "MBart", pre_norm=True), "two streams", _seq2seq_example),
                      (BartLike("pegasus", "Pegasus", pre_norm=True, embed_norm=False), "two streams", _seq2seq_example),
                      (BartLike("whisper", "Whisper", pre_norm=True, embed_norm=False, head="proj_out"), "two streams",
                       _whisper_example)):
    ADAPTERS.register(_t.family)(Adapter(_t.family, lambda m, p, t=_t: describe_bart(t, m, p), _ex, _t.classes,
                                         absorb=_NO_ABSORB.format(_t.family, _why)))
