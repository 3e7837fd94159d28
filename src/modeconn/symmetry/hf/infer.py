"""The automatic fallback for a ``model_type`` without an adapter: a registered layout, only once it is shown to hold.

Many families are a known layout under a new name (Granite, Helium, SmolLM3 … are Llama's modules with scalar
multipliers). For such a model :func:`infer_adapter` tries every registered table (pre-norm
:data:`~modeconn.symmetry.hf.prenorm.TABLES`, post-LN :data:`~modeconn.symmetry.hf.bert.POST_LN`):

1. the table must *describe* the model — every module it names exists with the expected type and shapes, and
   every state-dict tensor is named (the builder's coverage check);
2. the resulting permutation spec must *keep the function* of a random instance of the model's class
   (:func:`verification_config`): every layer the config describes (all of them; fewer only when the instance would
   exceed :data:`VERIFY_PARAMETERS`, then narrower heads and FFNs first, and at least every distinct entry of a
   per-layer config list and every layer up to any layer period or threshold the config states), every parameter
   perturbed (``θ + 0.2·N(0, 1)``, so norm scales, biases and Q/K norms are generic), a random group element applied
   (its permutations move every unit: :func:`~modeconn.symmetry.selfcheck.moving_element`), and the outputs compared
   (``max|Δ| ≤ 1e-4 · max(1, max|y|)``) on the table's example inputs *and* on a sequence near the position limit
   (:func:`long_length`: ``max_position_embeddings`` less 2, shrunk to :data:`LONG_CAP` in the verification config
   where the position encoding does not depend on it — learned tables, RoPE without length-dependent scaling — and a
   sliding window shortened below that length, so that windowed layers differ from full ones);
3. the richer groups a spec may request (head permutations, per-head invertible/orthogonal Q/K and V/O maps, FFN
   scaling: :data:`RICH_GROUPS`) are checked the same way, all together and else role by role, each with those
   granted before it; only those that keep the function are granted (:attr:`Adapter.groups`), and
   :func:`~modeconn.symmetry.hf.hf_symmetry_spec` refuses the others.

The first table passing 1 and 2 is used; its absorption support is not assumed (``absorb`` states why). If none
passes, UnsupportedOperationError lists what each table could not match. Names and shapes alone (mergekit's
approach) cannot tell a symmetry from a coincidence — an ALiBi model or another fused QKV layout has the same
tensor names — so step 2 is not optional.

What it cannot see: behaviour that depends on values the verification instance does not take — positions beyond
:data:`LONG_CAP` when the position encoding depends on the length limit (dynamic, YaRN or LongRoPE scaling), layers
past the ones kept when the model is too large to instantiate whole, and code paths chosen by sizes that
:func:`verification_config` narrows.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ...errors import ConfigError, SpecError, UnsupportedOperationError
from ..selfcheck import moving_element, relative_change
from .builder import DEFAULTS, build_spec
from .config_check import LAYER_FIELDS, SIZE_FIELDS, estimate_parameters
from .registry import TOKEN_AND_GENERATION_FIELDS, Adapter, pretrained_class, supported_model_types

_ATOL = 1e-4
_NO_FIT = (SpecError, UnsupportedOperationError, ConfigError, AttributeError, TypeError, ValueError, RuntimeError,
           IndexError)
_CACHE: dict[tuple[str, type, str], Adapter] = {}  # by class, not name: two classes may share one

LONG_CAP = 256
"""The longest sequence the check runs on (positions beyond it are checked only where the verification config can
shrink its position limit to it without changing the position encoding)."""
VERIFY_PARAMETERS = 20_000_000
"""The largest verification instance (estimated parameters, :func:`~.config_check.estimate_parameters`) built whole;
a larger config is narrowed, then cut to as many layers as fit (at least those :func:`layers_needed` names)."""
VERIFY_TOKENS = 2_000_000_000
"""Parameters × tokens of the long sequence at most: a verification instance too large for :data:`LONG_CAP` tokens
runs a shorter long sequence."""
RICH_GROUPS: dict[str, str] = {"heads": "permutation", "qk": "head_invertible", "vo": "head_invertible",
                               "ffn_scale": "scaling"}
"""The richer groups checked after the permutations (head_orthogonal is a subgroup of head_invertible)."""
_SUBGROUPS = {"head_invertible": ("head_invertible", "head_orthogonal")}
_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")
_LENGTH_FREE_ROPE = {None, "default", "linear"}  # inverse frequencies that do not read the position limit
_MAX_VOCAB = 1024
_SHORT = 8  # the tables' example length (token_inputs)


def _candidates() -> list[tuple[str, Any, Any]]:
    """``(family, describe(model, prefix), example)`` for every registered table."""
    from . import bert, prenorm

    out = [(t.family, lambda m, p, t=t: prenorm.describe(replace(t, classes=(type(m).__name__,)), m, p), t.example)
           for t in prenorm.TABLES.values()]
    out += [(t.family, lambda m, p, t=t: bert.describe_post_ln(replace(t, base_classes=(type(m).__name__,)), m, p),
             bert.example) for t in bert.POST_LN]
    return out


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _layers(cfg: Any) -> tuple[str | None, int]:
    return next(((f, getattr(cfg, f)) for f in LAYER_FIELDS if _int(getattr(cfg, f, None))), (None, 0))


_NOT_LAYER_FIELDS = set(SIZE_FIELDS) | TOKEN_AND_GENERATION_FIELDS


def layers_needed(cfg: Any) -> int:
    """The fewest leading layers of ``cfg`` that hold every kind of layer it describes (at least 2): every distinct
    entry of a per-layer list (``layer_types`` …), a listed and an unlisted layer of a list of layer indices
    (``mlp_only_layers``), and every layer up to any other integer field below the layer count (a period such as
    ``sliding_window_pattern``, a threshold such as ``max_window_layers`` or ``first_k_dense_replace``)."""
    _, n = _layers(cfg)
    need = 2
    for k, v in cfg.to_dict().items():
        if k in _NOT_LAYER_FIELDS:
            continue
        if isinstance(v, (list, tuple)) and len(v) == n:  # one entry per layer
            first: dict[str, int] = {}
            for i, e in enumerate(v):
                first.setdefault(repr(e), i)
            need = max(need, max(first.values(), default=0) + 1)
        elif isinstance(v, (list, tuple)) and v and all(_int(e) and 0 <= e < n for e in v):  # layer indices
            unlisted = next((i for i in range(n) if i not in set(v)), n)
            need = max(need, min(v) + 1, unlisted + 1)
        elif _int(v) and 2 <= v < n:
            need = max(need, v + 1)
    return min(n, need)


def _fewer_layers(cfg: Any, n: int) -> None:
    """``cfg`` cut to its first ``n`` layers, per-layer lists and lists of layer indices with it."""
    field, total = _layers(cfg)
    if field is None or n >= total:
        return
    for k, v in cfg.to_dict().items():
        if k in _NOT_LAYER_FIELDS or not isinstance(v, (list, tuple)):
            continue
        if len(v) == total:
            setattr(cfg, k, type(v)(v[:n]))
        elif v and all(_int(e) and 0 <= e < total for e in v):
            setattr(cfg, k, type(v)(e for e in v if e < n))
    setattr(cfg, field, n)


def _narrow(cfg: Any) -> None:
    """Fewer attention heads (at most 2 key/value heads, at most 2 query heads each) with the hidden size in
    proportion, an FFN at most twice as wide, and at most :data:`_MAX_VOCAB` tokens (token ids folded into it); the
    head dimension, the rotary settings and every per-layer field are kept. What the sizes do not allow is left."""
    heads, hidden = getattr(cfg, "num_attention_heads", None), getattr(cfg, "hidden_size", None)
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    if _int(heads) and _int(hidden) and _int(kv) and heads % kv == 0:
        kv2 = min(kv, 2)
        heads2 = kv2 * min(heads // kv, 2)
        if heads2 < heads and (hidden * heads2) % heads == 0:
            cfg.num_attention_heads, cfg.hidden_size = heads2, hidden * heads2 // heads
            if getattr(cfg, "num_key_value_heads", None) is not None:
                cfg.num_key_value_heads = kv2
            for f in ("intermediate_size", "n_inner", "ffn_dim"):
                if _int(getattr(cfg, f, None)):
                    setattr(cfg, f, max(1, min(getattr(cfg, f) * heads2 // heads, 2 * cfg.hidden_size)))
    vocab = getattr(cfg, "vocab_size", None)
    if _int(vocab) and vocab > _MAX_VOCAB:
        cfg.vocab_size = _MAX_VOCAB
        for f in TOKEN_AND_GENERATION_FIELDS:
            v = getattr(cfg, f, None)
            if _int(v) or (isinstance(v, list) and v and all(_int(e) for e in v)):
                setattr(cfg, f, [e % _MAX_VOCAB for e in v] if isinstance(v, list) else v % _MAX_VOCAB)


def _length_free_rope(cfg: Any) -> bool:
    """Whether every RoPE the config names (``rope_parameters`` / ``rope_scaling``, per layer type too) computes its
    frequencies without reading ``max_position_embeddings``: none, default, linear, or llama3 with its own
    ``original_max_position_embeddings`` (dynamic NTK, YaRN and LongRoPE read the limit)."""
    for f in ("rope_parameters", "rope_scaling"):
        d = getattr(cfg, f, None)
        if not isinstance(d, dict):
            continue
        for entry in [v for v in d.values() if isinstance(v, dict)] or [d]:
            kind = entry.get("rope_type", entry.get("type"))
            if kind not in _LENGTH_FREE_ROPE and not (kind == "llama3" and "original_max_position_embeddings" in entry):
                return False
    return True


def _shorten_positions(cfg: Any) -> int | None:
    """The position limit of ``cfg`` after shrinking it to :data:`LONG_CAP` where that does not change the position
    encoding (``None``: the config states none)."""
    fields = [f for f in _POSITION_FIELDS if _int(getattr(cfg, f, None))]
    limit = max((getattr(cfg, f) for f in fields), default=None)
    if limit is not None and limit > LONG_CAP and _length_free_rope(cfg):
        for f in fields:
            setattr(cfg, f, min(getattr(cfg, f), LONG_CAP))
        limit = LONG_CAP
    return limit


def _shorten_window(cfg: Any, length: int) -> None:
    """A sliding window of ``length`` tokens or more shortened to half of it: it only chooses which positions attend,
    and over fewer tokens than the window a windowed layer computes what a full one does, unchecked."""
    window = getattr(cfg, "sliding_window", None)
    if _int(window) and window >= length:
        cfg.sliding_window = max(1, length // 2)


def long_length(limit: int | None) -> int:
    """The long sequence of the check: the position limit less 2 (RoBERTa's positions start after the padding id),
    at most :data:`LONG_CAP`."""
    return min(LONG_CAP, limit - 2) if limit is not None else LONG_CAP


def _cost(cfg: Any, layers: int | None = None) -> int:
    """The estimated parameters of ``cfg`` (with ``layers`` layers)."""
    d = cfg.to_dict()
    field, n = _layers(cfg)
    if field is not None and layers is not None:
        d[field] = layers
    return estimate_parameters(d)


def verification_config(config: Any) -> tuple[Any, int]:
    """The config of the verification instance and its long sequence length (:func:`long_length`): ``config`` with
    every layer, unless the estimate exceeds :data:`VERIFY_PARAMETERS` (then :func:`_narrow`, then as many layers as
    fit, never fewer than :func:`layers_needed`), the position limit of :func:`_shorten_positions` and the sliding
    window of :func:`_shorten_window`; the long length at most :data:`VERIFY_TOKENS` / parameters."""
    cfg = copy.deepcopy(config)
    limit = _shorten_positions(cfg)
    if _cost(cfg) > VERIFY_PARAMETERS:
        _narrow(cfg)
    if _cost(cfg) > VERIFY_PARAMETERS:
        per_layer = max(1, _cost(cfg, 2) - _cost(cfg, 1))
        _fewer_layers(cfg, max(layers_needed(cfg), (VERIFY_PARAMETERS - _cost(cfg, 1)) // per_layer + 1))
    length = min(long_length(limit), max(2 * _SHORT, VERIFY_TOKENS // max(1, _cost(cfg))))
    _shorten_window(cfg, length)
    return cfg, length


def _small_instance(hf: nn.Module) -> tuple[nn.Module, int]:
    """A perturbed random instance of ``hf``'s class built from :func:`verification_config`, and its long length."""
    cfg, length = verification_config(hf.config)
    torch.manual_seed(0)
    small = type(hf)(cfg).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in small.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return small, length


def _outputs(model: nn.Module, x: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(**x)
    keys = ("logits",) if "logits" in out else ("last_hidden_state", "pooler_output")
    return [out[k].float() for k in keys if isinstance(out.get(k), torch.Tensor)]


def _at_length(x: dict[str, torch.Tensor], n: int, vocab: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The example ``x`` (token inputs, sequence on the last axis) stretched to ``n`` tokens: new random token ids; the
    other inputs (attention mask, token types) keep their values on the last tokens and their first value before."""
    out = {}
    for k, v in x.items():
        if k == "input_ids":
            out[k] = torch.randint(0, vocab, (*v.shape[:-1], n), generator=gen)
        else:
            w = v[..., :1].expand(*v.shape[:-1], n).clone()
            w[..., n - v.shape[-1]:] = v
            out[k] = w
    return out


class _Check:
    """The verification instance of one model and its reference outputs on the table's example (token inputs:
    :data:`_SHORT` tokens) and on a sequence of ``length`` tokens (:func:`verification_config`)."""

    def __init__(self, small: nn.Module, length: int, example) -> None:
        self.small, self.example = small, example
        gen = torch.Generator().manual_seed(0)
        short = example(small, gen)
        self.inputs = [short]
        vocab = getattr(small.config, "vocab_size", None)
        ids = short.get("input_ids")
        if ids is not None and _int(vocab) and length > ids.shape[-1]:
            self.inputs.append(_at_length(short, length, vocab, gen))
        self.refs = [_outputs(small, x) for x in self.inputs]
        if not all(self.refs):
            raise ConfigError(f"{type(small).__name__} returned no logits / last_hidden_state to compare")

    def lengths(self) -> str:
        return " and ".join(str(x["input_ids"].shape[-1]) for x in self.inputs if "input_ids" in x) or "the example"

    def change(self, describe, groups: Any = "permutation") -> float:
        """The relative output change under a random element of the spec ``describe`` gives for ``groups``."""
        spec = build_spec(describe(self.small, ""), self.small.state_dict(), groups)
        moved = copy.deepcopy(self.small)
        moved.load_state_dict(spec.apply(self.small.state_dict(), moving_element(spec, 0)))
        return max(relative_change(ref, _outputs(moved.eval(), x)) for ref, x in zip(self.refs, self.inputs, strict=True))

    def granted(self, describe) -> dict[str, tuple[str, ...]]:
        """The groups per role that keep the function: permutations (checked already) and those of
        :data:`RICH_GROUPS` that pass, all together or else :meth:`_kept_one_by_one`."""
        passed = dict(RICH_GROUPS) if self._keeps(describe, RICH_GROUPS) else self._kept_one_by_one(describe)
        out = {r: ["permutation"] for r, g in DEFAULTS.items() if g is not None}
        for role, g in passed.items():
            out.setdefault(role, []).extend(_SUBGROUPS.get(g, (g,)))
        return {r: tuple(gs) for r, gs in out.items()}

    def _kept_one_by_one(self, describe) -> dict[str, str]:
        """The richer groups added role by role (a subgroup where the group fails), each kept only where a random
        element of it *and of every group kept before* keeps the function, so that what is granted holds together."""
        kept: dict[str, str] = {}
        for role, group in RICH_GROUPS.items():
            for g in _SUBGROUPS.get(group, (group,)):
                trial = kept | {role: g}
                if "heads" in trial:  # head permutations need per-head qk/vo groups (None: unbound)
                    trial = {"qk": None, "vo": None} | trial
                if self._keeps(describe, trial):
                    kept[role] = g
                    break
        return kept

    def _keeps(self, describe, groups: dict[str, str | None]) -> bool:
        try:
            return self.change(describe, groups) <= _ATOL
        except _NO_FIT:  # the layout does not admit this group (e.g. scaling of a non-homogeneous FFN)
            return False


def _refuse_composite(hf: nn.Module) -> None:
    """UnsupportedOperationError for a model that holds other Hugging Face models of their own configs (a multimodal
    wrapper without an adapter of its own — :mod:`.wrappers` has Llava's and Gemma-3's —, Mistral-3 conditional
    generation …): no pre-norm or post-LN layout reads a wrapper, whose
    projector writes the language model's stream, so the refusal names the models inside (the language model may be
    aligned alone)."""
    pretrained = pretrained_class()
    inner = [(n, m) for n, m in hf.named_modules() if n and pretrained is not None and isinstance(m, pretrained)
             and m.config is not hf.config]
    inner = [(n, m) for n, m in inner if not any(n.startswith(o + ".") for o, _ in inner)]
    if not inner:
        return
    parts = ", ".join(f"{n!r} ({type(m).__name__}, model_type {getattr(m.config, 'model_type', '?')!r})"
                      for n, m in inner)
    lm = next((n for n, _ in inner if n.endswith("language_model")), None)
    raise UnsupportedOperationError(
        f"{type(hf).__name__} (model_type {getattr(hf.config, 'model_type', '?')!r}) is a composite model holding "
        f"{parts}: modeconn has no adapter for it (a multimodal wrapper's projector writes the language model's "
        "residual stream, and the vision tower is a separate space), and no single-model layout is inferred for a "
        "wrapper" + (f"; its language model {lm!r} can be aligned on its own" if lm else ""))


def infer_adapter(hf: nn.Module) -> Adapter:
    """An :class:`Adapter` for ``hf`` (a ``transformers.PreTrainedModel`` whose ``model_type`` has none), from the
    first registered layout that describes it and keeps the function of a small random instance (module docstring).

    Raises UnsupportedOperationError naming, per registered layout, what did not match, or, for a composite model
    (a multimodal wrapper), saying so and naming the models inside.
    """
    mt, cls = getattr(hf.config, "model_type", "?"), type(hf).__name__
    key = (mt, type(hf), hf.config.to_json_string(use_diff=False) if hasattr(hf.config, "to_json_string") else repr(hf.config))
    if key in _CACHE:
        return _CACHE[key]
    _refuse_composite(hf)
    reasons: list[str] = []
    small, check = None, None
    for family, describe, example in _candidates():
        try:
            build_spec(describe(hf, ""), hf.state_dict())
        except _NO_FIT as exc:
            reasons.append(f"{family}: {str(exc).splitlines()[0][:200]}")
            continue
        try:
            small = small if small is not None else _small_instance(hf)
            check = check if check is not None and check.example is example else _Check(*small, example)
            err = check.change(describe)
        except _NO_FIT as exc:
            reasons.append(f"{family}: fits the names, but not a small instance of the model ({exc})")
            continue
        if not err <= _ATOL:  # NaN too
            reasons.append(f"{family}: its names fit, but a random permutation changed the outputs of a small random "
                           f"instance by {err:.3g} (relative; on {check.lengths()} tokens), so it is not a symmetry "
                           "of this model")
            continue
        groups = check.granted(describe)
        rich = sorted({g for gs in groups.values() for g in gs} - {"permutation"})
        adapter = Adapter(f"{family} (inferred for {mt})", describe, example, (cls,),
                          absorb=f"{mt} has no adapter of its own: its layout was inferred from the {family} table and "
                                 f"checked for permutations{' and ' + ', '.join(rich) if rich else ' only'}",
                          groups=groups)
        _CACHE[key] = adapter
        return adapter
    raise UnsupportedOperationError(
        f"no symmetry adapter for Hugging Face model_type {mt!r} ({cls}), and no registered layout fits it "
        f"(registered model types: {', '.join(supported_model_types())}):\n  " + "\n  ".join(reasons)
    )
