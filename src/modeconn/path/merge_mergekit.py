"""mergekit's merge rules, applied tensor by tensor to modeconn's (aligned) tensors.

Each entry of :data:`MERGEKIT_RULES` names a merge method of mergekit (Goddard et al., "Arcee's MergeKit: A Toolkit
for Merging Large Language Models", 2024; ``pip install 'modeconn[mergekit]'``). The rule calls mergekit's own
per-tensor entry point (``mergekit.merge_methods.api.merge_tensors``: the method's kernel, its parameter binding and
dtype promotion) on the tensors modeconn reads, aligns and streams, so a merge equals ``mergekit-yaml`` on the same
inputs and recipe, while streaming, alignment and atomic output stay modeconn's. Parameters: mergekit's names and
defaults (``density``, ``t``, ``lambda`` …; ``--param name=value``); the per-model ``weight`` comes from the merge's
weights. A conditional value ``[{"filter": "self_attn", "value": 0.3}, {"value": 0.5}]`` is resolved per tensor name
by mergekit's ``evaluate_setting`` (the first filter contained in the name), and a gradient (a list of values across
layers) at the tensor's layer position (:mod:`~modeconn.path.merge_layers`), as ``mergekit-yaml`` plans it; a
``weight`` given as a parameter setting overrides the merge's weights the same way.

Randomised rules (DARE, DELLA) draw from torch's global CPU generator, as mergekit does. With a seed, the generator
state each tensor starts from is the one ``mergekit-yaml --random-seed SEED`` gives it: seeded once, then the tensors
in the order mergekit executes them (sorted by name), the non-base models in input order
(:func:`plan_random_states` replays the draws on zero tensors of the same shapes). So a streamed merge, which
writes tensors in shard order, draws the same masks; the caller's global RNG state is left untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import ConfigError
from .merge_rules import MergeRule, ParamRange, RuleSettings, register_rule

MERGEKIT = "mergekit 0.1.5"

_BOOL, _UNIT = ParamRange("bool"), ParamRange(lo=0.0, hi=1.0)
PARAM_RANGES: dict[str, ParamRange] = {
    "int8_mask": _BOOL, "normalize": _BOOL, "rescale": _BOOL, "nuslerp_row_wise": _BOOL, "nuslerp_flatten": _BOOL,
    "normalize_weights": _BOOL, "filter_wise": _BOOL,
    "lambda": ParamRange(),  # a scale of the merged task vector: any finite factor float32 holds
    "density": _UNIT, "gamma": _UNIT, "t": _UNIT,
    "epsilon": ParamRange(lo=0.0, hi=0.5, hi_open=True),  # DELLA keeps density ± epsilon inside (0, 1)
    "eps": ParamRange(lo=0.0, hi=1.0, lo_open=True, hi_open=True),  # a stability constant added to norms
    "max_iter": ParamRange("int", lo=1, hi=10_000),
    "tol": ParamRange(lo=0.0, hi=1.0, hi_open=True),
    "scale": ParamRange(),  # passthrough's factor
}
"""The values each mergekit parameter accepts (fractions in [0, 1], flags, finite factors): checked before any work
(:func:`~modeconn.path.merge_rules.check_rule_settings`) for shared, per-model and filtered values alike."""

# name: (summary, base, weights, params, random, reference) — params as mergekit's spec lists them, without `weight`
_GTA = ("int8_mask", "normalize", "rescale", "lambda", "density")
MERGEKIT_RULES: dict[str, tuple[str, str, str, tuple[str, ...], bool, str]] = {
    "task_arithmetic": ("base + λ·Σ wᵢ(θᵢ − base) (task vectors)", "required", "non_base", _GTA, False,
                        "Ilharco et al. 2023, arXiv:2212.04089"),
    "ties": ("task vectors trimmed to the top `density` by magnitude, sign-elected, averaged", "required", "non_base",
             _GTA, False, "Yadav et al. 2023, arXiv:2306.01708"),
    "dare_ties": ("task vectors randomly dropped (keep `density`, rescaled), sign-elected (seeded)", "required",
                  "non_base", _GTA, True, "Yu et al. 2024, arXiv:2311.03099"),
    "dare_linear": ("task vectors randomly dropped (keep `density`, rescaled), summed (seeded)", "required",
                    "non_base", _GTA, True, "Yu et al. 2024, arXiv:2311.03099"),
    "breadcrumbs": ("task vectors without the smallest and the `gamma` largest entries", "required", "non_base",
                    (*_GTA, "gamma"), False, "Davari & Belilovsky 2024, arXiv:2312.06795"),
    "breadcrumbs_ties": ("breadcrumbs with TIES sign election", "required", "non_base", (*_GTA, "gamma"), False,
                         "Davari & Belilovsky 2024, arXiv:2312.06795"),
    "della": ("magnitude-ranked random drop of task vectors, sign-elected (seeded)", "required", "non_base",
              (*_GTA, "epsilon"), True, "Deep et al. 2024, arXiv:2406.11617"),
    "della_linear": ("magnitude-ranked random drop of task vectors, summed (seeded)", "required", "non_base",
                     (*_GTA, "epsilon"), True, "Deep et al. 2024, arXiv:2406.11617"),
    "slerp": ("spherical interpolation from the base to the other model at `t`", "required", "none", ("t",), False,
              "Shoemake 1985"),
    "nuslerp": ("weighted spherical interpolation (of task vectors with a base)", "optional", "non_base",
                ("nuslerp_row_wise", "nuslerp_flatten"), False, "mergekit"),
    "multislerp": ("weighted spherical interpolation of several models", "optional", "non_base",
                   ("normalize_weights", "eps"), False, "mergekit"),
    "model_stock": ("interpolation towards the base by the angle between task vectors (≥ 2 besides the base)",
                    "required", "none", ("filter_wise",), False, "Jang et al. 2024, arXiv:2403.19522"),
    "passthrough": ("the one input as it is (times `scale` where given): layer stacking with recipe slices", "none",
                    "none", ("scale",), False, "mergekit"),
    "karcher": ("Riemannian (Karcher) mean of the models on the sphere", "none", "none", ("max_iter", "tol"), False,
                "Karcher 1977"),
}
"""Rule name → (summary, base policy, weight scope, parameters, randomised, reference): the mergekit rules modeconn
registers (``--rule``)."""


def _method(name: str):
    from mergekit import merge_methods

    return merge_methods.get(name)


def _resolve(spec_param, setting: Any, key: str, settings: RuleSettings) -> Any:
    """A parameter's value for tensor ``key``: a scalar, a gradient or mergekit's ``[{filter, value}, …]``
    (mergekit's own ``evaluate_setting`` at the tensor's layer position ``settings.positions[key]``, see
    :mod:`~modeconn.path.merge_layers`; ``None`` when no filter matches)."""
    from mergekit.config import ConditionalParameter, evaluate_setting

    if isinstance(setting, list) and setting and all(isinstance(s, Mapping) for s in setting):
        setting = [ConditionalParameter(**s) for s in setting]
    return evaluate_setting(key, setting, settings.positions.get(key, 0.0), validate=spec_param.validate)


def _parameters(method, weights: Sequence[float], key: str, settings: RuleSettings, n: int) -> dict[str, Any]:
    """mergekit parameters for one tensor: shared ones resolved, per-input ones as ``{model index: value}``
    (precedence: the model's own parameters, then the shared ones, then the merge weights for ``weight``)."""
    out: dict[str, Any] = {}
    models = list(range(n))
    for p in method.spec.parameters:
        if p.scope.value == "shared":
            if p.name in settings.params:
                value = _resolve(p, settings.params[p.name], key, settings)
                if value is not None:
                    out[p.name] = value
            continue
        ids = [i for i in models if p.scope.value == "input" or i != settings.base]
        values = {i: _input_value(p, i, weights, key, settings) for i in ids}
        if any(v is not None for v in values.values()):
            out[p.name] = {i: (v if v is not None else p.default) for i, v in values.items()}
    return out


def _input_value(p, i: int, weights: Sequence[float], key: str, settings: RuleSettings) -> Any:
    own = settings.model_params[i] if settings.model_params else {}
    for source in (own, settings.params):
        if p.name in source:
            value = _resolve(p, source[p.name], key, settings)
            if value is not None:
                return value
    return float(weights[i]) if p.name == "weight" else None


def _call(name: str, tensors: Sequence[torch.Tensor], weights: Sequence[float], key: str,
          settings: RuleSettings) -> torch.Tensor:
    from mergekit.merge_methods.api import merge_tensors

    method = _method(name)
    params = _parameters(method, weights, key, settings, len(tensors))
    return merge_tensors(list(tensors), method, parameters=params, base_index=settings.base, name=key)


def _combine_for(name: str, random: bool):
    def combine(tensors: Sequence[torch.Tensor], weights: Sequence[float], key: str,
                settings: RuleSettings) -> torch.Tensor:
        if not random:
            with torch.no_grad():
                return _call(name, tensors, weights, key, settings)
        state = settings.states.get(key)
        if state is None:
            raise ConfigError(f"merge rule {name!r} is randomised: tensor {key!r} has no planned generator state "
                              "(give a seed; merge entry points plan the states with plan_random_states)")
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.set_rng_state(state)
            return _call(name, tensors, weights, key, settings)

    combine.__name__ = f"mergekit_{name}"
    return combine


def plan_random_states(rule: MergeRule, inputs: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float],
                       settings: RuleSettings, keys: Sequence[str], *,
                       dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The torch CPU generator state each of ``keys`` starts from under ``mergekit-yaml --random-seed
    settings.seed``: seeded once, the tensors in sorted-name order, each one's draws replayed by running the rule on
    zero tensors of the inputs' shapes and dtypes (meta tensors suffice; ``dtype``: the dtype the inputs are cast
    to before the rule). ``{}`` for a rule that draws nothing.
    Peak memory: one tensor per model. The caller's global RNG state is restored. ConfigError without a seed."""
    if not rule.random:
        return {}
    if settings.seed is None:
        raise ConfigError(f"merge rule {rule.name!r} is randomised: give a seed (--seed) so the result is reproducible")
    return replay_random_states(rule, settings.seed, [
        (key, key, [(sd[key].shape, dtype or sd[key].dtype) for sd in inputs], weights, settings) for key in keys])


