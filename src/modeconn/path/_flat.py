"""One architecture's parameters as a single flat vector (the coordinates of curves and pivot chains)."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
import torch.nn as nn
from torch.func import functional_call

from .pathobj import param_names

StateDict = Mapping[str, torch.Tensor]


class FlatParams:
    """A frozen private copy of ``model`` loaded with ``sd_a`` (buffers from A) and the map between its
    parameters (state-dict order of :func:`param_names`) and one (P,) vector of dtype ``dtype`` (default:
    float64 if A has float64 parameters, else float32). Parameters built from a vector get A's dtypes, as
    :func:`~modeconn.path.interpolate` points do. The caller's model and state dicts are never touched."""

    def __init__(self, model: nn.Module, sd_a: StateDict, device: torch.device, dtype: torch.dtype | None = None):
        self.net = copy.deepcopy(model).to(device)
        self.net.load_state_dict(sd_a)
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.names = param_names(self.net)
        params = dict(self.net.named_parameters())
        self.shapes = [tuple(params[n].shape) for n in self.names]
        self.numels = [params[n].numel() for n in self.names]
        self.dtypes = [sd_a[n].dtype for n in self.names]
        self.dtype = dtype or (torch.float64 if torch.float64 in self.dtypes else torch.float32)
        self.device = device

    def flat(self, sd: StateDict) -> torch.Tensor:
        """The (P,) vector of ``sd``'s parameters."""
        return torch.cat([sd[n].detach().to(self.device, self.dtype).reshape(-1) for n in self.names])

    def params(self, v: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{parameter name: tensor}`` from a (P,) vector (differentiable; each in A's dtype)."""
        parts = torch.split(v, self.numels)
        return {n: p.view(s).to(d) for n, p, s, d in zip(self.names, parts, self.shapes, self.dtypes, strict=False)}

    def forward(self, v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The architecture's output at parameters ``v`` (buffers and train/eval mode of the private copy)."""
        return functional_call(self.net, self.params(v), (x,))
