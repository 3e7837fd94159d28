"""The registry of merge rules: how the (aligned) endpoints' tensors combine into the merged tensor.

Each :class:`MergeRule` has a name, a one-line summary, its source (modeconn's own, or the library it comes from)
and ``combine(tensors, weights, key) -> tensor``, applied to every floating tensor by
:func:`~modeconn.path.interpolate.weighted_average` — in memory (:func:`modeconn.merge`) and tensor by tensor when
streaming (:func:`modeconn.stream_merge`). Integer buffers and shared fixed structure are never combined. Adding a
rule is one entry here (``modeconn merge --rule`` lists the registered rules).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..registry import Registry

Combine = Callable[[Sequence[torch.Tensor], Sequence[float], str], torch.Tensor]


@dataclass(frozen=True)
class MergeRule:
    """``name`` (``--rule``), ``summary``, ``source`` (citation / library), ``combine(tensors, weights, key)`` returning
    the merged tensor in ``tensors[0]``'s dtype, and ``affine``: the rule returns ``θ`` exactly when every input is
    ``θ`` and the weights sum to 1 (so such tensors are passed through without rounding)."""

    name: str
    summary: str
    source: str
    combine: Combine
    affine: bool = True


MERGE_RULES: Registry[MergeRule] = Registry("merge rule")
"""Every merge rule by name (``MERGE_RULES.get(name)``: ConfigError listing the names for a typo)."""


def register_rule(rule: MergeRule) -> MergeRule:
    """Add ``rule`` to :data:`MERGE_RULES` (ConfigError for a duplicate name); returns it."""
    return MERGE_RULES.register(rule.name)(rule)


def linear(tensors: Sequence[torch.Tensor], weights: Sequence[float], key: str) -> torch.Tensor:
    """``Σ_i w_i t_i`` accumulated in fp32 (fp64/complex128 in their own precision), cast to ``tensors[0]``'s dtype
    (NonFiniteError naming ``key`` if the cast overflows)."""
    from .interpolate import checked_cast

    t = tensors[0]
    acc = torch.zeros(t.shape, dtype=torch.promote_types(t.dtype, torch.float32), device=t.device)
    for w, x in zip(weights, tensors, strict=True):
        acc.add_(x.to(acc.dtype), alpha=w)
    return checked_cast(acc, t.dtype, key)


register_rule(MergeRule("linear", "weighted average Σ wᵢθᵢ of the (aligned) models",
                        "model soups / weight averaging; equal to mergekit's linear merge", linear))