Draw = tuple[str, str, Sequence[tuple[Sequence[int], torch.dtype]], Sequence[float], RuleSettings]
"""One output tensor's draws: its name, the name it is scheduled by (mergekit orders its merges by the largest name
of their input tensors), each input's shape and dtype, the weights and the settings it is merged with."""


def replay_random_states(rule: MergeRule, seed: int, draws: Sequence[Draw]) -> dict[str, torch.Tensor]:
    """:func:`plan_random_states` for tensors that differ in inputs and settings (a sliced merge): the generator
    seeded once with ``seed``, then each tensor of ``draws`` in the order of their scheduling names replayed on zero
    tensors."""
    states: dict[str, torch.Tensor] = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for key, _, shapes, weights, settings in sorted(draws, key=lambda d: d[1]):
            states[key] = torch.get_rng_state()
            _call(rule.name, [torch.zeros(tuple(s), dtype=d) for s, d in shapes], weights, key, settings)
    return states


def check_mergekit_settings(rule: MergeRule, settings: RuleSettings, n_models: int) -> None:
    """mergekit's own checks of the rule's inputs and parameters (input counts, a base where required, missing or
    ill-typed parameters), run on tiny zero tensors before any work; ConfigError quoting mergekit's message."""
    from pydantic import ValidationError

    if settings.base is None and rule.base == "required":
        raise ConfigError(f"--base: merge rule {rule.name!r} needs a base model (task vectors are taken against it)")
    _check_per_model(rule, settings)
    probe = probe_tensors(n_models)
    try:
        with torch.random.fork_rng(devices=[]):
            for key in _probe_keys(settings):
                _call(rule.name, probe, [1.0] * n_models, key, settings)
    except (ValueError, TypeError, RuntimeError, ValidationError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"--rule {rule.name} with {n_models} models, base {settings.base}, parameters "
                          f"{dict(settings.params)}: mergekit refuses: {msg}") from None


