"""Returned state dicts carry ``_metadata`` (module versions): torchvision's MNASNet-style modules refuse a state dict
without their version, so merge / evaluate_path / spec.apply must keep it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import modeconn as mc
from modeconn.path.interpolate import interpolate, weighted_average

pytestmark = pytest.mark.usefixtures("one_thread")


class Versioned(nn.Module):
    """Like torchvision's ``_InvertedResidual`` stack in MNASNet: ``_load_from_state_dict`` needs its version."""

    _version = 2

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        if local_metadata.get("version") != 2:
            raise ValueError(f"{prefix or 'root'}: state dict without the module version (_metadata dropped)")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)


def _pair():
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        m = Versioned()
        m.bn.running_mean.normal_()
        models.append(m.eval())
    return models


def test_every_returned_state_dict_loads_into_a_versioned_module():
    a, b = _pair()
    x = torch.randn(4, 6)
    spec = mc.symmetry_spec(a, x)
    sd_a, sd_b = a.state_dict(), b.state_dict()
    plain = dict(sd_b)  # the broken variant: a state dict that lost _metadata is refused by the module
    with pytest.raises(ValueError, match="module version"):
        Versioned().load_state_dict(plain)
    aligned = spec.apply(sd_b, mc.weight_matching(spec, sd_a, sd_b).element)
    loader = DataLoader(TensorDataset(torch.randn(32, 6), torch.randint(0, 3, (32,))), batch_size=8)
    for sd in (aligned, interpolate(sd_a, aligned, 0.3), interpolate(sd_a, aligned, 0.0),
               interpolate(sd_a, aligned, 1.0), weighted_average([sd_a, aligned]),
               mc.merge([sd_a, aligned], model=a, bn_loader=loader), mc.merge([sd_a, aligned], model=a, bn="keep")):
        Versioned().load_state_dict(sd)
    curve = mc.evaluate_path(a, sd_a, aligned, loader, lambdas=3, bn_loader=loader)
    assert len(curve.lambdas) == 3
