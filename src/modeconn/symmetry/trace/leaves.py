"""Which modules the tracer keeps as one node (the leaf policy), the rules users register for their own functions
and layer types (:func:`register_rule`), and the torch.fx trace itself.

The registration tables, :func:`rule_leaf` and :func:`fx_trace` are read through the package namespace at call
time (:func:`tables`): replacing one on :mod:`modeconn.symmetry.trace` (a test isolating what it registers,
substituting a broken leaf policy, or making sure no trace starts before the options are checked) takes effect
everywhere.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FunctionType, ModuleType
from typing import Any

import torch.fx
from torch import nn

from ...errors import ConfigError, SpecError, TraceError
from .concrete import ConcreteTracer
from .ops.norms import NORM_MODULES
from .registry import module_types

ELEMENTWISE_RULES: set[Any] = set()
"""Functions and module types registered as elementwise (:func:`register_rule`)."""
MODULE_RULES: dict[type, type] = {}
"""Module types registered with the rule of a stock layer (:func:`register_rule`)."""
LIBRARY_MODULES: dict[type, type | str] = {}
"""Layer types of libraries with the rule of a stock layer or ``"elementwise"``
(:func:`modeconn.symmetry.trace.library.library_modules`), filled when tracing."""
LIBRARY_RULES: dict[Callable, Callable[..., Any]] = {}
"""Rules for fx-wrapped functions of libraries (:mod:`modeconn.symmetry.trace.library`), filled when tracing."""


def tables() -> ModuleType:
    """The package :mod:`modeconn.symmetry.trace`, whose attributes hold the tables above, :func:`rule_leaf` (as
    ``_rule_leaf``) and :func:`fx_trace` (as ``_fx_trace``)."""
    return sys.modules[__package__]


def register_rule(target: Any, rule: str | type[nn.Module] = "elementwise") -> None:
    """Tell the tracer how a function or module type of your own acts on symmetries.

    Args:
        target: a function (as it appears in the traced graph; for an fx-wrapped function the wrapped one, e.g.
            ``torchvision.ops.stochastic_depth``) or an ``nn.Module`` subclass.
        rule: ``"elementwise"`` — the output is the input transformed alike, channel by channel (activations,
            stochastic depth, dropout-like ops; parameters of such a module stay unbound, so it must have none that
            vary along channels); or a stock layer type (``nn.Linear``, ``nn.Conv2d``, ``nn.LayerNorm`` …) whose rule
            applies to ``target``, a subclass of it whose own ``forward`` keeps that layer's symmetry with the same
            parameters (without registration such a subclass is traced into, and refused with a SpecError where the
            tracer cannot follow it). The self-check still verifies what the rule binds, in eval and train mode.
    Raises: ConfigError for another rule, or a stock-layer rule for a type that does not subclass it.
    """
    if rule == "elementwise":
        tables().ELEMENTWISE_RULES.add(target)
        return
    if isinstance(rule, type) and rule in module_types() and isinstance(target, type) and issubclass(target, rule):
        tables().MODULE_RULES[target] = rule
        return
    raise ConfigError(f"register_rule: rule must be 'elementwise' or one of {[m.__name__ for m in module_types()]} for an "
                      f"nn.Module subclass; got {rule!r} for {target!r}")


def rule_leaf(m: nn.Module) -> bool:
    """Whether ``m`` is one node with the rule of a stock layer: the layer itself, a subclass that keeps its base's
    ``forward``, or a type registered with a rule (:func:`register_rule`, the library layers of
    :func:`~modeconn.symmetry.trace.library.library_modules`). A subclass with a ``forward`` of its own is traced into
    (never trusted to keep its base's symmetry: it may transform its input or output, or act differently in training
    or on large inputs): torchvision's ConvNeXt ``LayerNorm2d`` subclasses ``nn.LayerNorm`` but normalises
    channels-last, timm's ``Linear`` calls ``F.linear``; where the tracer cannot follow it, a SpecError names it
    (:func:`own_forward_layer`)."""
    if registered(type(m)) is not None:
        return True
    base = rule_base(type(m))
    return base is not None and type(m).forward is base.forward


def layer_leaf(m: nn.Module) -> bool:
    """:func:`rule_leaf`, and every Linear / Conv / activation subclass one node: where only the data flow between
    layers matters, not their symmetry (LLPF's parameter groups)."""
    base = rule_base(type(m))
    return (base is not None and base not in NORM_MODULES) or tables()._rule_leaf(m)


def rule_base(cls: type) -> type | None:
    """The layer type with an op rule (:func:`~.registry.module_op`) that ``cls`` subclasses, if any."""
    return next((b for b in module_types() if isinstance(cls, type) and issubclass(cls, b)), None)


def registered(cls: type) -> type | str | None:
    """The rule ``cls`` is registered with (a stock layer type or ``"elementwise"``), by the user or for a library."""
    t = tables()
    if cls in t.MODULE_RULES:
        return t.MODULE_RULES[cls]
    if cls in t.ELEMENTWISE_RULES:
        return "elementwise"
    return t.LIBRARY_MODULES.get(cls)


def own_forward_layer(cls: Any) -> type | None:
    """The stock layer ``cls`` subclasses when it overrides its ``forward`` and is not registered (traced into)."""
    base = rule_base(cls) if isinstance(cls, type) else None
    if base is None or cls.forward is base.forward or registered(cls) is not None:
        return None
    return base


def untraceable_layer(path: str, cls: type, base: type, why: str) -> SpecError:
    return SpecError(
        f"module {path!r} ({cls.__name__}) subclasses torch.nn.{base.__name__} with a forward of its own, which the "
        f"tracer cannot follow ({why}); a layer subclass is never trusted to keep its base's symmetry. If its forward "
        f"keeps {base.__name__}'s symmetry, register it: modeconn.symmetry.register_rule({cls.__name__}, "
        f"torch.nn.{base.__name__}) (the self-check then verifies it in eval and train mode, at two input scales); "
        "else write the spec by hand (SymmetrySpec.from_axes)"
    )


def layer_in_stack(node: torch.fx.Node) -> tuple[str, type, type] | None:
    """``(path, class, stock layer)`` of the outermost unregistered layer subclass with its own forward that holds
    ``node`` (fx's ``nn_module_stack``)."""
    for path, cls in (node.meta.get("nn_module_stack") or {}).values():
        base = own_forward_layer(cls)
        if base is not None:
            return path, cls, base
    return None


def fx_trace(model: nn.Module, leaf_modules: tuple[type[nn.Module], ...],
             trust_layer_subclasses: bool = True, example: tuple[torch.Tensor, ...] | None = None) -> torch.fx.GraphModule:
    """``model`` traced by torch.fx with the stock layers we have rules for as leaves (:func:`rule_leaf`, or
    :func:`layer_leaf` with ``trust_layer_subclasses``; fx alone would trace through any module defined outside
    torch.nn). Where fx cannot trace it symbolically (a branch on a size) and ``example`` is given, it is traced at the
    example's shapes (:class:`~.concrete.ConcreteTracer`)."""
    def is_leaf(tracer: torch.fx.Tracer, m: nn.Module, qualname: str) -> bool:
        leaf = layer_leaf(m) if trust_layer_subclasses else tables()._rule_leaf(m)
        return isinstance(m, leaf_modules) or leaf or torch.fx.Tracer.is_leaf_module(tracer, m, qualname)

    # library functions with a rule that fx would trace into (timm's rotary embedding): one node each
    autowrap = tuple(f for f in tables().LIBRARY_RULES if isinstance(f, FunctionType) and not f.__name__.startswith("_"))
    _Tr = type("_Tr", (torch.fx.Tracer,), {"is_leaf_module": is_leaf})
    try:
        graph = _Tr(autowrap_functions=autowrap).trace(model)
    except Exception as exc:
        graph = concrete_trace(model, is_leaf, example)
        if graph is not None:
            return torch.fx.GraphModule(model, graph)
        if not trust_layer_subclasses:
            blame_layer_subclass(_Tr, model, exc)
        raise TraceError(
            f"torch.fx could not trace {type(model).__name__}: {exc}. Models with data-dependent control flow "
            "need a hand-written spec (SymmetrySpec.from_axes) or an adapter."
        ) from exc
    return torch.fx.GraphModule(model, graph)


def concrete_trace(model: nn.Module, is_leaf: Callable, example: tuple[torch.Tensor, ...] | None) -> torch.fx.Graph | None:
    """The graph of ``model`` at ``example``'s shapes, or None (no example, or this fails too)."""
    if example is None:
        return None
    tracer = type("_Concrete", (ConcreteTracer,), {"is_leaf_module": is_leaf})(example)
    try:
        with torch.no_grad():
            return tracer.trace(model)
    except Exception:  # noqa: BLE001 — the symbolic trace's error is the one reported
        return None


def blame_layer_subclass(tracer: type[torch.fx.Tracer], model: nn.Module, exc: Exception) -> None:
    """SpecError naming the first unregistered layer subclass with its own forward that fx cannot trace alone, when
    tracing ``model`` failed with ``exc``; nothing when there is none (the failure is elsewhere)."""
    for path, m in model.named_modules():
        base = own_forward_layer(type(m))
        if base is None:
            continue
        try:
            tracer().trace(m)
        except Exception as inner:  # the layer's own forward is what fx cannot follow
            raise untraceable_layer(path, type(m), base, f"torch.fx: {inner}") from exc
