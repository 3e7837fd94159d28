"""Values permuted along two dims (:class:`~..values.Pair`): the ``kᵀ v`` of linear and channel attention, made
by :func:`.attention.matmul` and contracted again by it (``q (kᵀ v)``). Between the two products they may be scaled
by numbers, passed through elementwise functions and softmax (which commute with permutations of every dim), have
their axes moved and be reshaped around the two permuted dims; anything else is unsupported."""

from __future__ import annotations

import operator
from numbers import Number
from typing import TYPE_CHECKING

import torch
import torch.fx
import torch.nn.functional as F

from ..values import Pair, Val, matches, shape_of
from .attention import matmul
from .elementwise import ELEMENTWISE_FUNCTIONS, ELEMENTWISE_METHODS
from .reshape import permute, reshaped

if TYPE_CHECKING:
    from ..tracer import Tracer

PRODUCT_METHODS, PRODUCT_FUNCTIONS = {"matmul", "bmm"}, {operator.matmul, torch.matmul, torch.bmm}
PASS_METHODS = {*ELEMENTWISE_METHODS, "softmax", "log_softmax"}
PASS_FUNCTIONS = {*ELEMENTWISE_FUNCTIONS, F.softmax, F.log_softmax, torch.softmax, torch.log_softmax}
SCALE_METHODS = {"mul", "div"}
SCALE_FUNCTIONS = {operator.mul, operator.truediv, torch.mul, torch.div}
MOVE_METHODS, MOVE_FUNCTIONS = {"permute", "transpose"}, {torch.permute, torch.transpose}
RESHAPE_METHODS = {"view", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze"}
RESHAPE_FUNCTIONS = {torch.reshape, torch.flatten, torch.unflatten, torch.unsqueeze, torch.squeeze}


def pair_op(tr: Tracer, node: torch.fx.Node) -> Pair | Val | None:
    """The value of ``node``, one of whose operands is a :class:`Pair` (see the module docstring)."""
    x = tr.vals.get(node.args[0]) if node.args else None
    if matches(node, PRODUCT_METHODS, PRODUCT_FUNCTIONS):
        return matmul(tr, node)
    if not isinstance(x, Pair):
        return tr.unsupported(node, "reads a value permuted along two dims other than as the first operand")
    if matches(node, PASS_METHODS, PASS_FUNCTIONS) or matches(node, SCALE_METHODS, SCALE_FUNCTIONS) and len(
            node.args) == 2 and isinstance(node.args[1], Number) and not node.kwargs:
        return x
    if matches(node, MOVE_METHODS, MOVE_FUNCTIONS):
        return Pair(tuple(permute(tr, node, v) for v in x.vals))  # type: ignore[arg-type]
    if matches(node, RESHAPE_METHODS, RESHAPE_FUNCTIONS):
        return reshaped_pair(tr, node, x)
    return tr.unsupported(node, "no rule for this operation on a value permuted along two dims")


def reshaped_pair(tr: Tracer, node: torch.fx.Node, x: Pair) -> Pair | None:
    """Both permuted dims through a reshape that keeps them apart (it merges or splits the dims around them)."""
    in_shape, out_shape = shape_of(node.args[0]), shape_of(node)
    if in_shape is None or out_shape is None:
        return tr.unsupported(node, "shape unknown")
    new = [reshaped(tr, v, in_shape, out_shape) for v in x.vals]
    why = next((v for v in new if isinstance(v, str)), None)
    if why is None and not all(isinstance(v, Val) for v in new):
        why = "reshape splits a dim of a value permuted along two dims into parts"
    if why is None and new[0].dim == new[1].dim:  # type: ignore[union-attr]
        why = "reshape merges the two permuted dims"
    if why is not None:
        return tr.unsupported(node, why)
    return Pair(tuple(new))  # type: ignore[arg-type]
