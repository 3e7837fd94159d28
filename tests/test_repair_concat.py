"""REPAIR through concatenations (torchvision DenseNet's pattern): a bias-free conv read by later norms through
torch.cat is repaired at those norms' outputs, which then carry the interpolated statistics."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import modeconn as mc
from repair_check import assert_repaired, trained_like_norms

pytestmark = pytest.mark.usefixtures("one_thread")


class DenseLayer(nn.Module):
    def __init__(self, cin, growth):
        super().__init__()
        self.norm, self.conv = nn.BatchNorm2d(cin), nn.Conv2d(cin, growth, 3, padding=1, bias=False)

    def forward(self, feats):
        return self.conv(torch.relu(self.norm(torch.cat(feats, 1))))


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.l1, self.l2, self.norm5, self.head = DenseLayer(8, 4), DenseLayer(12, 4), nn.BatchNorm2d(16), nn.Linear(16, 5)

    def forward(self, x):
        f = [self.stem(x)]
        f.append(self.l1(f))
        f.append(self.l2(f))
        return self.head(torch.relu(self.norm5(torch.cat(f, 1))).mean((2, 3)))


def _trained_like(seed):
    torch.manual_seed(seed)
    return trained_like_norms(Dense())


def test_repair_reaches_the_norms_behind_concatenations():
    spec = mc.symmetry_spec(_trained_like(0), torch.randn(2, 3, 8, 8))
    assert spec.repair_points == (("l1.norm", 1), ("l2.norm", 1), ("norm5", 1))  # not the bias-free convs
    assert_repaired(_trained_like, spec, (3, 8, 8), 5)
