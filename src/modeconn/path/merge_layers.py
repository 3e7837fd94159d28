"""Where a tensor sits in a decoder's layer stack, and the value a layer-dependent merge parameter takes there.

A parameter *gradient* (mergekit's recipes: ``t: [0, 0.5, 1]``) is a list of anchor values spread evenly over the
layers of a stack; a tensor of layer ``i`` of ``n`` sits at position ``t = i / (n − 1)`` (``1`` for a one-layer
stack) and takes the piecewise-linear interpolation of the anchors there; a list whose values are not all numbers
(flags, names) is read by index, ``values[int(t · (len − 1))]``. Tensors outside the stack (embeddings, the final
norm, the LM head) sit at ``t = 0``. This is how ``mergekit-yaml`` 0.1.5 plans a merge (its ``MergePlanner``: the
position restarts in every output slice; pre- and post-layer weights are planned at ``t = 0``). A conditional value
``[{filter, value}, …]`` takes the first entry whose filter is a substring of the tensor name (no filter or ``*``:
every tensor), and that entry's value may itself be a gradient.

Output *slices* (mergekit's ``slices:``) stack layer ranges of the models (:func:`stack_plan`): the layers are
renumbered consecutively and each tensor's parameters are resolved from its slice (:func:`tensor_settings`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
"""A tensor of the layer stack: ``…layers.N.…`` (the decoder families' naming: ``model.layers.3.mlp.up_proj``)."""


def layer_index(key: str) -> int | None:
    """The layer ``key`` belongs to (``None`` outside the layer stack)."""
    m = LAYER.search(key)
    return None if m is None else int(m.group(1))


def position(index: int, n_layers: int) -> float:
    """mergekit's ``t`` of layer ``index`` among ``n_layers`` consecutive layers: ``index / (n − 1)``, ``1`` for one."""
    return index / (n_layers - 1) if n_layers > 1 else 1.0


def layer_positions(keys: Iterable[str]) -> dict[str, float]:
    """``t`` of every key of a whole model merged layer by layer (mergekit's ``models:`` form: one slice of all the
    layers): layer ``i`` of the ``n`` found at :func:`position`, everything else at 0."""
    keys = list(keys)
    layers = [layer_index(k) for k in keys]
    n = 1 + max((i for i in layers if i is not None), default=-1)
    return {k: (0.0 if i is None else position(i, n)) for k, i in zip(keys, layers, strict=True)}


def is_gradient(setting: Any) -> bool:
    """A list of scalars (anchors spread over the layers)."""
    return isinstance(setting, list) and bool(setting) and not any(isinstance(v, (Mapping, list)) for v in setting)


def varies_by_layer(setting: Any) -> bool:
    """``setting`` is a gradient, or a conditional value with a gradient entry."""
    if is_gradient(setting):
        return True
    return isinstance(setting, list) and any(isinstance(e, Mapping) and is_gradient(e.get("value")) for e in setting)


def varying_parameters(params: Mapping[str, Any], model_params: Iterable[Mapping[str, Any]] = ()) -> list[str]:
    """The parameters (``parameters.NAME``, ``models[i].parameters.NAME``) whose value varies by layer."""
    sources = [("parameters", params), *((f"models[{i}].parameters", p) for i, p in enumerate(model_params))]
    return [f"{where}.{name}" for where, ps in sources for name, value in ps.items() if varies_by_layer(value)]


def refuse_gradients(params: Mapping[str, Any], model_params: Iterable[Mapping[str, Any]], path: str) -> None:
    """ConfigError naming the first parameter that varies by layer: ``path`` (a merge done in memory) places no
    tensor in a layer stack."""
    varying = varying_parameters(params, model_params)
    if varying:
        raise ConfigError(f"{varying[0]}: a gradient (a list of values across layers) applies to Hugging Face "
                          f"checkpoints merged without data (--align weight or none); {path} does not place "
                          "tensors in layers")


def with_layer_positions(settings, keys: Sequence[str]):
    """``settings`` (a :class:`~modeconn.path.merge_rules.RuleSettings`) with every key's layer position
    (:func:`layer_positions`) where a parameter varies by layer and none are set; ConfigError naming the parameter
    when no key lies in a layer stack."""
    from dataclasses import replace

    varying = varying_parameters(settings.params, settings.model_params)
    if not varying or settings.positions:
        return settings
    check_layers_found(keys, varying[0])
    return replace(settings, positions=layer_positions(keys))


def setting_at(setting: Any, key: str, t: float) -> Any:
    """The value of a parameter setting for tensor ``key`` at layer position ``t`` (see the module docstring):
    a scalar as is; a gradient interpolated (numbers) or indexed (other values); a conditional value by its first
    matching entry (``None`` when none matches)."""
    if is_gradient(setting):
        return _interpolated(setting, t)
    if isinstance(setting, list):
        for entry in setting:
            f = entry.get("filter")
            if f is None or f == "*" or (key and f in key):
                return setting_at(entry.get("value"), key, t)
        return None
    return setting


def _interpolated(values: list[Any], t: float) -> Any:
    numbers = [_number(v) for v in values]
    if any(x is None for x in numbers):
        return values[int(t * (len(values) - 1))]
    scaled = t * (len(values) - 1)
    lo = int(scaled)
    hi = min(len(values) - 1, lo + 1)
    frac = scaled - lo
    return (1 - frac) * numbers[lo] + frac * numbers[hi]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value) if isinstance(value, str) else None
    except ValueError:
        return None


