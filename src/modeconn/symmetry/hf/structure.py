"""The structural description of a transformer that an adapter emits (group-agnostic).

An adapter (one module per Hugging Face family) walks a model and describes *where* things are — never
which group acts on them. A :class:`Structure` lists, by state-dict key, axis and index range:

- the **residual stream**: its writers (embeddings, position embeddings, CLS token, attention output and
  MLP output projections incl. biases — output side), the normalisation layers sitting on it (their
  scale/shift, and the linear layers reading each norm's output) and every reader's input columns
  (Q/K/V, FFN up/gate, LM head, classifier);
- every **attention** layer: per query head its Q rows and O columns, per key/value head its K and V rows
  and the query heads sharing it (grouped-query attention), the head dimension and which dims carry
  rotary position embeddings;
- every **FFN**: the hidden writers on the linear branch (``up``) and the gate branch (``gate``, GLU
  only), the readers (``down``) and the activation;
- every **Mixture-of-Experts** layer: the router's rows, the stacked expert banks and the hidden units inside
  each expert;
- other hidden spaces (a pooler read by a classifier), tensors no group acts on, tied tensors.

:func:`modeconn.symmetry.hf.build_spec` turns a structure into a :class:`SymmetrySpec` for a requested
group per *role* (residual, qk, vo, ffn); the same structure serves richer groups (orthogonal residual
after normalization absorption, invertible QK/OV circuits, FFN scaling, head permutations) and
:func:`modeconn.absorb_normalization`.

A :class:`Slice` ``(key, axis, offset, size)`` is one index range of one tensor axis. Its *side* comes from
the list it is in: writers/``q``/``k``/``v``/``up``/``gate``/norm parameters are output side, readers/``o``/
``down`` input side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

NormKind = Literal["layernorm", "rmsnorm", "rms", "affine"]
"""``layernorm``: (x − mean)/std · γ + β; ``rmsnorm``: x/rms · γ; ``rms``: x/rms, no parameters (absorbed);
``affine``: x · γ + β, no normalisation (MobileBERT's NoNorm).
The scale is ``offset + weight`` (:attr:`NormRef.offset`; Gemma's RMSNorm: ``1 + w``)."""


@dataclass(frozen=True)
class Slice:
    """Entries ``[offset, offset + size)`` of axis ``axis`` of tensor ``key`` (``size=None``: to the end)."""

    key: str
    axis: int
    offset: int = 0
    size: int | None = None

    def sub(self, start: int, size: int) -> Slice:
        """The part ``[start, start + size)`` of this slice (relative to its offset)."""
        return Slice(self.key, self.axis, self.offset + start, size)


@dataclass(frozen=True)
class LinearRef:
    """A Linear-like module at ``path``: its weight key, bias key (or ``None``) and which weight axis holds
    the outputs and which the inputs (``nn.Linear``: out 0 / in 1; GPT-2's ``Conv1D``: out 1 / in 0;
    a patch ``Conv2d``: out 0 / in 1 (pixels))."""

    path: str
    weight: str
    bias: str | None
    out_axis: int
    in_axis: int
    out_features: int
    in_features: int

    def rows(self, offset: int = 0, size: int | None = None) -> tuple[Slice, ...]:
        """Output units ``[offset, offset+size)``: weight along the output axis and the bias."""
        out = (Slice(self.weight, self.out_axis, offset, size),)
        return out + ((Slice(self.bias, 0, offset, size),) if self.bias is not None else ())

    def cols(self, offset: int = 0, size: int | None = None) -> tuple[Slice, ...]:
        """Input units ``[offset, offset+size)``: weight along the input axis."""
        return (Slice(self.weight, self.in_axis, offset, size),)


@dataclass(frozen=True)
class NormRef:
    """A normalisation layer on a space: its parameters and the linear layers that read its output
    (empty when its output is a model output, e.g. a base model's final norm)."""

    path: str
    kind: NormKind
    eps: float
    size: int
    weight: str | None
    bias: str | None
    readers: tuple[LinearRef, ...] = ()
    offset: float = 0.0

    def params(self) -> tuple[Slice, ...]:
        return tuple(Slice(k, 0) for k in (self.weight, self.bias) if k is not None)


@dataclass(frozen=True)
class Stream:
    """The residual stream (hidden size ``size``).

    ``is_output``: the stream itself is returned (a base model's ``last_hidden_state``), so by default no
    group may act on it. ``post_norm``: the norms sit *on* the stream (BERT: ``x ← LN(x + f(x))``), so their
    scale/shift cannot be folded into readers.
    """

    size: int
    writers: tuple[Slice, ...]
    norms: tuple[NormRef, ...]
    readers: tuple[Slice, ...]
    is_output: bool = False
    post_norm: bool = False


@dataclass(frozen=True)
class QueryHead:
    """One query head: its Q rows (output side, ``head_dim`` entries) and O columns (input side, the value head's
    size). ``extra``: further slices that move with the head but belong to no QK space (multi-head latent
    attention's rotary Q rows, scored against a rotary key shared by every head; Swin's column of a relative
    position bias table)."""

    q: tuple[Slice, ...]
    o: tuple[Slice, ...]
    extra: tuple[Slice, ...] = ()


@dataclass(frozen=True)
class KVHead:
    """One key/value head: K and V rows, and the indices of the query heads that share it (GQA)."""

    k: tuple[Slice, ...]
    v: tuple[Slice, ...]
    queries: tuple[int, ...]


@dataclass(frozen=True)
class Attention:
    """One self-attention layer. ``rotary_dims`` leading dims of every Q/K head carry rotary position
    embeddings; ``rotary_style="half"`` (``rotate_half``) rotates dim ``i`` with dim ``i + rotary_dims/2``
    at frequency ``θ_i`` (distinct per ``i``), so only 2×2 rotation-commuting maps of each such pair (and no
    permutation of pairs) preserve the function; ``"interleaved"`` (GPT-J) pairs ``(2i, 2i + 1)``.

    ``frozen_roles``: roles (``heads``, ``qk``) that are no symmetry of this layer and stay unbound whatever group
    is requested — ALiBi's slopes are fixed per head index (no head permutation); a norm shared by every head's
    Q/K (Qwen3's per-head ``q_norm``) follows no per-head map or per-dim permutation. ``permutation_only``:
    roles on which only permutations act (an elementwise op on Q/K/V such as OLMo's ``clip_qkv``, or a Q/K norm
    over the whole projection whose weights move with the rows); continuous per-head groups leave them unbound.
    ``v_head_dim``: the V rows' and O columns' size per head where it differs from the Q/K ``head_dim``."""

    path: str
    head_dim: int
    heads: tuple[QueryHead, ...]
    kv_heads: tuple[KVHead, ...]
    rotary_dims: int = 0
    rotary_style: str | None = None
    frozen_roles: tuple[str, ...] = ()
    permutation_only: tuple[str, ...] = ()
    v_head_dim: int | None = None

    @property
    def v_dim(self) -> int:
        """The value heads' size (``head_dim`` unless ``v_head_dim`` says otherwise: multi-head latent attention)."""
        return self.head_dim if self.v_head_dim is None else self.v_head_dim


@dataclass(frozen=True)
class FFN:
    """A feed-forward block with hidden size ``size``: ``down(act(gate) * up)`` (GLU) or ``down(act(up))``."""

    path: str
    size: int
    up: tuple[Slice, ...]
    down: tuple[Slice, ...]
    gate: tuple[Slice, ...] = ()
    activation: str = ""


@dataclass(frozen=True)
class Experts:
    """A Mixture-of-Experts layer: ``count`` experts of ``size`` hidden units each, stored as stacked banks (one
    tensor per projection, the expert index on one axis) and a router with one row per expert.

    ``router``: the router's rows (output side, one unit per expert); ``banks``: ``(slice, side)`` per stacked tensor,
    the slice covering its whole expert axis; ``up`` / ``gate`` (output side) and ``down`` (input side): the hidden
    units *inside* each expert — slices of the banks on their hidden axis, the same entries for every expert (the
    expert axis is the bank's). Experts permute with their router rows; each expert's hidden units permute on
    their own."""

    path: str
    count: int
    size: int
    router: tuple[Slice, ...]
    banks: tuple[tuple[Slice, str], ...]
    up: tuple[Slice, ...]
    down: tuple[Slice, ...]
    gate: tuple[Slice, ...] = ()
    activation: str = ""

    def expert_axis(self, key: str) -> int:
        """The expert axis of the bank ``key``."""
        return next(sl.axis for sl, _ in self.banks if sl.key == key)


@dataclass(frozen=True)
class Hidden:
    """Any other hidden space (a pooler whose output a classifier reads): writers, norm params, readers.

    ``joins_stream``: the space must carry the residual stream's transform (BERT's MLM transform, whose
    decoder is tied to the word embeddings). ``probe``: ``(module, "input" | "output", offset)`` where activation
    matching observes the space, when that is not the first reader's input (Mamba's state: ``x_proj``'s B rows)."""

    name: str
    size: int
    writers: tuple[Slice, ...]
    readers: tuple[Slice, ...]
    norms: tuple[Slice, ...] = ()
    activation: str = ""
    joins_stream: bool = False
    probe: tuple[str, str, int] | None = None


@dataclass(frozen=True)
class Structure:
    """Everything an adapter knows about one model (see the module docstring).

    ``frozen``: keys no group acts on and no slice names (output-layer biases, buffers); every state-dict key
    must be named by a slice, listed here or be a tied alias, else the builder raises SpecError naming it.
    ``aliases``: tied tensors, ``alias key → primary key`` (same storage in the state dict; filled by
    :func:`modeconn.symmetry.hf.describe`). ``prefix``: the HF model's path inside a wrapper (``""`` if none).
    ``encoder_stream``: an encoder–decoder's encoder residual stream where it is a space of its own (untied encoder
    and decoder embeddings, or no token embeddings in the encoder: Whisper); ``stream`` is then the decoder's, and
    cross-attention's K/V columns read the encoder stream. With tied embeddings both streams are one space: ``stream``.
    """

    family: str
    model_type: str
    model_class: str
    prefix: str
    stream: Stream
    attentions: tuple[Attention, ...] = ()
    ffns: tuple[FFN, ...] = ()
    hidden: tuple[Hidden, ...] = ()
    experts: tuple[Experts, ...] = ()
    frozen: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    encoder_stream: Stream | None = None

    def slices(self) -> list[Slice]:
        """Every slice the structure names (for coverage checks)."""
        out = []
        for s in (self.stream, self.encoder_stream):
            if s is not None:
                out += [*s.writers, *s.readers, *(p for n in s.norms for p in n.params())]
        for a in self.attentions:
            for h in a.heads:
                out += [*h.q, *h.o, *h.extra]
            for kv in a.kv_heads:
                out += [*kv.k, *kv.v]
        for f in self.ffns:
            out += [*f.up, *f.gate, *f.down]
        for h in self.hidden:
            out += [*h.writers, *h.readers, *h.norms]
        for e in self.experts:
            out += [*e.router, *(sl for sl, _ in e.banks), *e.up, *e.gate, *e.down]
        return out
