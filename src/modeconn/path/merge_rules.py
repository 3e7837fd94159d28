"""The registry of merge rules: how the (aligned) endpoints' tensors combine into the merged tensor.

Each :class:`MergeRule` has a name, a one-line summary, its source (modeconn's own, or the library it comes from)
and ``combine(tensors, weights, key) -> tensor``, applied to every floating tensor by
:func:`~modeconn.path.interpolate.weighted_average` — in memory (:func:`modeconn.merge`) and tensor by tensor when
streaming (:func:`modeconn.stream_merge`). Integer buffers and shared fixed structure are never combined. Adding a
rule is one entry here (``modeconn merge --rule`` lists the registered rules).

Rules taking more than weights — a base model (task arithmetic, TIES, DARE, SLERP …), parameters (``density``,
``t`` …), a seed — declare them (``base``, ``params``, ``random``) and receive a :class:`RuleSettings` as a fourth
argument (``contextual=True``). The rules of mergekit (``pip install 'modeconn[mergekit]'``) are registered from
:mod:`modeconn.path.merge_mergekit`: their per-tensor functions are called on our tensors, so alignment, streaming
and atomic output stay modeconn's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ConfigError
from ..registry import Registry

Combine = Callable[..., torch.Tensor]
"""``combine(tensors, weights, key)`` — plus ``settings`` (:class:`RuleSettings`) for a ``contextual`` rule."""

WEIGHT_SCOPES = ("all", "non_base", "none")
"""Which models a rule's weights are for: every model (an average), the non-base models (task vectors), none."""


