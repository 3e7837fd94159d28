"""Class 2 — BatchNorm parameters permuted but running statistics not (or the reverse).

Either half-permutation changes the function in eval mode. Every BatchNorm tensor (weight, bias, running_mean,
running_var) must follow the permutation of its channel space, exactly; ``num_batches_tracked`` is never bound and
comes back untouched. The traced spec guarantees this (BN floating parameters *and* buffers are bound to the space
of their input), and ``spec.apply`` moves them by index gathering.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from archs import make
from rb_helpers import assert_same_function
from torch import nn

import modeconn as mc
from modeconn.errors import SpecError
from modeconn.nn_utils import batchnorm_modules

BN_ARCHS = ["mlp-bn", "vgg-bn", "resnet20-bn"]
FLOAT_BN = ("weight", "bias", "running_mean", "running_var")


def check_bn_follows(model: nn.Module, spec, g, x: torch.Tensor) -> None:
    """The check of this class: every BN float tensor is gathered by its space's permutation, the counter is
    untouched, and the function is unchanged."""
    sd = model.state_dict()
    out = spec.apply(sd, g)
    names = [n for n, m in model.named_modules() if m in set(batchnorm_modules(model))]
    assert names, "architecture without BatchNorm"
    for name in names:
        binds = spec.tensors[f"{name}.weight"]
        assert len(binds) == 1 and binds[0].axis == 0 and binds[0].side == "out", (name, binds)
        perm = g[binds[0].space]
        for t in FLOAT_BN:
            key = f"{name}.{t}"
            assert spec.tensors[key] == binds, f"{key} is bound differently from {name}.weight: {spec.tensors[key]}"
            assert torch.equal(out[key], sd[key][perm]), f"{key} does not follow the channel permutation"
        counter = f"{name}.num_batches_tracked"
        assert spec.tensors[counter] == () and out[counter] is sd[counter], f"{counter} was touched"
    assert_same_function(model, sd, out, x)


@pytest.mark.parametrize("arch", BN_ARCHS)
def test_every_bn_tensor_follows_its_channel_permutation(arch):
    model, x = make(arch)
    spec = mc.symmetry_spec(model, x)
    for seed in range(3):
        check_bn_follows(model, spec, spec.random_element(seed=seed), x)


def test_permuted_model_updates_its_statistics_consistently():
    """In train mode the permuted model's running statistics stay the permuted statistics of the original."""
    model, x = make("resnet20-bn")
    spec = mc.symmetry_spec(model, x)
    g = spec.random_element(seed=1)
    perm_model = copy.deepcopy(model)
    perm_model.load_state_dict(spec.apply(model.state_dict(), g))
    with torch.no_grad():
        model.train()(x)
        perm_model.train()(x)
    expected = spec.apply(model.state_dict(), g)
    for k, v in perm_model.state_dict().items():
        torch.testing.assert_close(v, expected[k], atol=1e-5, rtol=1e-5, msg=k)
    assert int(perm_model.state_dict()["stem.norm.num_batches_tracked"]) == 1


@pytest.mark.parametrize(
    "frozen", [("running_mean", "running_var"), ("running_var",), (".weight", ".bias")],
    ids=["stats-not-permuted", "var-not-permuted", "affine-not-permuted"],
)
def test_negative_control_half_permuted_batchnorm_changes_the_function(frozen):
    """Broken variants (statistics skipped, or the affine skipped): the function changes and the check fails."""
    model, x = make("vgg-bn")
    spec = mc.symmetry_spec(model, x)
    bn_keys = {f"{n}.{t}" for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d | nn.BatchNorm1d) for t in FLOAT_BN}
    broken = dataclasses.replace(spec, tensors={
        k: (() if k in bn_keys and k.endswith(frozen) else v) for k, v in spec.tensors.items()
    })
    g = spec.random_element(seed=0)
    with pytest.raises(AssertionError):
        check_bn_follows(model, broken, g, x)
    with pytest.raises(AssertionError, match="function changed"):
        assert_same_function(model, model.state_dict(), broken.apply(model.state_dict(), g), x)


def test_num_batches_tracked_can_never_be_bound():
    model, x = make("mlp-bn")
    spec = mc.symmetry_spec(model, x)
    key = next(k for k in spec.tensors if k.endswith("num_batches_tracked"))
    space = spec.tensors[key.replace("num_batches_tracked", "weight")][0].space
    bad = dataclasses.replace(spec, tensors=dict(spec.tensors, **{key: (mc.symmetry.AxisBinding(0, space),)}))
    with pytest.raises(SpecError, match=key.replace(".", r"\.")):
        bad.validate(model)
