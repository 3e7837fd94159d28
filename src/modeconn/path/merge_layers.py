"""Where a tensor sits in a decoder's layer stack, and the value a layer-dependent merge parameter takes there.

A parameter *gradient* (mergekit's recipes: ``t: [0, 0.5, 1]``) is a list of anchor values spread evenly over the
layers of a stack; a tensor of layer ``i`` of ``n`` sits at position ``t = i / (n − 1)`` (``1`` for a one-layer
stack) and takes the piecewise-linear interpolation of the anchors there; a list whose values are not all numbers
(flags, names) is read by index, ``values[int(t · (len − 1))]``. Tensors outside the stack (embeddings, the final
norm, the LM head) sit at ``t = 0``. This is how ``mergekit-yaml`` 0.1.5 plans a merge (its ``MergePlanner``: the
position restarts in every output slice; pre- and post-layer weights are planned at ``t = 0``). A conditional value
``[{filter, value}, …]`` takes the first entry whose filter is a substring of the tensor name (no filter or ``*``:
every tensor), and that entry's value may itself be a gradient.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
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
