"""Trust round 3, class 4 (fx half) — the traced spec's self-check could be fooled.

It trusted an ``nn.Linear`` / ``nn.Conv`` subclass with a ``forward`` of its own after one eval-mode pass on the
example, so a gain applied only in training, or only to large inputs, slipped through, and it could not see a forward
that depends on Python state (a call counter). Now:

* a subclass of a stock layer (Linear, Conv, norm, activation) with its own ``forward`` is traced into unless it is
  registered; where fx cannot follow it, a SpecError names its path and class;
* the check compares outputs in eval *and* train mode (dropout off, one seed for both forwards, batch statistics),
  on the example and on a copy ×100, with an element whose permutations move every unit;
* a forward that keeps changing the model's Python state (or writes its tensors in eval mode) is refused.
Each test has a broken variant (the old behaviour, monkeypatched) that accepts the fooling model silently.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import modeconn as mc
from modeconn.errors import SpecError
from modeconn.symmetry import selfcheck
from modeconn.symmetry import trace as trace_mod
from modeconn.symmetry.selfcheck import check_function_preserved


def _gain(n: int) -> torch.Tensor:
    g = torch.ones(n)
    g[0] = 3.0  # one channel only: no permutation that moves it commutes with this
    return g


class HugeInputGain(nn.Linear):
    """Channel 0 tripled for inputs beyond any scale the check tries: invisible to every comparison."""

    def forward(self, x):
        y = super().forward(x)
        return y * _gain(self.out_features) if x.abs().max() > 1e6 else y


class TrainGain(nn.Linear):
    """Channel 0 tripled in training only (fx traces in eval mode, so the branch is not in the graph)."""

    def forward(self, x):
        y = super().forward(x)
        return y * _gain(self.out_features) if self.training else y


class LargeInputGain(nn.Linear):
    """Channel 0 tripled when the input exceeds 20 in magnitude."""

    def forward(self, x):
        y = super().forward(x)
        return y * _gain(self.out_features) if x.abs().max() > 20 else y


class LateCounter(nn.Linear):
    """Channel 0 tripled from the 1000th call on: every comparison the check makes is long before."""

    def forward(self, x):
        self.calls = getattr(self, "calls", 0) + 1
        y = super().forward(x)
        return y * _gain(self.out_features) if self.calls > 1000 else y


class TrainBlock(nn.Module):
    """A plain module (traced into) whose training branch weighs one channel of its Linear's output."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = F.leaky_relu(self.fc(x), 0.1)
        if self.training:
            y = y * _gain(8)
        return y


def _net(layer: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.1), layer, nn.LeakyReLU(0.1), nn.Linear(8, 2)).eval()


X = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def registry(monkeypatch):
    """register_rule in a test without leaking into the others."""
    monkeypatch.setattr(trace_mod, "MODULE_RULES", dict(trace_mod.MODULE_RULES))
    return mc.symmetry.register_rule


def _old_leaf_rule(m):  # the broken variant: every subclass of a rule layer is one node with its base's rule
    return isinstance(m, trace_mod._RULE_MODULES)


def test_a_layer_subclass_with_its_own_forward_is_refused_unless_traced_or_registered(monkeypatch, registry):
    model = _net(HugeInputGain(8, 8))
    with pytest.raises(SpecError, match=r"module '2' \(HugeInputGain\) subclasses torch\.nn\.Linear "
                                        r"with a forward of its own.*register_rule\(HugeInputGain"):
        mc.symmetry_spec(model, X)

    class WhereGain(nn.Conv2d):  # traceable by fx, but F.conv2d has no symmetry rule: named, not a trace error
        def forward(self, x):
            y = F.conv2d(x, self.weight, self.bias)
            return torch.where(y > 5, 3 * y, y)

    conv = nn.Sequential(WhereGain(3, 4, 1), nn.Flatten(), nn.Linear(64, 2)).eval()
    with pytest.raises(SpecError, match=r"module '0' \(WhereGain\) subclasses .*Conv2d.*conv2d.*no symmetry rule"):
        mc.symmetry_spec(conv, torch.randn(2, 3, 4, 4))

    class PlainForward(nn.Linear):  # timm's Linear: its own forward, which fx follows (F.linear): traced into
        def forward(self, x):
            return F.linear(x, self.weight, self.bias)

    spec = mc.symmetry_spec(_net(PlainForward(8, 8)), X)
    assert [b.space for b in spec.tensors["2.weight"] if b.side == "out"] == ["P_2"]

    registry(HugeInputGain, nn.Linear)  # registered: the user vouches for it (and the check still runs)
    assert mc.symmetry_spec(model, X).tensors["2.weight"]

    monkeypatch.setattr(trace_mod, "MODULE_RULES", {})
    monkeypatch.setattr(trace_mod, "_rule_leaf", _old_leaf_rule)  # broken: trusted as a Linear, silently
    wrong = mc.symmetry_spec(model, X)
    assert wrong.tensors["2.weight"]  # a spec that is wrong for inputs above 1e6


