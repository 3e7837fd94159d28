"""A new tracer op rule is one function plus its registration (``module_op`` / ``node_op``), here in a test-local
module: a model using the new layer and function is traced with a spec that keeps its function."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

import modeconn as mc
from modeconn.errors import SpecError
from modeconn.symmetry.trace import registry


@pytest.fixture
def toy():
    """tests/toy_trace_ops.py imported (registering its rules), and its registrations removed afterwards."""
    mod = importlib.import_module("toy_trace_ops")
    yield mod
    del registry.MODULE_OPS[mod.ChannelGain]
    del registry.FUNCTION_OPS[mod.gated]
    sys.modules.pop("toy_trace_ops")


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model.eval()


def test_registered_op_rules_trace_a_model_using_them(toy):
    model, x = _perturbed(toy.GatedNet(), 0), torch.randn(4, 3, 6, 6)
    spec = mc.symmetry_spec(model, x)  # the self-check runs on perturbed weights too
    assert len(spec.spaces) == 1  # gated() joins the value and gate convolutions' spaces
    (space,) = spec.spaces
    assert [b.space for b in spec.tensors["gain.gain"]] == [space]
    assert [b.space for b in spec.tensors["head.weight"] if b.side == "in"] == [space]
    sd = model.state_dict()
    moved = spec.apply(sd, spec.random_element(generator=torch.Generator().manual_seed(1)))
    assert not torch.equal(moved["gain.gain"], sd["gain.gain"])
    with torch.no_grad():
        before = model(x)
        model.load_state_dict(moved)
        torch.testing.assert_close(model(x), before)


def test_a_wrong_registered_rule_is_caught_by_the_self_check(toy, monkeypatch):
    forgetful = registry.ModuleOp(lambda tr, node, name, mod, x: x, per_head=False)  # the gain left unbound
    monkeypatch.setitem(registry.MODULE_OPS, toy.ChannelGain, forgetful)
    with pytest.raises(SpecError, match=r"changes its function.*gain\.gain"):
        mc.symmetry_spec(_perturbed(toy.GatedNet(), 0), torch.randn(4, 3, 6, 6))


def test_a_duplicate_registration_is_refused(toy):
    with pytest.raises(mc.errors.ConfigError, match="already registered"):
        registry.node_op(toy.gated)(toy.gated_rule)
