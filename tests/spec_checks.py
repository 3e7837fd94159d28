"""What every traced vision model's test asserts of its spec (shared by the tracer's model tests)."""

from __future__ import annotations

import torch
from torch import nn

import modeconn as mc
from modeconn.symmetry.selfcheck import check_function_preserved


def assert_kept_and_recovered(spec: mc.SymmetrySpec, model: nn.Module, x: torch.Tensor,
                              sd: dict[str, torch.Tensor]) -> None:
    """The self-check passes on another seed; a random element applied to the perturbed state ``sd`` (loaded into
    ``model``) keeps the outputs; weight matching recovers that element exactly."""
    assert check_function_preserved(spec, model, (x,), seed=5) <= 1e-5
    g = spec.random_element(seed=1)
    with torch.no_grad():
        ref = model(x)
        model.load_state_dict(spec.apply(sd, g))
        torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-5)
    planted = mc.weight_matching(spec, sd, spec.apply(sd, g), restarts=1, max_iter=5)
    assert spec.equal(planted.element, spec.inverse(g))
