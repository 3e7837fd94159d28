"""Mamba (Mamba-1): the selective scan's inner-channel, state and time-step spaces beside the residual stream.

The checks every family of hf_tiny.TINY gets in test_hf_adapters.py (a spec covering every tensor, random elements
on perturbed weights, the fused gather, planted recovery), here because Mamba has no FFN role; negative controls for
the quantities that must move together; streaming equal to in memory runs in test_hf_families_reach.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hf_tiny import NO_FFN, digest, loaded, make, max_diff, outputs

import modeconn as mc
from modeconn.errors import SpecError
from modeconn.symmetry import hf

pytestmark = pytest.mark.usefixtures("one_thread")


def _changes(model, spec, g=None) -> float:
    x = hf.example_inputs(model)
    g = spec.random_element(seed=0) if g is None else g
    return max_diff(outputs(model, x), outputs(loaded(model, spec.apply(model.state_dict(), g)), x))


@pytest.mark.parametrize("name", list(NO_FFN))
def test_spec_covers_every_tensor_and_random_elements_keep_outputs(name):
    model = make(name)
    spec = mc.symmetry_spec(model)
    spec.validate(model)
    assert set(spec.tensors) == set(model.state_dict())
    assert ("residual" in spec.spaces) == (name == "mamba")  # the base model returns the stream
    assert all(spec.probes[s] for s in spec.spaces)
    before = digest(model)
    for seed in (0, 1):
        assert _changes(model, spec, spec.random_element(seed=seed)) < 1e-4
    assert digest(model) == before
    g = spec.random_element(seed=4)
    for k, t in model.state_dict().items():
        assert torch.equal(spec.apply_tensor(k, t, g), mc.SymmetrySpec.apply_tensor(spec, k, t, g))


@pytest.mark.parametrize("name", list(NO_FFN))
def test_weight_matching_recovers_a_planted_element(name):
    model = make(name)
    spec = mc.symmetry_spec(model)
    sd = model.state_dict()
    g = spec.random_element(seed=7)
    res = mc.weight_matching(spec, sd, spec.apply(sd, g), restarts=2)
    assert spec.equal(res.element, spec.inverse(g))


def test_only_permutations_and_no_absorption():
    model = make("mamba")
    with pytest.raises(SpecError, match="orthogonal residual"):
        hf.hf_symmetry_spec(model, {"residual": "orthogonal"})
    from modeconn.errors import UnsupportedOperationError

    with pytest.raises(UnsupportedOperationError, match="RMSNorm's weight"):
        mc.absorb_normalization(model)


@pytest.mark.parametrize("part", ["x without z", "B without C", "state without A_log", "inner without conv"])
def test_mamba_channels_move_only_together(part):
    """The selective scan's per-channel and per-state quantities: any one left behind changes the logits."""
    model = make("mamba")
    spec = hf.hf_symmetry_spec(model)
    assert _changes(model, spec) < 1e-4
    mixer = "backbone.layers.0.mixer"
    space, key, keep = {"x without z": ("inner", "in_proj.weight", lambda b: b.offset == 0),
                        "B without C": ("state", "x_proj.weight", lambda b: b.offset == 5),
                        "state without A_log": ("state", "A_log", lambda b: False),
                        "inner without conv": ("inner", "conv1d.weight", lambda b: False)}[part]
    key, space = f"{mixer}.{key}", f"{mixer}.{space}"
    bound = [b for b in spec.tensors[key] if b.space == space]
    assert bound
    kept = tuple(b for b in spec.tensors[key] if b.space != space or keep(b))
    wrong = dataclasses.replace(spec, tensors={**spec.tensors, key: kept})
    assert _changes(model, wrong) > 1e-3