def check_layers_found(keys: Iterable[str], where: str) -> None:
    """ConfigError naming ``where`` (the parameter with a gradient) when no tensor of ``keys`` lies in a layer stack
    (:data:`LAYER`): the gradient could not be placed."""
    if not any(layer_index(k) is not None for k in keys):
        raise ConfigError(f"{where}: a gradient (a list of values across layers) needs a layer stack, and no tensor "
                          "name has the form '…layers.N.…'")


# ------------------------------------------------------------------------------------------------ slices
@dataclass(frozen=True)
class SliceSource:
    """One source of an output slice: layers ``layers[0] … layers[1] − 1`` of model ``model`` (an index among the
    merge's models), with its own parameter settings."""

    model: int
    layers: tuple[int, int]
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OutputSlice:
    """An output slice (mergekit's ``slices[i]``): its ``sources`` (each as many layers), its parameter settings
    and its ``base`` (model index, or None)."""

    sources: tuple[SliceSource, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    base: int | None = None

    @property
    def depth(self) -> int:
        lo, hi = self.sources[0].layers
        return hi - lo


@dataclass(frozen=True)
class PlannedTensor:
    """One output tensor of a sliced merge: its name ``key``, the output slice whose sources and parameters apply
    (``slice``), the ``(model index, input name)`` of each source, and its layer position ``t``."""

    key: str
    slice: int
    inputs: tuple[tuple[int, str], ...]
    t: float


def renumbered(key: str, index: int) -> str:
    """Layer tensor ``key`` with its layer number replaced by ``index``."""
    m = LAYER.search(key)
    return key[:m.start(1)] + str(index) + key[m.end(1):]


def stack_plan(slices: Sequence[OutputSlice], names: Sequence[str]) -> list[PlannedTensor]:
    """Every output tensor of a merge by ``slices`` of models whose tensors are ``names`` (one model's, in module
    order: the tensors before the layer stack, layers, the ones after), as ``mergekit-yaml`` plans it: the tensors
    before the stack from the first slice's sources, at ``t = 0``; each slice's layers renumbered consecutively, the
    ``j``-th of a slice of ``d`` layers at :func:`position` ``(j, d)``, made from layer ``lo + j`` of each source; the
    tensors after the stack from the last slice's sources (as many as the first slice has), at ``t = 0``."""
    layered = [layer_index(k) is not None for k in names]
    first = layered.index(True) if any(layered) else len(names)
    pre = [k for k, inside in zip(names[:first], layered[:first], strict=True) if not inside]
    post = [k for k, inside in zip(names[first:], layered[first:], strict=True) if not inside]
    templates = [k for k in names if layer_index(k) == 0]
    head, tail = slices[0], slices[-1]
    out = [PlannedTensor(k, 0, tuple((s.model, k) for s in head.sources), 0.0) for k in pre]
    layer = 0
    for i, sl in enumerate(slices):
        for j in range(sl.depth):
            t = position(j, sl.depth)
            out += [PlannedTensor(renumbered(k, layer), i, tuple((s.model, renumbered(k, s.layers[0] + j))
                                                                   for s in sl.sources), t) for k in templates]
            layer += 1
    last = len(slices) - 1
    out += [PlannedTensor(k, last, tuple((s.model, k) for s in tail.sources[:len(head.sources)]), 0.0) for k in post]
    return out


def tensor_settings(p: PlannedTensor, sl: OutputSlice, shared: Mapping[str, Any]) -> tuple[dict, list[dict]]:
    """The parameter values of planned tensor ``p`` (no filter or gradient left), in mergekit's precedence: shared
    ones from the slice's settings, then the recipe's (``shared``), evaluated at the output name; per source, its
    own, then the slice's, then the recipe's, evaluated at the source's input name."""
    names = {*shared, *sl.params, *(n for s in sl.sources for n in s.params)}

    def first(name: str, scopes: Sequence[Mapping[str, Any]], key: str) -> Any:
        return next((v for scope in scopes if name in scope
                     and (v := setting_at(scope[name], key, p.t)) is not None), None)

    out = {n: v for n in names if (v := first(n, (sl.params, shared), p.key)) is not None}
    own = [{n: v for n in names if (v := first(n, (s.params, sl.params, shared), key)) is not None}
           for s, (_, key) in zip(sl.sources, p.inputs, strict=False)]
    return out, own