def test_train_mode_behaviour_is_checked(monkeypatch, registry):
    for model in (_net(TrainGain(8, 8)),
                  nn.Sequential(nn.Linear(4, 8), TrainBlock(), nn.Linear(8, 2)).eval()):
        with pytest.raises(SpecError, match=r"changes its function.*in train mode"):
            mc.symmetry_spec(model, X)
    registry(TrainGain, nn.Linear)
    with pytest.raises(SpecError, match=r"changes its function.*in train mode.*\['P_2'\]"):
        mc.symmetry_spec(_net(TrainGain(8, 8)), X)
    assert not _net(TrainGain(8, 8)).training  # the model's flags are restored

    monkeypatch.setattr(selfcheck, "_passes",  # broken: eval mode only
                        lambda inputs, scale=True: [selfcheck._Pass("eval", selfcheck.check_examples(inputs), 2)])
    mc.symmetry_spec(_net(TrainGain(8, 8)), X)  # accepted


class Regularised(nn.Module):
    """Everything that is random or batch-dependent in training, with a correct spec: dropout modules and F.dropout
    on features, BatchNorm (batch statistics), a per-sample stochastic depth."""

    def __init__(self):
        super().__init__()
        self.a, self.bn, self.drop, self.b = nn.Linear(4, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        h = self.drop(torch.relu(self.bn(self.a(x))))
        r = F.dropout(torch.tanh(self.b(h)), 0.3, self.training)
        keep = (torch.rand(x.shape[0], 1) > 0.3).float() if self.training else 1.0
        return self.head(h + keep * r)


def test_train_mode_check_accepts_dropout_batch_statistics_and_stochastic_depth():
    torch.manual_seed(0)
    model = Regularised().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    spec = mc.symmetry_spec(model, X)
    assert check_function_preserved(spec, model, (X,), seed=3) <= 1e-4
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BN statistics untouched
    assert not any(m.training for m in model.modules())


def test_large_inputs_are_checked(monkeypatch, registry):
    registry(LargeInputGain, nn.Linear)  # a registered layer is one node: only the check can see its forward

    def net():
        torch.manual_seed(0)
        return nn.Sequential(LargeInputGain(4, 8), nn.LeakyReLU(0.1), nn.Linear(8, 2)).eval()

    with pytest.raises(SpecError, match=r"changes its function.*in eval mode \(the examples after the first at "
                                        r"×100\).*\['P_0'\]"):
        mc.symmetry_spec(net(), X)
    with pytest.raises(SpecError, match=r"changes its function.*\(the inputs at ×100\)"):
        mc.symmetry_spec(net(), X[:1])  # one example: a separate pass at ×100
    monkeypatch.setattr(selfcheck, "SCALE", 1.0)  # broken: one scale only
    mc.symmetry_spec(net(), X)


def test_a_forward_that_changes_python_state_is_refused(monkeypatch, registry):
    registry(LateCounter, nn.Linear)
    with pytest.raises(SpecError, match=r"changes its Python state on every forward \(module '2' \(LateCounter\), "
                                        r"attribute 'calls'"):
        mc.symmetry_spec(_net(LateCounter(8, 8)), X)

    class Accumulates(nn.Module):  # a tensor attribute written in place: an accumulator
        def __init__(self):
            super().__init__()
            self.fc, self.seen = nn.Linear(4, 2), torch.zeros(())

        def forward(self, x):
            self.seen += 1
            return self.fc(x)

    with pytest.raises(SpecError, match=r"attribute 'seen'"):
        mc.symmetry_spec(Accumulates(), X)

    class CountsInABuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return self.fc(x)

    with pytest.raises(SpecError, match=r"writes its own tensors in an eval-mode forward \(calls\)"):
        mc.symmetry_spec(CountsInABuffer(), X)

    class Caches(nn.Module):  # state filled on the first call and then kept, or replaced by a new tensor: fine
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if not hasattr(self, "width"):
                self.width = x.shape[-1]
            self.last = x.detach()
            return self.fc(x)

    mc.symmetry_spec(Caches(), X)

    monkeypatch.setattr(selfcheck._StateWatch, "seen", lambda self: None)  # broken: no watch
    mc.symmetry_spec(_net(LateCounter(8, 8)), X)  # accepted, and wrong from the 1000th call on


def test_the_checked_element_moves_every_unit(monkeypatch, registry):
    """A gain on one channel is missed whenever the random permutation keeps that channel in place (probability 1/n);
    the check's element moves every unit of a permutation space of 4 units or more."""

    class AlwaysGain(nn.Linear):
        def forward(self, x):
            return super().forward(x) * _gain(self.out_features)

    registry(AlwaysGain, nn.Linear)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.LeakyReLU(0.1), AlwaysGain(4, 4), nn.LeakyReLU(0.1), nn.Linear(4, 2)).eval()
    spec = mc.symmetry_spec(model, X, check=False)
    for seed in range(24):
        g = selfcheck.moving_element(spec, seed)
        assert all(bool((g[s] != torch.arange(sp.size)).all()) for s, sp in spec.spaces.items())
        with pytest.raises(SpecError, match=r"\['P_2'\]"):
            check_function_preserved(spec, model, (X,), seed=seed)
    monkeypatch.setattr(selfcheck, "moving_element", lambda spec, seed: spec.random_element(seed=seed))  # broken
    missed = 0
    for seed in range(24):
        try:
            check_function_preserved(spec, model, (X,), seed=seed)
            missed += 1
        except SpecError:
            pass
    assert missed > 0
