"""The registry of merge rules: how the (aligned) endpoints' tensors combine into the merged tensor.

Each :class:`MergeRule` has a name, a one-line summary, its source (modeconn's own, or the library it comes from)
and ``combine(tensors, weights, key) -> tensor``, applied to every floating tensor by
:func:`~modeconn.path.interpolate.weighted_average` — in memory (:func:`modeconn.merge`) and tensor by tensor when
streaming (:func:`modeconn.stream_merge`). Integer buffers and shared fixed structure are never combined. Adding a
rule is one entry here (``modeconn merge --rule`` lists the registered rules).

Rules taking more than weights — a base model (task arithmetic, TIES, DARE, SLERP …), parameters (``density``,
``t`` …), a seed — declare them (``base``, ``params``, ``random``) and receive a :class:`RuleSettings` as a fourth
argument (``contextual=True``). Every parameter declares the values it accepts (``ranges``: a :class:`ParamRange`
per name), and :func:`check_rule_settings` checks every value given — shared, per model, each filter's — against
it before any work; :func:`check_filters` refuses a conditional value whose filter selects no tensor. Every rule's
output is checked per tensor (:func:`~modeconn.path.interpolate.merge_tensor`: NaN/Inf from finite inputs is an
error naming the rule and tensor). The rules of mergekit (``pip install 'modeconn[mergekit]'``) are registered from
:mod:`modeconn.path.merge_mergekit`: their per-tensor functions are called on our tensors, so alignment, streaming
and atomic output stay modeconn's.
"""

from __future__ import annotations

import math
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


FLOAT32_MAX = float(torch.finfo(torch.float32).max)
"""The largest float32: rules compute in float32 (or wider), so a factor beyond it overflows any tensor."""


@dataclass(frozen=True)
class ParamRange:
    """The values a rule parameter accepts: ``kind`` ``"bool"``, ``"int"`` or ``"float"``; a number must be finite
    and lie in ``[lo, hi]`` (``lo_open`` / ``hi_open``: that end excluded). The default range of a float is every
    finite value float32 holds. Numbers written as strings (YAML reads ``1e-3`` as one) are read as numbers, as
    mergekit reads them."""

    kind: str = "float"
    lo: float = -FLOAT32_MAX
    hi: float = FLOAT32_MAX
    lo_open: bool = False
    hi_open: bool = False

    def check(self, value: Any, where: str) -> None:
        """ConfigError naming ``where`` (rule and parameter) and the accepted values when ``value`` is not one."""
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(f"{where} is {value!r}: {self.describe()}")
            return
        x = _number(value)
        inside = x is not None and math.isfinite(x) and (x > self.lo if self.lo_open else x >= self.lo) \
            and (x < self.hi if self.hi_open else x <= self.hi) and (self.kind != "int" or x.is_integer())
        if not inside:
            raise ConfigError(f"{where} is {value!r}: {self.describe()}")

    def describe(self) -> str:
        if self.kind == "bool":
            return "must be true or false"
        what = "an integer" if self.kind == "int" else "a finite number"
        if (self.lo, self.hi) == (-FLOAT32_MAX, FLOAT32_MAX):
            return f"must be {what} of magnitude at most {FLOAT32_MAX:.4g} (float32)"
        return f"must be {what} in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