@dataclass(frozen=True)
class RuleSettings:
    """What a run passes to a contextual rule besides the tensors and weights.

    ``base``: index of the base model among the inputs (``None``: no base). ``params``: shared parameters (name →
    a value, or mergekit's conditional form ``[{"filter": substring, "value": v}, …]`` resolved per tensor name).
    ``model_params``: per model, parameters overriding ``params`` for that model (recipes). ``seed``: the seed of a
    randomised rule (DARE). ``states``: per tensor key, the torch CPU generator state a randomised rule starts from
    (filled by :func:`~modeconn.path.merge_mergekit.plan_random_states`)."""

    base: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    model_params: Sequence[Mapping[str, Any]] = ()
    seed: int | None = None
    states: Mapping[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class MergeRule:
    """``name`` (``--rule``), ``summary``, ``source`` (citation / library), ``combine(tensors, weights, key)`` returning
    the merged tensor in ``tensors[0]``'s dtype, and ``affine``: the rule returns ``θ`` exactly when every input is
    ``θ`` and the weights sum to 1 (so such tensors are passed through without rounding).

    ``base``: ``"none"``, ``"optional"`` or ``"required"`` (a base model: task vectors are taken against it);
    ``weights``: one of :data:`WEIGHT_SCOPES`; ``params``: the names of the rule's parameters (``--param``);
    ``random``: the rule draws random numbers (seeded); ``contextual``: ``combine`` takes a :class:`RuleSettings`;
    ``requires``: the optional package it needs (checked before any work)."""

    name: str
    summary: str
    source: str
    combine: Combine
    affine: bool = True
    base: str = "none"
    weights: str = "all"
    params: tuple[str, ...] = ()
    random: bool = False
    contextual: bool = False
    requires: str | None = None

    def apply(self, tensors: Sequence[torch.Tensor], weights: Sequence[float], key: str,
              settings: RuleSettings | None = None) -> torch.Tensor:
        """The merged tensor for ``key`` (``settings`` only reaches contextual rules)."""
        if self.contextual:
            return self.combine(tensors, weights, key, settings if settings is not None else RuleSettings())
        return self.combine(tensors, weights, key)


MERGE_RULES: Registry[MergeRule] = Registry("merge rule")
"""Every merge rule by name (``MERGE_RULES.get(name)``: ConfigError listing the names for a typo)."""


def register_rule(rule: MergeRule) -> MergeRule:
    """Add ``rule`` to :data:`MERGE_RULES` (ConfigError for a duplicate name); returns it."""
    return MERGE_RULES.register(rule.name)(rule)


def check_rule_settings(rule: MergeRule | str, settings: RuleSettings | None, n_models: int, *,
                        weights_given: bool = False) -> MergeRule:
    """Check, before any work, that ``settings`` fit ``rule`` for ``n_models`` inputs; returns the rule.

    Raises ConfigError naming the option: an unknown rule or parameter (``--param``), a base index out of range or a
    base given to a rule without one (``--base``), ``--weights`` for a rule that takes none, a missing optional
    package (``pip install 'modeconn[mergekit]'``), or what the rule's own library says about the parameters."""
    rule = MERGE_RULES.get(rule) if isinstance(rule, str) else rule
    settings = settings or RuleSettings()
    if rule.requires is not None:
        _check_installed(rule)
    if settings.base is not None and not 0 <= settings.base < n_models:
        raise ConfigError(f"--base: model index {settings.base} out of range for {n_models} models")
    if settings.base is not None and rule.base == "none":
        raise ConfigError(f"--base: merge rule {rule.name!r} takes no base model")
    if weights_given and rule.weights == "none":
        raise ConfigError(f"--weights: merge rule {rule.name!r} takes no weights; its parameters are "
                          f"{', '.join(rule.params) or 'none'} (--param name=value)")
    names = set(settings.params).union(*(set(p) for p in settings.model_params))
    unknown = sorted(names - set(rule.params))
    if unknown:
        hint = "; per-model weights are given with --weights (recipes: models[i].parameters.weight)" \
            if unknown[0] == "weight" else ""
        raise ConfigError(f"--param {unknown[0]}: merge rule {rule.name!r} has no parameter {unknown[0]!r}; its "
                          f"parameters: {', '.join(rule.params) or 'none'}{hint}")
    if settings.model_params and len(settings.model_params) != n_models:
        raise ConfigError(f"per-model parameters: {len(settings.model_params)} entries for {n_models} models")
    if rule.requires == "mergekit":
        from .merge_mergekit import check_mergekit_settings

        check_mergekit_settings(rule, settings, n_models)
    return rule


def rule_weights(rule: MergeRule, weights: Sequence[float | str] | None, n: int, *, normalize: bool = True,
                 option: str = "--weights") -> list[float]:
    """The validated weights of an ``n``-model merge by ``rule``: an average's (scope ``all``) as
    :func:`~modeconn.path.interpolate.merge_weights` (normalised unless ``normalize=False``); task-vector weights
    (scope ``non_base``) as given, default 1 each (the rule's own ``normalize`` parameter decides, as in mergekit);
    none for a rule without weights (``[1.0] * n``, unused). ConfigError naming ``option`` and the entry."""
    from .interpolate import merge_weights

    if rule.weights == "all":
        return merge_weights(weights, n, normalize=normalize, option=option)
    if weights is None:
        return [1.0] * n
    return merge_weights(weights, n, normalize=False, option=option)


def _check_installed(rule: MergeRule) -> None:
    import importlib.util

    if importlib.util.find_spec(rule.requires) is None:
        raise ConfigError(f"--rule {rule.name}: needs the optional package {rule.requires!r}, which is not installed; "
                          f"pip install 'modeconn[{rule.requires}]'")


def linear(tensors: Sequence[torch.Tensor], weights: Sequence[float], key: str) -> torch.Tensor:
    """``Σ_i w_i t_i`` accumulated in fp32 (fp64/complex128 in their own precision), cast to ``tensors[0]``'s dtype
    (NonFiniteError naming ``key`` if the cast overflows)."""
    from .interpolate import checked_cast

    t = tensors[0]
    acc = torch.zeros(t.shape, dtype=torch.promote_types(t.dtype, torch.float32), device=t.device)
    for w, x in zip(weights, tensors, strict=True):
        acc.add_(x, alpha=w)  # promoted in the kernel: the same fp32 arithmetic, without a converted copy
    return checked_cast(acc, t.dtype, key)


register_rule(MergeRule("linear", "weighted average Σ wᵢθᵢ of the (aligned) models",
                        "model soups / weight averaging; equal to mergekit's linear merge", linear))

from . import merge_mergekit as _merge_mergekit  # noqa: E402,F401  (registers mergekit's rules)
