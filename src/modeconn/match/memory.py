"""Memory model of sharded dual matching (:mod:`modeconn.match.sharded`): the peak bytes one rank holds.

For a GPT-NeoX / Llama-style decoder described by its Hugging Face config (hidden size ``d``, ``L`` layers, ``H``
attention heads of ``d_h = d/H`` dims (``r`` of them rotary), ``H_kv`` key/value heads, FFN width ``f``, vocabulary
``V``), ``W`` ranks, endpoints stored with ``s`` bytes per element, global batches of ``B`` rows of ``T`` tokens:

    peak = base + E_store + E_leaf + E_transforms + E_activations + E_process

* ``E_store = 2 · Σ_k ⌈n_k / W⌉ · m_k · s`` — both endpoints' frozen tensors (tensor ``k`` of ``n_k`` rows × ``m_k``
  other elements: the floating tensors of the model's state dict, built on the meta device from the config, with a
  tied embedding counted twice — absorption unties it; the norm vectors absorption drops and the reader biases it
  adds for LayerNorm biases are ``O(L·d)`` and not corrected for). The rows are copied out of the safetensors memory
  map, so these are the process's own bytes.
* ``E_leaf + E_process = max_ℓ Σ_{k∈ℓ} c_k`` — the largest *leaf* (a module's own tensors ``k`` of ``t_k`` elements:
  embedding, LM head, attention or FFN projection) materialised at once, ``E_leaf`` its fp32 part and ``E_process``
  its all-gathered endpoints. A tensor transformed whole (one process; vectors; an attention matrix whose head axis
  does not split into blocks of whole heads) costs ``6 · 4 · t_k`` in fp32 — in the forward the transformed
  ``π_A(a)``, ``π_B(b)`` and the interpolation's temporaries; in the backward the recomputed endpoints autograd keeps
  for the transforms, ``θ``, ``∂θ`` and its two images — plus ``[W > 1] · 2 · s · t_k`` of ``E_process``: the
  all-gather of its two endpoints (one gathered buffer of the stored dtype each,
  :meth:`~modeconn.match.sharded.ShardedEndpoints.full`). A *block-local* matrix (``W > 1``; :func:`block_local`:
  an axis no learned transform acts on — embeddings, LM head, FFN projections, and every matrix when the residual or
  both head spaces are frozen — or an attention head axis whose ``⌈n / W⌉``-entry blocks hold whole heads, the
  per-head maps then acting block by block) is transformed and interpolated on the rank's block
  (``6 · 4 · ⌈t_k / W⌉``) and only ``θ`` is gathered whole: ``3 · 4 · t_k`` — the gathered ``θ`` the module keeps,
  ``∂θ`` and the all-reduced ``∂θ`` of :func:`~modeconn.match.sharded.gather_blocks`' backward. One process's
  local tensors are the whole ones and are used as they are (no gather).
* ``E_transforms = 4 · σ · [(4·P + Bf) / W + 2·(El − El_h + El_h / W_h)]`` (``σ`` learned sides: 2 for dual, 1 for
  one-sided) — per side the FSDP-sharded parameters, their gradients and two Adam moments, and the trivialisation
  bases (held as frozen parameters, sharded with them); the elements and their gradients (the model's forward and
  backward use them as detached leaves; each transform's own graph is rebuilt one module at a time afterwards, when
  the activations are gone): the residual's replicated, the per-head ones (``El_h``) cut to the heads of the rank's
  blocks — ``W_h = W`` where :func:`heads_split` (the learned residual's attention matrices all split at head
  boundaries and ``W`` divides ``H_kv``), else 1. Counts (:func:`transform_counts`): orthogonal residual
  ``P = Bf = El = d²``; per layer and per QK / OV space (``p = r/2`` rotary pairs, ``q = d_h − r``; ``r = 0`` for OV)
  ``head_orthogonal``: ``P = H_kv(p + q²)``, ``Bf = H_kv(d_h² + q²)``; ``head_invertible``:
  ``P = H_kv(2p + 2q² + q)``, ``Bf = H_kv(d_h² + 2q²)``; ``El = El_h = H_kv·d_h²`` for both.
  Permutation spaces (heads, FFN) are frozen from weight matching: 0 bytes here.
* ``E_activations = 4 · [L·b·T·(10·d + 2·f + c_att·H·T) + 3·b·T·V]`` — data parallel, ``b = ⌈B / W⌉`` rows per
  rank: per layer the tensors autograd keeps (the inputs of the four checkpointed leaves: QKV, attention output, FFN
  up and down projections, ``3·d + f``; the normalised residual stream, ``d``; the QKV output, the rotated Q and K and
  the attention output, ``6·d``; the FFN activation's input, ``f``: ``10·d + 2·f`` per token; ``c_att = 2`` when the
  attention matrix and its softmax are kept — eager / math attention — else 0, flash / memory-efficient kernels), and
  the logits' log-softmax, the logits' gradient and its temporary (``3·V`` per token).
* The per-rank copy of the fixed-size runtime (gloo, DTensor and FSDP state) is part of ``base``.
* ``base``: the process itself (interpreter, libraries, CUDA context, communication runtime), passed in; not modelled.

:func:`pythia_table` evaluates the model for Pythia 1B / 2.8B / 6.9B (configs :data:`PYTHIA`, from the Hugging
Face ``config.json`` of ``EleutherAI/pythia-*``) on 1 and 8 accelerators. Units: bytes (decimal GB in the table).
Errors: ConfigError for a config without the sizes above or a group the model has no term for.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..errors import ConfigError

#: the groups of dual matching's transformer runs (learned: residual, qk, vo; frozen from weight matching: heads, ffn)
DUAL_GROUPS = {"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible", "vo": "head_invertible",
               "ffn": "permutation"}
_FROZEN = (None, "permutation")
#: GPT-NeoX configs of Pythia (EleutherAI/pythia-1b, -2.8b, -6.9b config.json)
PYTHIA = {
    "pythia-1b": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 8, "intermediate_size": 8192,
                  "vocab_size": 50304, "rotary_pct": 0.25},
    "pythia-2.8b": {"hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
                    "intermediate_size": 10240, "vocab_size": 50304, "rotary_pct": 0.25},
    "pythia-6.9b": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                    "intermediate_size": 16384, "vocab_size": 50432, "rotary_pct": 0.25},
}
H200_BYTES = 141 * 10**9


@dataclass(frozen=True)
class Shape:
    """The sizes the model needs (module docstring's symbols)."""

    d: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rotary: int
    ffn: int
    vocab: int
    tensors: tuple[tuple[str, int, int], ...]  # (key, n_k rows, m_k other elements) of the state dict (:func:`_tensors`)

    @classmethod
    def from_config(cls, config: Any) -> Shape:
        """From a transformers config or a dict of its fields (GPT-NeoX or Llama names). ConfigError if sizes lack."""
        get = config.get if isinstance(config, Mapping) else (lambda k, default=None: getattr(config, k, default))
        try:
            d, layers, heads = int(get("hidden_size")), int(get("num_hidden_layers")), int(get("num_attention_heads"))
            ffn, vocab = int(get("intermediate_size")), int(get("vocab_size"))
        except (TypeError, ValueError):
            raise ConfigError("memory model: the config needs hidden_size, num_hidden_layers, num_attention_heads, "
                              "intermediate_size and vocab_size") from None
        head_dim = int(get("head_dim", None) or d // heads)
        kv = int(get("num_key_value_heads", None) or heads)
        rope = get("rope_parameters", None) or {}
        pct = get("rotary_pct", None) or get("partial_rotary_factor", None) or rope.get("partial_rotary_factor") or 1.0
        rotary = int(head_dim * float(pct)) // 2 * 2
        return cls(d, layers, heads, kv, head_dim, rotary, ffn, vocab, _tensors(config))

    @property
    def params(self) -> int:
        return sum(n * m for _, n, m in self.tensors)

    @property
    def largest_leaf(self) -> int:
        """Elements of the largest module's own tensors (weight + bias)."""
        leaves: dict[str, int] = {}
        for key, n, m in self.tensors:
            leaves[key.rsplit(".", 1)[0]] = leaves.get(key.rsplit(".", 1)[0], 0) + n * m
        return max(leaves.values())

    def leaves(self) -> dict[str, list[tuple[str, int, int]]]:
        """Module → its tensors ``(key, rows, other elements)`` (matrices: other elements > 1)."""
        out: dict[str, list[tuple[str, int, int]]] = {}
        for key, n, m in self.tensors:
            out.setdefault(key.rsplit(".", 1)[0], []).append((key, n, m))
        return out


def _tensors(config: Any) -> tuple[tuple[str, int, int], ...]:
    """``(key, rows, other elements)`` of every tensor of the model ``config`` describes, built on the meta device (no
    memory), with the input embedding counted again as an untied LM head where tied (absorption unties)."""
    from ..symmetry.hf.config_check import build_meta_model, config_class

    if isinstance(config, Mapping):
        fields = {k: v for k, v in config.items() if k != "model_type"}
        config = config_class(config.get("model_type", "gpt_neox"), "config")(**fields)
    model = build_meta_model(config, "config")
    out = tuple((k, t.shape[0] if t.dim() else 1, math.prod(t.shape[1:]) if t.dim() else 1)
                for k, t in model.state_dict().items() if t.is_floating_point())
    if getattr(config, "tie_word_embeddings", False):
        emb = model.get_input_embeddings().weight
        out += (("lm_head.untied.weight", emb.shape[0], emb.shape[1]),)
    return out


def transform_counts(shape: Shape, groups: Mapping[str, str | None] = DUAL_GROUPS) -> dict[str, int]:
    """Per learned side: ``params`` (P), ``buffers`` (Bf) and ``elements`` (El) of the continuous transforms, and
    ``head_elements`` (El_h: the per-head part of El) (module docstring). ConfigError for a group of ``residual`` /
    ``qk`` / ``vo`` / ``heads`` / ``ffn`` without a term."""
    p = {"params": 0, "buffers": 0, "elements": 0, "head_elements": 0}
    res = groups.get("residual")
    if res == "orthogonal":
        p = {"params": shape.d ** 2, "buffers": shape.d ** 2, "elements": shape.d ** 2, "head_elements": 0}
    elif res not in _FROZEN:
        raise ConfigError(f"memory model: residual group {res!r} has no term (orthogonal or permutation)")
    for space, r in (("qk", shape.rotary), ("vo", 0)):
        kind = groups.get(space)
        if kind in _FROZEN:
            continue
        pairs, q, hd, g = r // 2, shape.head_dim - r, shape.head_dim, shape.kv_heads
        if kind == "head_orthogonal":
            par, buf = g * (pairs + q * q), g * (hd * hd + q * q)
        elif kind == "head_invertible":
            par, buf = g * (2 * pairs + 2 * q * q + q), g * (hd * hd + 2 * q * q)
        else:
            raise ConfigError(f"memory model: {space} group {kind!r} has no term (head_orthogonal, head_invertible)")
        p["params"] += shape.layers * par
        p["buffers"] += shape.layers * buf
        p["elements"] += shape.layers * g * hd * hd
        p["head_elements"] += shape.layers * g * hd * hd
    for space in ("heads", "ffn"):
        if groups.get(space) not in _FROZEN:
            raise ConfigError(f"memory model: {space} must be a permutation frozen from weight matching "
                              f"(got {groups.get(space)!r}); learned permutation latents are not modelled")
    return p


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-rank peak bytes of sharded dual matching, by term (module docstring); ``total`` their sum."""

    endpoints: int
    leaf: int
    transforms: int
    activations: int
    process: int
    base: int

    @property
    def total(self) -> int:
        return self.endpoints + self.leaf + self.transforms + self.activations + self.process + self.base

    def to_json(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def dual_memory(config: Any, *, world: int = 1, dtype: torch.dtype = torch.bfloat16, batch: int = 8,
                seq_len: int = 2048, groups: Mapping[str, str | None] = DUAL_GROUPS, one_sided: bool = False,
                attention_matrix: bool = False, base_bytes: int = 0) -> MemoryEstimate:
    """The modelled per-rank peak of sharded dual matching (module docstring): ``config`` a transformers config or a
    dict of its fields; ``world`` ranks; ``dtype`` the endpoints' stored dtype; ``batch`` global rows of ``seq_len``
    tokens; ``groups`` learned (continuous) vs frozen (permutation) spaces; ``one_sided`` learns B's side only;
    ``attention_matrix``: eager / math attention keeps the ``T×T`` matrices; ``base_bytes`` the process baseline.
    ConfigError for ``world < 1``, ``batch < world`` or an unsupported group."""
    if world < 1 or batch < world:
        raise ConfigError(f"memory model: need 1 ≤ world ≤ batch (got world={world}, batch={batch})")
    shape = Shape.from_config(config)
    s = torch.empty((), dtype=dtype).element_size()
    store = 2 * sum(math.ceil(n / world) * m * s for _, n, m in shape.tensors)
    leaf, process = leaf_terms(shape, world, s, groups)
    t = transform_counts(shape, groups)
    sides = 1 if one_sided else 2
    held = t["elements"] - t["head_elements"] + t["head_elements"] // (world if heads_split(shape, world, groups) else 1)
    transforms = 4 * sides * ((4 * t["params"] + t["buffers"]) // world + 2 * held)
    rows = math.ceil(batch / world)
    per_token = shape.layers * (10 * shape.d + 2 * shape.ffn + (2 * shape.heads * seq_len if attention_matrix else 0))
    acts = 4 * rows * seq_len * (per_token + 3 * shape.vocab)
    return MemoryEstimate(store, leaf, transforms, acts, process, int(base_bytes))


_ATTENTION = re.compile(r"\.(attention|self_attn|attn)\.")


def block_local(key: str, rows: int, cols: int, world: int, shape: Shape,
                groups: Mapping[str, str | None] = DUAL_GROUPS) -> bool:
    """Whether the ``rows × cols`` matrix ``key`` splits over ``world`` ranks into blocks that transform on their own
    (module docstring): matrices outside attention (embeddings, LM head, FFN projections: the vocabulary / FFN axis
    is free or permuted by weight matching); attention matrices when the residual or both head spaces (QK and OV)
    are frozen (an axis is then free), or when their head axis — the rows, unless they are the residual's ``d``
    (output projections: the columns) — splits into ``⌈n / W⌉``-entry blocks of whole heads (multiples of ``d_h``).
    Vectors (biases, norms) count as transformed whole."""
    if not _ATTENTION.search(key):
        return True
    if groups.get("residual") in _FROZEN or all(groups.get(s) in _FROZEN for s in ("qk", "vo")):
        return True
    n = rows if rows != shape.d else cols
    return -(-n // world) % shape.head_dim == 0


def heads_split(shape: Shape, world: int, groups: Mapping[str, str | None] = DUAL_GROUPS) -> bool:
    """Whether each rank reads only ``1/W`` of the per-head (QK / OV) elements: ``W`` divides the key/value heads and
    every attention matrix is block-local along its head axis (:func:`block_local`)."""
    return world > 1 and shape.kv_heads % world == 0 and groups.get("residual") not in _FROZEN and all(
        block_local(k, n, m, world, shape, groups) for k, n, m in shape.tensors if m > 1 and _ATTENTION.search(k))


def leaf_terms(shape: Shape, world: int, s: int, groups: Mapping[str, str | None] = DUAL_GROUPS) -> tuple[int, int]:
    """``(E_leaf, E_process)`` bytes of the largest leaf (module docstring) for ``world`` ranks and endpoints of ``s``
    bytes per element."""
    best = (0, 0)
    for tensors in shape.leaves().values():
        fp32 = gathered = 0
        for key, rows, cols in tensors:
            t = rows * cols
            if world > 1 and cols > 1 and block_local(key, rows, cols, world, shape, groups):
                fp32 += 4 * (3 * t + 6 * math.ceil(t / world))
            else:
                fp32 += 6 * 4 * t
                gathered += 2 * s * t if world > 1 else 0
        best = max(best, (fp32, gathered), key=sum)
    return best


def pythia_table(worlds: Sequence[int] = (1, 8), device_bytes: int = H200_BYTES, *, batch: int = 8,
                 seq_len: int = 2048, dtype: torch.dtype = torch.bfloat16) -> list[dict[str, Any]]:
    """:func:`dual_memory` for each :data:`PYTHIA` model and world size: rows with ``model``, ``params``, ``world``,
    the terms and ``total`` (bytes), ``fits`` (``total ≤ device_bytes``) and ``max_batch`` (the largest global batch
    of ``seq_len`` tokens, a multiple of ``world``, that fits; 0 if none)."""
    rows = []
    for name, cfg in PYTHIA.items():
        for world in worlds:
            est = dual_memory(cfg, world=world, dtype=dtype, batch=max(batch, world), seq_len=seq_len)
            rows.append({"model": name, "params": Shape.from_config(cfg).params, "world": world,
                         "batch": max(batch, world), "seq_len": seq_len, **est.to_json(),
                         "fits": est.total <= device_bytes,
                         "max_batch": _max_batch(cfg, world, device_bytes, seq_len, dtype)})
    return rows


def _max_batch(cfg, world: int, device_bytes: int, seq_len: int, dtype: torch.dtype) -> int:
    """The largest multiple of ``world`` rows (up to 4096) whose estimate fits ``device_bytes`` (0: none fits)."""
    lo, hi = 0, 4096 // world
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if dual_memory(cfg, world=world, dtype=dtype, batch=mid * world, seq_len=seq_len).total <= device_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * world