def _number(value: Any) -> float | None:
    """``value`` as a float (numbers, and strings that spell one), else None (booleans are not numbers)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class RuleSettings:
    """What a run passes to a contextual rule besides the tensors and weights.

    ``base``: index of the base model among the inputs (``None``: no base). ``params``: shared parameters (name →
    a value, or mergekit's conditional form ``[{"filter": substring, "value": v}, …]`` resolved per tensor name).
    ``model_params``: per model, parameters overriding ``params`` for that model (recipes). ``seed``: the seed of a
    randomised rule (DARE). ``states``: per tensor key, the torch CPU generator state a randomised rule starts from
    (filled by :func:`~modeconn.path.merge_mergekit.plan_random_states`). ``positions``: per tensor key, its position
    ``t`` in the layer stack (:mod:`~modeconn.path.merge_layers`; where a gradient is evaluated; a key not listed sits
    at 0). ``normalize``: per-tensor weights (a ``weight`` setting, see :func:`setting_weights`) of a rule that
    averages are divided by their sum."""

    base: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    model_params: Sequence[Mapping[str, Any]] = ()
    seed: int | None = None
    states: Mapping[str, torch.Tensor] = field(default_factory=dict)
    positions: Mapping[str, float] = field(default_factory=dict)
    normalize: bool = True


@dataclass(frozen=True)
class MergeRule:
    """``name`` (``--rule``), ``summary``, ``source`` (citation / library), ``combine(tensors, weights, key)`` returning
    the merged tensor in ``tensors[0]``'s dtype, and ``affine``: the rule returns ``θ`` exactly when every input is
    ``θ`` and the weights sum to 1 (so such tensors are passed through without rounding).

    ``base``: ``"none"``, ``"optional"`` or ``"required"`` (a base model: task vectors are taken against it);
    ``weights``: one of :data:`WEIGHT_SCOPES`; ``params``: the names of the rule's parameters (``--param``);
    ``ranges``: each parameter's accepted values (:class:`ParamRange`; every parameter has one);
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
    ranges: Mapping[str, ParamRange] = field(default_factory=dict)
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
    """Add ``rule`` to :data:`MERGE_RULES` (ConfigError for a duplicate name or a parameter without a range);
    returns it."""
    unranged = [p for p in rule.params if p not in rule.ranges]
    if unranged:
        raise ConfigError(f"merge rule {rule.name!r}: parameter {unranged[0]!r} has no range (ranges=...)")
    return MERGE_RULES.register(rule.name)(rule)


def as_rule(rule: MergeRule | str) -> MergeRule:
    """``rule`` as its registry entry: a :class:`MergeRule` as is (resolved once by the caller), a name looked up
    (ConfigError listing the rules for a typo)."""
    return MERGE_RULES.get(rule) if isinstance(rule, str) else rule


def check_rule_settings(rule: MergeRule | str, settings: RuleSettings | None, n_models: int, *,
                        weights_given: bool = False) -> MergeRule:
    """Check, before any work, that ``settings`` fit ``rule`` for ``n_models`` inputs; returns the rule.

    Raises ConfigError naming the option: an unknown rule or parameter (``--param``), a value outside the
    parameter's range (:attr:`MergeRule.ranges`; the rule, parameter and filter named), a base index out of range or a
    base given to a rule without one (``--base``), ``--weights`` for a rule that takes none, a missing optional
    package (``pip install 'modeconn[mergekit]'``), or what the rule's own library says about the parameters."""
    rule = as_rule(rule)
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
    unknown = sorted(names - set(rule.params) - ({"weight"} if rule.weights != "none" else set()))
    if unknown:
        hint = "; per-model weights are given with --weights (recipes: models[i].parameters.weight)" \
            if unknown[0] == "weight" else ""
        raise ConfigError(f"--param {unknown[0]}: merge rule {rule.name!r} has no parameter {unknown[0]!r}; its "
                          f"parameters: {', '.join(rule.params) or 'none'}{hint}")
    if settings.model_params and len(settings.model_params) != n_models:
        raise ConfigError(f"per-model parameters: {len(settings.model_params)} entries for {n_models} models")
    _check_ranges(rule, settings)
    if rule.requires == "mergekit":
        from .merge_mergekit import check_mergekit_settings

        check_mergekit_settings(rule, settings, n_models)
    return rule


def _check_ranges(rule: MergeRule, settings: RuleSettings) -> None:
    """Every value of every parameter (shared, per model, each conditional entry's) against the rule's range."""
    sources = [("", settings.params)] + [(f"models[{i}] ", p) for i, p in enumerate(settings.model_params)]
    for prefix, params in sources:
        for name, setting in params.items():
            for label, value in _values(setting):
                rule.ranges.get(name, WEIGHT_RANGE).check(value, f"merge rule {rule.name!r}: {prefix}parameter "
                                                                 f"{name!r}{label}")


WEIGHT_RANGE = ParamRange()
"""A ``weight`` given as a parameter setting (a gradient or a conditional value): any finite number."""


def _values(setting: Any) -> list[tuple[str, Any]]:
    """``(label, value)`` for a scalar (label ``""``), each anchor of a gradient, or each entry of mergekit's
    ``[{filter, value}, …]`` form (each anchor of an entry's gradient)."""
    if _conditional(setting):
        return [(f" (filter {e.get('filter')!r}){at}" if e.get("filter") is not None else f" (default entry){at}",
                 v) for e in setting for at, v in _values(e.get("value"))]
    if isinstance(setting, list):
        return [(f" (gradient value {j})", v) for j, v in enumerate(setting)]
    return [("", setting)]


def _conditional(setting: Any) -> bool:
    return isinstance(setting, list) and bool(setting) and all(isinstance(e, Mapping) for e in setting)


def check_filters(settings: RuleSettings | None, keys: Sequence[str]) -> None:
    """ConfigError naming the parameter and filter when an entry of a conditional parameter (``[{filter, value},
    …]``, the first entry whose filter is contained in the tensor name applies, as in mergekit) applies to none of
    ``keys``: a filter that matches no tensor (a typo such as ``mlpp``) or only tensors an earlier entry takes. A
    default entry (no filter, or ``*``) that nothing reaches is allowed."""
    if settings is None:
        return
    sources = [("parameters", settings.params)] + [(f"models[{i}].parameters", p)
                                                   for i, p in enumerate(settings.model_params)]
    for where, params in sources:
        for name, setting in params.items():
            if _conditional(setting):
                _check_entries(setting, keys, f"{where}.{name}")


def _check_entries(entries: Sequence[Mapping[str, Any]], keys: Sequence[str], where: str) -> None:
    used = [False] * len(entries)
    for key in keys:
        for j, e in enumerate(entries):
            f = e.get("filter")
            if f is None or f == "*" or (key and f in key):
                used[j] = True
                break
    for j, e in enumerate(entries):
        f = e.get("filter")
        if not used[j] and f is not None and f != "*":
            shadow = any(f in k for k in keys)
            raise ConfigError(f"{where}: filter {f!r} " + ("selects no tensor: every tensor it matches is taken by an "
                              "earlier entry" if shadow else f"matches no tensor name of the {len(keys)} merged "
                              "(a filter is a substring of the tensor name, e.g. 'mlp' or 'self_attn')"))


def tensor_weighted(settings: RuleSettings | None) -> bool:
    """The weights are parameter settings (``weight`` in the shared or per-model parameters: a gradient or a
    conditional value), resolved per tensor by :func:`setting_weights`."""
    return settings is not None and any("weight" in p for p in (settings.params, *settings.model_params))


def setting_weights(settings: RuleSettings, key: str, n: int) -> list[float]:
    """Per model, the ``weight`` of tensor ``key`` where the weights are parameter settings
    (:func:`tensor_weighted`): the model's own, else the shared one, else 1, evaluated at the tensor's layer position
    (:func:`~modeconn.path.merge_layers.setting_at`)."""
    from .merge_layers import setting_at

    t = settings.positions.get(key, 0.0)
    values = []
    for own in settings.model_params or [{}] * n:
        value = next((v for src in (own, settings.params) if "weight" in src
                      and (v := setting_at(src["weight"], key, t)) is not None), None)
        values.append(1.0 if value is None else float(value))
    return values


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


def applied_weights(rule: MergeRule, weights: Sequence[float], base: int | None) -> list[float | None] | None:
    """The weights ``rule`` applies, for records: ``None`` for a rule that takes none; the base's entry ``None`` for
    task-vector weights (scope ``non_base``: the base is not weighted)."""
    if rule.weights == "none":
        return None
    return [None if rule.weights == "non_base" and i == base else float(w) for i, w in enumerate(weights)]


def _check_installed(rule: MergeRule) -> None:
    import importlib.util

    if importlib.util.find_spec(rule.requires) is None:
        raise ConfigError(f"--rule {rule.name}: needs the optional package {rule.requires!r}, which is not installed; "
                          f"pip install 'modeconn[{rule.requires}]'")


def linear(tensors: Sequence[torch.Tensor], weights: Sequence[float], key: str,
           settings: RuleSettings | None = None) -> torch.Tensor:
    """``Σ_i w_i t_i`` accumulated in fp32 (fp64/complex128 in their own precision), cast to ``tensors[0]``'s dtype
    (NonFiniteError naming ``key`` if the cast overflows). Weights given as parameter settings
    (:func:`tensor_weighted`) are resolved for ``key`` (:func:`setting_weights`) and, with ``settings.normalize``,
    the sum is divided by theirs in the accumulation dtype (mergekit's arithmetic)."""
    from ..checks import all_finite
    from .interpolate import checked_cast, overflow_error

    t = tensors[0]
    dtype = torch.promote_types(t.dtype, torch.float32)
    total = None
    if tensor_weighted(settings):
        weights = setting_weights(settings, key, len(tensors))
        if settings.normalize:
            total = torch.tensor(weights, dtype=dtype, device=t.device).sum()
    if dtype == t.dtype or t.numel() <= LINEAR_BLOCK or not all(x.is_contiguous() for x in tensors):
        return checked_cast(_weighted_sum(tensors, weights, total, dtype), t.dtype, key)
    # a wide accumulator per block of elements, not per tensor: the same elementwise arithmetic (bit for bit), at
    # LINEAR_BLOCK fp32 elements of scratch instead of a tensor-sized fp32 copy (a 7B model's embedding: 0.5 GB)
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    flats, flat_out, finite = [x.view(-1) for x in tensors], out.view(-1), True
    for start in range(0, t.numel(), LINEAR_BLOCK):
        acc = _weighted_sum([x[start:start + LINEAR_BLOCK] for x in flats], weights, total, dtype)
        finite = finite and all_finite(acc)
        flat_out[start:start + LINEAR_BLOCK] = acc
    if finite and not all_finite(out):  # as checked_cast on the whole sum: an overflow of finite values
        raise overflow_error(t.dtype, key)
    return out


LINEAR_BLOCK = 1 << 22
"""Elements :func:`linear` accumulates at a time in its wider dtype (16 MiB of fp32 scratch)."""


def _weighted_sum(tensors: Sequence[torch.Tensor], weights: Sequence[float], total: torch.Tensor | None,
                  dtype: torch.dtype) -> torch.Tensor:
    """``Σ_i w_i t_i`` (divided by ``total`` when given) accumulated in ``dtype``."""
    acc = torch.zeros(tensors[0].shape, dtype=dtype, device=tensors[0].device)
    for w, x in zip(weights, tensors, strict=True):
        acc.add_(x, alpha=w)  # promoted in the kernel: the same fp32 arithmetic, without a converted copy
    if total is not None:
        acc.div_(total)
    return acc


register_rule(MergeRule("linear", "weighted average Σ wᵢθᵢ of the (aligned) models",
                        "model soups / weight averaging; equal to mergekit's linear merge", linear, contextual=True))

from . import merge_mergekit as _merge_mergekit  # noqa: E402,F401  (registers mergekit's rules)