def _check_per_model(rule: MergeRule, settings: RuleSettings) -> None:
    """A per-model value mergekit would not apply is refused: a shared parameter (one value for every model), or a
    task-vector parameter given to the base model."""
    scopes = {p.name: p.scope.value for p in _method(rule.name).spec.parameters}
    for i, own in enumerate(settings.model_params):
        for name in own:
            if scopes.get(name) == "shared":
                raise ConfigError(f"models[{i}].parameters.{name}: merge rule {rule.name!r} takes one {name!r} for "
                                  "all models; give it in the recipe's shared parameters")
            if scopes.get(name) == "non_base" and i == settings.base:
                raise ConfigError(f"models[{i}].parameters.{name}: merge rule {rule.name!r} does not apply {name!r} "
                                  "to the base model (task vectors are taken against it); remove it")


def probe_tensors(n: int, size: int = 8) -> list[torch.Tensor]:
    """``n`` small tensors every rule accepts: pairwise distinct, neither zero nor parallel (zeros make multislerp's
    weighted mean zero, which it refuses for three or more models — not a property of the settings)."""
    size = max(size, n + 1)
    return [torch.linspace(-1.0, 1.0, size) + torch.nn.functional.one_hot(torch.tensor(i), size).float()
            for i in range(n)]


def _probe_keys(settings: RuleSettings) -> list[str]:
    """Tensor names that select every conditional entry of the parameters: each filter itself, and ``""`` (the
    default entries)."""
    keys = {""}
    for params in (settings.params, *settings.model_params):
        for setting in params.values():
            if isinstance(setting, list):
                keys.update(e["filter"] for e in setting if isinstance(e, Mapping) and isinstance(e.get("filter"), str))
    return sorted(keys)


def _register() -> None:
    for name, (summary, base, weights, params, random, ref) in MERGEKIT_RULES.items():
        register_rule(MergeRule(name, summary, f"{MERGEKIT} `{name}` ({ref})", _combine_for(name, random),
                                affine=False, base=base, weights=weights, params=params,
                                ranges={p: PARAM_RANGES[p] for p in params}, random=random, contextual=True,
                                requires="mergekit"))


_register()
