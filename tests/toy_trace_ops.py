"""A layer and a function the tracer has no rule for, with their op rules: each one function plus its
registration, as a new op rule is written in :mod:`modeconn.symmetry.trace.ops` (imported by
``tests/test_trace_op_registry.py``, which removes the registrations again)."""

from __future__ import annotations

import torch
import torch.fx
from torch import nn

from modeconn.symmetry.trace import module_op, node_op


class ChannelGain(nn.Module):
    """A per-channel gain behind data-dependent control flow: torch.fx cannot trace into it, so it must be a leaf."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x != 0).any()):
            return x * self.gain.view(1, -1, 1, 1)
        return x


def gated(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(gate)


torch.fx.wrap("gated")  # one opaque node in the traced graph


@module_op(ChannelGain)
def channel_gain(tr, node, name, mod, x):
    tr.bind(f"{name}.gain", 0, tr.require_dim(node, x, 1), "out")  # the gain moves with the channels
    return x


@node_op(gated)
def gated_rule(tr, node):
    x, gate = (tr.value(a) for a in node.args[:2])
    if x is None or gate is None or len(x.segs) != len(gate.segs):
        return tr.unsupported(node, "gated() of values with different layouts")
    tr.union_segs(x, gate, node)  # both operands must be permuted alike
    return x


class GatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.value, self.gate = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 3, padding=1)
        self.gain, self.head = ChannelGain(8), nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gain(gated(self.value(x), self.gate(x)))).mean((2, 3))
