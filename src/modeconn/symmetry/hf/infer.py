"""The automatic fallback for a ``model_type`` without an adapter: a registered layout, only once it is shown to hold.

Many families are a known layout under a new name (Granite, Helium, SmolLM3 … are Llama's modules with scalar
multipliers). For such a model :func:`infer_adapter` tries every registered table (pre-norm
:data:`~modeconn.symmetry.hf.prenorm.TABLES`, post-LN :data:`~modeconn.symmetry.hf.bert.POST_LN`):

1. the table must *describe* the model — every module it names exists with the expected type and shapes, and
   every state-dict tensor is named (the builder's coverage check);
2. the resulting permutation spec must *keep the function* of a small random instance: the model's class built
   from its config with ``num_hidden_layers = 1`` (``2`` if the model has more), every parameter perturbed
   (``θ + 0.2·N(0, 1)``, so norm scales, biases and Q/K norms are generic), a random group element applied, and
   the outputs on the table's example inputs compared (``max|Δ| ≤ 1e-4 · max(1, max|y|)``).

The first table passing both is used; its absorption support is not assumed (``absorb`` states why). If none
passes, UnsupportedOperationError lists what each table could not match. Names and shapes alone (mergekit's
approach) cannot tell a symmetry from a coincidence — an ALiBi model or another fused QKV layout has the same
tensor names — so step 2 is not optional.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ...errors import ConfigError, SpecError, UnsupportedOperationError
from .builder import build_spec
from .registry import Adapter, supported_model_types

_ATOL = 1e-4
_NO_FIT = (SpecError, UnsupportedOperationError, ConfigError, AttributeError, TypeError, ValueError, RuntimeError)
_CACHE: dict[tuple[str, str, str], Adapter] = {}


def _candidates() -> list[tuple[str, Any, Any]]:
    """``(family, describe(model, prefix), example)`` for every registered table."""
    from . import bert, prenorm

    out = [(t.family, lambda m, p, t=t: prenorm.describe(replace(t, classes=(type(m).__name__,)), m, p), t.example)
           for t in prenorm.TABLES.values()]
    out += [(t.family, lambda m, p, t=t: bert.describe_post_ln(replace(t, base_classes=(type(m).__name__,)), m, p),
             bert.example) for t in bert.POST_LN]
    return out


def _small_instance(hf: nn.Module) -> nn.Module:
    cfg = copy.deepcopy(hf.config)
    n = getattr(cfg, "num_hidden_layers", None)
    if isinstance(n, int) and n > 2:
        cfg.num_hidden_layers = 2
    for f in ("layer_types",):  # per-layer lists sized by num_hidden_layers (sliding/full attention)
        if isinstance(getattr(cfg, f, None), list):
            setattr(cfg, f, getattr(cfg, f)[: cfg.num_hidden_layers])
    torch.manual_seed(0)
    small = type(hf)(cfg).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in small.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return small


def _outputs(model: nn.Module, x: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(**x)
    keys = ("logits",) if "logits" in out else ("last_hidden_state", "pooler_output")
    return [out[k].float() for k in keys if isinstance(out.get(k), torch.Tensor)]


def _keeps_function(describe, example, small: nn.Module) -> float:
    """The relative output change of ``small`` under a random element of the spec ``describe`` gives it."""
    spec = build_spec(describe(small, ""), small.state_dict())
    x = example(small, torch.Generator().manual_seed(0))
    ref = _outputs(small, x)
    moved = copy.deepcopy(small)
    moved.load_state_dict(spec.apply(small.state_dict(), spec.random_element(seed=0)))
    got = _outputs(moved.eval(), x)
    if not ref:
        raise ConfigError(f"{type(small).__name__} returned no logits / last_hidden_state to compare")
    return max(float((a - b).abs().max()) / max(1.0, float(a.abs().max())) for a, b in zip(ref, got, strict=True))


def infer_adapter(hf: nn.Module) -> Adapter:
    """An :class:`Adapter` for ``hf`` (a ``transformers.PreTrainedModel`` whose ``model_type`` has none), from the
    first registered layout that describes it and keeps the function of a small random instance (module docstring).

    Raises UnsupportedOperationError naming, per registered layout, what did not match.
    """
    mt, cls = getattr(hf.config, "model_type", "?"), type(hf).__name__
    key = (mt, cls, hf.config.to_json_string(use_diff=False) if hasattr(hf.config, "to_json_string") else repr(hf.config))
    if key in _CACHE:
        return _CACHE[key]
    reasons: list[str] = []
    small = None
    for family, describe, example in _candidates():
        try:
            build_spec(describe(hf, ""), hf.state_dict())
        except _NO_FIT as exc:
            reasons.append(f"{family}: {str(exc).splitlines()[0][:200]}")
            continue
        small = small if small is not None else _small_instance(hf)
        try:
            err = _keeps_function(describe, example, small)
        except _NO_FIT as exc:
            reasons.append(f"{family}: fits the names, but not a small instance of the model ({exc})")
            continue
        if not err <= _ATOL:  # NaN too
            reasons.append(f"{family}: its names fit, but a random permutation changed the outputs of a small random "
                           f"instance by {err:.3g} (relative), so it is not a symmetry of this model")
            continue
        adapter = Adapter(f"{family} (inferred for {mt})", describe, example, (cls,),
                          absorb=f"{mt} has no adapter of its own: its layout was inferred from the {family} table and "
                                 "checked for permutations only")
        _CACHE[key] = adapter
        return adapter
    raise UnsupportedOperationError(
        f"no symmetry adapter for Hugging Face model_type {mt!r} ({cls}), and no registered layout fits it "
        f"(registered model types: {', '.join(supported_model_types())}):\n  " + "\n  ".join(reasons)
    )
