"""Linear interpolation and weighted averaging of state dicts.

``θ(λ) = (1−λ)·θ_A + λ·θ_B`` (λ=0 is A, λ=1 is B, bit-exactly). Floating tensors are combined in fp32
(fp64 for fp64 tensors) and cast back to their own dtype; integer and bool buffers (``num_batches_tracked``,
masks) are taken from the first model, never interpolated. Inputs are never mutated.

Merge weights (:func:`merge_weights`, the one validation used by every merge entry point: :func:`weighted_average`,
:func:`modeconn.merge`, the streaming merge and ``modeconn merge --weights``): one finite weight per model; by
default they must be non-negative and are normalised to sum 1 (an average); ``normalize=False`` accepts any finite
weights, negative ones included (task-arithmetic sums, extrapolation). Every floating tensor follows the same
rule ``Σ_i w_i θ_i``: a tensor identical in every model is ``(Σ_i w_i)·θ`` like any other (kept bit-exact when the
weights sum to 1, where that *is* its value).

Mixed floating dtypes (e.g. an fp16 A with a bf16 B) follow one rule: the result has the *first* model's
dtype at every λ (λ=1 included); a value that overflows that dtype (fp16's ±65504) raises
:class:`~modeconn.errors.NonFiniteError` naming the key instead of silently becoming ±Inf.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from collections.abc import Iterable, Mapping, Sequence

import torch

from ..checks import all_finite, check_compatible, check_one_device, is_interpolable
from ..errors import ConfigError, ModeconnError, NonFiniteError
from .._util.statedict import with_metadata
from ..io import check_dtype_kinds
from .merge_rules import MergeRule, RuleSettings, as_rule, tensor_weighted

StateDict = Mapping[str, torch.Tensor]


def interpolate(sd_a: StateDict, sd_b: StateDict, lam: float) -> dict[str, torch.Tensor]:
    """``θ(λ) = (1−λ)θ_A + λθ_B``; λ=0 returns A's tensors and λ=1 B's (exactly, as new dict; B's floats
    are cast to A's dtype if they differ); any finite λ (outside [0, 1]: extrapolation). Raises StateDictMismatchError
    (keys/shapes, all listed) or
    DeviceMismatchError before any arithmetic, ConfigError for a non-finite ``lam``."""
    lam = float(lam)
    if not math.isfinite(lam):
        raise ConfigError(f"lam must be a finite number, got {lam}")
    check_compatible([sd_a, sd_b], ["A", "B"])
    check_dtype_kinds([sd_a, sd_b], ["A", "B"])  # an integer B where A is floating would be reinterpreted
    check_one_device([sd_a, sd_b], ["A", "B"])
    if lam == 0:
        return with_metadata(dict(sd_a), sd_a)
    if lam == 1:
        return with_metadata({k: (_as_dtype(sd_b[k], a, k) if is_interpolable(a) else a) for k, a in sd_a.items()}, sd_a)
    return weighted_average([sd_a, sd_b], [1.0 - lam, lam], check=False, normalize=False)


def _as_dtype(t: torch.Tensor, like: torch.Tensor, key: str) -> torch.Tensor:
    """``t`` in ``like``'s dtype (the same object when it already is), NonFiniteError on fp16 overflow."""
    if t.dtype == like.dtype:
        return t
    return checked_cast(t, like.dtype, key)


def checked_cast(t: torch.Tensor, dtype: torch.dtype, key: str) -> torch.Tensor:
    """``t`` cast to ``dtype``; NonFiniteError naming ``key`` when the cast overflows a finite value (float16's
    ±65504, or a float64 / float32 value beyond the narrower dtype's range)."""
    if t.dtype == dtype:
        return t  # no cast, nothing can overflow (the scan below would find t's own NaN/Inf and raise nothing)
    out = t.to(dtype)
    if dtype.is_floating_point and torch.finfo(dtype).max < torch.finfo(t.dtype).max and not all_finite(out) \
            and all_finite(t):
        raise overflow_error(dtype, key)
    return out


def overflow_error(dtype: torch.dtype, key: str) -> NonFiniteError:
    """The error of a cast of finite values of tensor ``key`` to ``dtype`` that overflowed."""
    if dtype == torch.float16:
        return NonFiniteError(
            f"{key!r}: the result overflows float16 (the first model's dtype, max 65504); convert the models to "
            "one wider dtype (e.g. float32) before interpolating/merging"
        )
    return NonFiniteError(f"{key!r}: the result overflows {str(dtype).removeprefix('torch.')} (max "
                          f"{torch.finfo(dtype).max:.4g}); the merge's weights or parameters scale it beyond the "
                          "output dtype")


def merge_weights(weights: Sequence[float] | None, n: int, *, normalize: bool = True,
                  option: str = "weights") -> list[float]:
    """The validated weights of an ``n``-model merge (``None``: uniform ``1/n``).

    Each entry must be a finite number and there must be exactly one per model. With ``normalize`` (the default)
    each must also be ≥ 0, with a positive sum, and they are returned divided by their sum (so ``[0.7, 0.7]``
    gives ``[0.5, 0.5]``, an average, not a 1.4× scaled model); with ``normalize=False`` any finite weights are
    returned as given (``Σ w_i θ_i`` as a sum: task arithmetic, extrapolation such as ``[2, -1]``). The weights used
    must keep ``Σ |w_i|`` within float32's range (the accumulation dtype): larger ones overflow every nonzero tensor.
    Raises: ConfigError naming ``option``, the offending entry (index, model and value) or the count.
    """
    if weights is None:
        return [1.0 / n] * n
    weights = list(weights)
    if len(weights) != n:
        raise ConfigError(f"{option} has {len(weights)} entries for {n} models: give exactly one weight per model")
    values = [_weight(w, i, option, normalize) for i, w in enumerate(weights)]
    if normalize:
        top = max(values)
        total = _fsum(values, top)
        if total <= 0:
            raise ConfigError(f"{option} {values} sum to 0: normalised weights need a positive sum")
        values = [w / total for w in values] if math.isfinite(total) else [(w / top) / (total / top) for w in values]
    _check_scale(values, option)
    return values


def _fsum(values: list[float], top: float) -> float:
    """``Σ values``, as ``inf`` when it overflows float64 (then the caller divides by ``top`` first)."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf if top > 0 else -math.inf


def _check_scale(values: list[float], option: str) -> None:
    """ConfigError naming the largest entry when the finite weights' magnitudes sum beyond float32 (entries that are
    not finite are :func:`_weight`'s to name)."""
    from .merge_rules import FLOAT32_MAX

    finite = [abs(w) if math.isfinite(w) else 0.0 for w in values]
    scale = math.fsum(finite) if max(finite) <= FLOAT32_MAX else math.inf
    if scale > FLOAT32_MAX:
        i = max(range(len(values)), key=finite.__getitem__)
        raise ConfigError(f"{option}[{i}] (model {i}) is {values[i]:g}: the weights' magnitudes sum to more than "
                          f"float32 holds ({FLOAT32_MAX:.4g}), so the weighted sum overflows every nonzero tensor")


def _weight(w, i: int, option: str, normalize: bool) -> float:
    """Entry ``i`` of ``option`` as a float; ConfigError naming it when it is no finite number (or negative while
    normalising)."""
    try:
        value = float(w)
    except (TypeError, ValueError):
        raise ConfigError(f"{option}[{i}] (model {i}) is {w!r}, not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{option}[{i}] (model {i}) is {value}: every weight must be finite")
    if normalize and value < 0:
        raise ConfigError(
            f"{option}[{i}] (model {i}) is {value} < 0: normalised merges average with non-negative weights; pass "
            "normalize=False (CLI: --no-normalize) to use the weights as given (task-arithmetic sums, extrapolation)"
        )
    return value


def weights_sum_to_one(weights: Sequence[float]) -> bool:
    """Whether ``Σ w_i`` is 1 up to float64 rounding (an affine combination)."""
    return math.isclose(math.fsum(weights), 1.0, rel_tol=0.0, abs_tol=1e-12)


def weighted_average(
    state_dicts: Sequence[StateDict], weights: Sequence[float] | None = None, *, check: bool = True,
    normalize: bool = True, keep: Iterable[str] = (), rule: str | MergeRule = "linear",
    settings: RuleSettings | None = None,
    dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None, planned: bool = False,
) -> dict[str, torch.Tensor]:
    """``Σ_i w_i θ_i`` per floating tensor (fp32 accumulation, fp64 for fp64 tensors, cast to the first
    model's dtype); integer buffers and the keys in ``keep`` (shared fixed structure, e.g. W-asymmetric masks)
    are taken from the first model. Every other floating tensor follows the same rule, one identical in every
    model included (it becomes ``(Σ w_i)·θ``; when the weights sum to 1 that is ``θ`` and it is returned exactly).

    Args:
        state_dicts: one or more state dicts with the same keys and shapes; never mutated.
        weights: see :func:`merge_weights` (default uniform); ``normalize`` as there.
        check: compare keys/shapes/devices and check the weights first; ``check=False``: the caller did (the weights
            are then used as given).
        rule: the merge rule combining each floating tensor (a name of :data:`~modeconn.path.merge_rules.MERGE_RULES`
            or its entry; default ``linear``, the weighted average).
        planned: ``settings`` were planned (:func:`plan_settings`) for a model of which ``state_dicts`` hold a part
            (a streamed merge, tensor by tensor): filters are not checked against this part alone.
        keep: keys copied from the first model unchanged (``modeconn.merge`` passes the W-asymmetric fixed
            structure of its ``model``; without it, weights that do not sum to 1 scale those buffers too).
        settings: base model, parameters and seed of a rule that takes them
            (:class:`~modeconn.path.merge_rules.RuleSettings`; checked by
            :func:`~modeconn.path.merge_rules.check_rule_settings`). A randomised rule's generator states are planned
            here unless ``settings.states`` has them.
        dtype: floating inputs are cast to it before the rule (mergekit's recipe ``dtype``); ``out_dtype``: the
            merged floating tensors' dtype (default: the first model's).
    Raises: ConfigError (bad weights, see :func:`merge_weights`; bad rule settings; a parameter filter that selects
        no tensor, :func:`~modeconn.path.merge_rules.check_filters`), StateDictMismatchError / DeviceMismatchError,
        NonFiniteError naming the rule and tensor when the rule makes NaN/Inf from finite inputs or the result
        overflows its dtype (:func:`merge_tensor`).
    """
    if not state_dicts:
        raise ConfigError("need at least one state dict to average")
    merge_rule = as_rule(rule)
    if check or weights is None:
        weights = merge_weights(weights, len(state_dicts), normalize=normalize)
    if check:
        check_compatible(state_dicts)
        check_one_device(state_dicts)
    check_dtype_kinds(state_dicts)  # always (cheap): averaging int32 bytes read over float32 weights is never right
    keep = set(keep)
    first = state_dicts[0]
    merged_keys = [k for k, t in first.items() if is_interpolable(t) and k not in keep]
    if not planned:
        settings = plan_settings(merge_rule, state_dicts, weights, settings, merged_keys, dtype=dtype)
    exact_if_equal = merge_rule.affine and weights_sum_to_one(weights) and dtype is None \
        and not tensor_weighted(settings)
    out = {}
    for k, t in first.items():
        if not is_interpolable(t) or k in keep:
            out[k] = t  # integer buffers and shared fixed structure: the first model's, never averaged
        elif exact_if_equal and all(torch.equal(t, sd[k]) for sd in state_dicts[1:]):
            out[k] = t if out_dtype is None else checked_cast(t, out_dtype, k)  # Σ w_i·θ = θ exactly when Σ w_i = 1
        else:
            out[k] = merge_tensor(merge_rule, [sd[k] for sd in state_dicts], weights, k, settings,
                                  dtype=dtype, out_dtype=out_dtype)
    return with_metadata(out, first)


def plan_settings(rule: MergeRule, inputs: Sequence[StateDict], weights: Sequence[float],
                  settings: RuleSettings | None, keys: Sequence[str], *, dtype: torch.dtype | None = None) -> RuleSettings:
    """``settings`` (default: none) with the layer positions of ``keys`` where a parameter is a gradient
    (:func:`~modeconn.path.merge_layers.with_layer_positions`) and the generator states of a randomised rule planned
    for ``keys``
    (:func:`~modeconn.path.merge_mergekit.plan_random_states`; ``inputs`` may hold meta tensors; ``dtype``: the
    dtype the inputs are cast to before the rule)."""
    from .merge_layers import with_layer_positions
    from .merge_rules import check_filters

    settings = settings if settings is not None else RuleSettings()
    check_filters(settings, keys)
    settings = with_layer_positions(settings, keys)  # where a gradient is evaluated
    if not rule.random or settings.states:
        return settings
    from .merge_mergekit import plan_random_states

    return replace(settings, states=plan_random_states(rule, inputs, weights, settings, keys, dtype=dtype))


def merge_tensor(rule: MergeRule, tensors: Sequence[torch.Tensor], weights: Sequence[float], key: str,
                 settings: RuleSettings | None = None, *, dtype: torch.dtype | None = None,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """One merged floating tensor: inputs cast to ``dtype`` (if given; else, for inputs of different dtypes, to their
    promoted dtype, e.g. fp16 + bf16 → fp32, as mergekit does), combined by ``rule``, the result cast once to
    ``out_dtype`` (default: the first input's dtype; NonFiniteError naming ``key`` on an overflow of it).

    The result is checked: NaN/Inf from finite inputs (an overflow of the rule's arithmetic, or parameters it cannot
    use on this tensor) is a NonFiniteError naming ``key`` and the rule; an error the rule's own library raises for
    this tensor is a ConfigError naming both. Non-finite inputs are returned as the rule made them, for the caller to
    name the input."""
    target = out_dtype if out_dtype is not None else tensors[0].dtype
    if dtype is None and any(x.dtype != tensors[0].dtype for x in tensors):
        dtype = functools.reduce(torch.promote_types, (x.dtype for x in tensors))
    if dtype is not None:
        tensors = [x.to(dtype) for x in tensors]
    try:
        out = rule.apply(tensors, weights, key, settings)
    except (ValueError, TypeError) as err:
        if isinstance(err, ModeconnError):
            raise
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"merge rule {rule.name!r} failed on tensor {key!r}: {msg}") from None
    if out.is_floating_point() and not all_finite(out) and all(all_finite(x) for x in tensors):
        raise NonFiniteError(f"merge rule {rule.name!r} made NaN/Inf in tensor {key!r} from finite inputs (its "
                             f"weights {list(weights)} or parameters overflow; nothing is written)")
    try:
        return checked_cast(out, target, key)
    except NonFiniteError as err:
        raise NonFiniteError(f"merge rule {rule.name!r}: {err}") from None
