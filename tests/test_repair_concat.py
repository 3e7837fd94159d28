"""REPAIR through concatenations (torchvision DenseNet's pattern): a bias-free conv read by later norms through
torch.cat is repaired at those norms' outputs, which then carry the interpolated statistics."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import modeconn as mc
from modeconn.path.repair import channel_stats, interpolated_targets

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
    m = Dense()
    for bn in (m.l1.norm, m.l2.norm, m.norm5):
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.normal_()
    return m.eval()


def test_repair_reaches_the_norms_behind_concatenations():
    a, b = _trained_like(0), _trained_like(1)
    x = torch.randn(2, 3, 8, 8)
    spec = mc.symmetry_spec(a, x)
    assert spec.repair_points == (("l1.norm", 1), ("l2.norm", 1), ("norm5", 1))  # not the bias-free convs
    data = TensorDataset(torch.randn(96, 3, 8, 8), torch.randint(0, 5, (96,)))
    loader = DataLoader(data, batch_size=32)
    sd_b = spec.apply(b.state_dict(), mc.weight_matching(spec, a.state_dict(), b.state_dict()).element)
    merged = mc.merge([a.state_dict(), sd_b], model=a, bn="repair", bn_loader=loader, spec=spec)
    batches = [xb for xb, _ in loader]
    b_al = _trained_like(1)
    b_al.load_state_dict(sd_b)
    targets = interpolated_targets([channel_stats(m, spec.repair_points, batches) for m in (a, b_al)], [0.5, 0.5])
    m = _trained_like(0)
    m.load_state_dict(merged)
    got = channel_stats(m, spec.repair_points, batches)
    for name, (mean_t, std_t) in targets.items():
        torch.testing.assert_close(got[name][0], mean_t, atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(got[name][1], std_t, atol=2e-3, rtol=1e-3)
