"""The op rules: how each layer type, function and tensor method acts on the symmetries of its operands.

A rule is one function, registered with a decorator in the module of its kind (:mod:`.ops`):

- ``@module_op(nn.Linear, …)``: ``rule(tr, node, name, module, x)`` for a ``call_module`` node of a layer of
  that type (or a subclass, nearest registered base first), ``x`` the value of its input. Unless registered
  with ``per_head=True`` the tracer refuses inputs with a different space per head before calling it.
- ``@node_op(F.relu, methods=("relu",))``: ``rule(tr, node)`` for a ``call_function`` node of one of the
  functions, or a ``call_method`` node of one of the methods; with ``first=True`` the rule is called as
  ``rule(tr, node, x)``, ``x`` the value of the node's first argument.

``tr`` is the :class:`~modeconn.symmetry.trace.tracer.Tracer`; a rule returns the traced value of the node's
output (a :class:`~.values.Val`, ``None`` for non-tensors, a tuple for tuple outputs) or ``tr.unsupported(node,
why)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch.fx

from ...errors import ConfigError

ModuleRule = Callable[..., Any]
NodeRule = Callable[..., Any]


@dataclass(frozen=True)
class ModuleOp:
    rule: ModuleRule
    per_head: bool  # takes values with a different space per head itself (else the tracer refuses them first)


MODULE_OPS: dict[type, ModuleOp] = {}
"""Layer type → its rule, in registration order (the stock layers first)."""
FUNCTION_OPS: dict[Callable, NodeRule] = {}
"""Function (an fx ``call_function`` target) → its rule."""
METHOD_OPS: dict[str, NodeRule] = {}
"""Tensor method name (an fx ``call_method`` target) → its rule."""


def _add(table: dict, keys: Iterable[Any], value: Any) -> None:
    for key in keys:
        if key in table:
            raise ConfigError(f"a tracer op rule for {key!r} is already registered")
        table[key] = value


def module_op(*types: type, per_head: bool = False) -> Callable[[ModuleRule], ModuleRule]:
    """Register ``rule(tr, node, name, module, x)`` for layers of ``types`` (see the module docstring)."""

    def deco(rule: ModuleRule) -> ModuleRule:
        _add(MODULE_OPS, types, ModuleOp(rule, per_head))
        return rule

    return deco


def node_op(*functions: Callable, methods: Iterable[str] = (), first: bool = False) -> Callable[[NodeRule], NodeRule]:
    """Register ``rule(tr, node)`` (``rule(tr, node, x)`` with ``first``) for ``functions`` and tensor ``methods``."""

    def deco(rule: NodeRule) -> NodeRule:
        call = (lambda tr, node: rule(tr, node, tr.arg_val(node))) if first else rule
        _add(FUNCTION_OPS, functions, call)
        _add(METHOD_OPS, methods, call)
        return rule

    return deco


def module_op_for(cls: type) -> ModuleOp | None:
    """The rule of ``cls`` or of its nearest registered base class."""
    return next((MODULE_OPS[c] for c in cls.__mro__ if c in MODULE_OPS), None)


def node_op_for(node: torch.fx.Node) -> NodeRule | None:
    """The rule for a ``call_function`` / ``call_method`` node's target."""
    table: dict[Any, NodeRule] = METHOD_OPS if node.op == "call_method" else FUNCTION_OPS  # type: ignore[assignment]
    return table.get(node.target)


def module_types() -> tuple[type, ...]:
    """Every layer type with a rule, in registration order."""
    return tuple(MODULE_OPS)
