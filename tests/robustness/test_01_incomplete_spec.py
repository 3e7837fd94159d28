"""Class 1 — a hand-written or traced spec that misses a layer or names one twice.

A spec that forgets a shortcut conv, its BatchNorm or a bottleneck's third conv silently leaves that tensor
unpermuted: the "aligned" model computes a different function. ``SymmetrySpec.validate`` must fail and name the
tensor; a tensor named twice (or one axis bound to two spaces) is rejected when the spec is built. Automatic
specs (``symmetry_spec``) validate themselves and bind every hidden tensor, on every architecture we ship.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from archs import ARCH_IDS, make
from rb_helpers import assert_same_function
from torch import nn

import modeconn as mc
from modeconn.errors import SpecError
from modeconn.symmetry import AxisBinding, SymmetrySpec
from modeconn.symmetry import trace as trace_mod


class Bottleneck(nn.Module):
    """stem → bottleneck (1×1 → 3×3 → 1×1, BN after each) + projection shortcut (1×1 conv + BN) → head."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(2, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)
        self.conv1, self.bn1 = nn.Conv2d(6, 4, 1, bias=False), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.conv3, self.bn3 = nn.Conv2d(4, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.shortcut = nn.Sequential(nn.Conv2d(6, 8, 1, bias=False), nn.BatchNorm2d(8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = F.relu(self.bn0(self.stem(x)))
        y = F.relu(self.bn1(self.conv1(h)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.head(F.relu(y + self.shortcut(h)).mean((2, 3)))


def _bottleneck():
    torch.manual_seed(0)
    model = Bottleneck()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):  # non-trivial statistics, so forgetting one changes the function
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
                m.running_mean.copy_(0.3 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return model.eval(), torch.randn(4, 2, 5, 5, generator=g)


def _bn(space):
    return {"weight": (space,), "bias": (space,), "running_mean": (space,), "running_var": (space,), "num_batches_tracked": ()}


def _axes() -> dict[str, tuple]:
    """The complete hand-written (git-re-basin style) table of the Bottleneck model."""
    axes = {
        "stem.weight": ("P0", None, None, None),
        "conv1.weight": ("P1", "P0", None, None),
        "conv2.weight": ("P2", "P1", None, None),
        "conv3.weight": ("P3", "P2", None, None),
        "shortcut.0.weight": ("P3", "P0", None, None),
        "head.weight": (None, "P3"),
        "head.bias": (None,),
    }
    for bn, space in (("bn0", "P0"), ("bn1", "P1"), ("bn2", "P2"), ("bn3", "P3"), ("shortcut.1", "P3")):
        axes.update({f"{bn}.{k}": v for k, v in _bn(space).items()})
    return axes


SIZES = {"P0": 6, "P1": 4, "P2": 4, "P3": 8}


def assert_validate_names(spec: SymmetrySpec, model: nn.Module, *keys: str) -> None:
    """The check of this class: ``validate`` raises SpecError and its message names every key in ``keys``."""
    try:
        spec.validate(model)
    except SpecError as err:
        missing = [k for k in keys if repr(k) not in str(err)]
        assert not missing, f"validate raised but did not name {missing}: {err}"
        return
    raise AssertionError(f"validate accepted a spec that misses/duplicates {list(keys)}")


@pytest.mark.slow
def test_complete_handwritten_spec_is_valid_and_equals_the_traced_one():
    model, x = _bottleneck()
    spec = SymmetrySpec.from_axes(SIZES, _axes())
    spec.validate(model)
    g = spec.random_element(seed=3)
    assert_same_function(model, model.state_dict(), spec.apply(model.state_dict(), g), x)
    traced = mc.symmetry_spec(model, x)
    # same partition of tensor axes into spaces (names differ: traced spaces are named after their creator)
    rename = {}
    for key, binds in spec.tensors.items():
        tb = traced.tensors[key]
        assert sorted((b.axis, b.side) for b in binds) == sorted((b.axis, b.side) for b in tb), key
        for b in binds:
            (t,) = [t for t in tb if t.axis == b.axis]
            assert rename.setdefault(b.space, t.space) == t.space, key
    assert len(rename) == len(traced.spaces) == 4


@pytest.mark.parametrize(
    "omitted",
    [
        ("shortcut.0.weight",),  # the shortcut conv
        ("shortcut.1.running_var",),  # its BatchNorm's statistics
        ("shortcut.1.weight", "shortcut.1.bias", "shortcut.1.running_mean", "shortcut.1.running_var",
         "shortcut.1.num_batches_tracked"),  # the whole shortcut BatchNorm
        ("conv3.weight",),  # a bottleneck's third conv
        ("bn3.bias",),
        ("bn0.num_batches_tracked",),  # even tensors no group acts on must be listed
    ],
    ids=["shortcut-conv", "shortcut-bn-var", "shortcut-bn", "third-conv", "bn3-bias", "num-batches"],
)
def test_missing_layer_is_named(omitted):
    model, _ = _bottleneck()
    axes = {k: v for k, v in _axes().items() if k not in omitted}
    assert_validate_names(SymmetrySpec.from_axes(SIZES, axes), model, *omitted)


def test_named_twice_or_bound_twice_is_rejected():
    items = list(_axes().items())
    with pytest.raises(SpecError, match=r"'conv3\.weight' is named twice"):
        SymmetrySpec.from_axes(SIZES, items + [("conv3.weight", ("P3", "P2", None, None))])
    spec = SymmetrySpec.from_axes(SIZES, _axes())
    twice = dict(spec.tensors, **{"conv3.weight": (*spec.tensors["conv3.weight"], AxisBinding(0, "P1"))})
    with pytest.raises(SpecError, match=r"'conv3\.weight' axis 0 is bound twice"):
        SymmetrySpec(spec.spaces, twice)


def test_stale_or_wrongly_sized_entries_are_named():
    model, _ = _bottleneck()
    stale = dict(_axes(), **{"layer4.conv.weight": ("P3", None, None, None)})
    assert_validate_names(SymmetrySpec.from_axes(SIZES, stale), model, "layer4.conv.weight")
    wrong = dict(_axes(), **{"conv3.weight": ("P2", "P2", None, None)})  # out axis has 8 channels, P2 has 4
    assert_validate_names(SymmetrySpec.from_axes(SIZES, wrong), model, "conv3.weight")


def test_negative_control_listed_but_unbound_is_caught_by_function_check():
    """A tensor that is listed but left unbound is statically legal (it could live in a frozen space), so
    ``validate`` cannot see it; the function-preservation check can — and it fails on that broken spec."""
    model, x = _bottleneck()
    broken = SymmetrySpec.from_axes(SIZES, dict(_axes(), **{"shortcut.1.running_var": (None,)}))
    broken.validate(model)
    g = broken.random_element(seed=3)
    with pytest.raises(AssertionError, match="function changed"):
        assert_same_function(model, model.state_dict(), broken.apply(model.state_dict(), g), x)


def test_negative_control_a_validate_without_the_coverage_check_fails_this_module(monkeypatch):
    model, _ = _bottleneck()
    axes = {k: v for k, v in _axes().items() if k != "shortcut.0.weight"}
    spec = SymmetrySpec.from_axes(SIZES, axes)

    def shapes_only(self, m):  # broken variant: checks shapes of the listed tensors only
        sd = m.state_dict()
        for key in self.tensors:
            if key in sd and self._shape_problems(key, tuple(sd[key].shape)):
                raise SpecError(f"shape problem in {key!r}")

    monkeypatch.setattr(SymmetrySpec, "validate", shapes_only)
    with pytest.raises(AssertionError, match="accepted a spec"):
        assert_validate_names(spec, model, "shortcut.0.weight")


def _check_automatic_spec(model: nn.Module, x: torch.Tensor, check: bool = True) -> None:
    spec = mc.symmetry_spec(model, x, check=check)
    spec.validate(model)
    sd = model.state_dict()
    assert set(spec.tensors) == set(sd)
    head = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))][-1]
    unbound = [k for k, t in sd.items() if t.is_floating_point() and not spec.tensors[k]]
    assert set(unbound) <= {f"{head}.bias"}, f"hidden tensors left unbound: {unbound}"
    for k, t in sd.items():
        if not t.is_floating_point():
            assert spec.tensors[k] == (), k
    assert_same_function(model, sd, spec.apply(sd, spec.random_element(seed=0)), x)


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_automatic_specs_are_complete_on_every_architecture(arch):
    _check_automatic_spec(*make(arch))


def test_automatic_spec_of_the_bottleneck_is_complete():
    _check_automatic_spec(*_bottleneck())


def test_negative_control_tracer_that_forgets_running_var(monkeypatch):
    original = trace_mod._Tracer.norm

    def forgetful(self, node, name, mod, x):
        out = original(self, node, name, mod, x)
        self.bindings = [b for b in self.bindings if not b[0].endswith("running_var")]
        return out

    monkeypatch.setattr(trace_mod._Tracer, "norm", forgetful)
    with pytest.raises(AssertionError, match="running_var"):  # this file's checker (library self-check off) ...
        _check_automatic_spec(*make("resnet20-bn"), check=False)
    with pytest.raises(SpecError, match=r"changes its function.*running_var"):  # ... and symmetry_spec's own
        mc.symmetry_spec(*make("resnet20-bn"))


def test_negative_control_tracer_that_drops_a_layer_fails_its_own_validation(monkeypatch):
    """symmetry_spec validates what it built: a tracer that loses the shortcut conv raises, naming it."""
    original = trace_mod._Tracer.build_spec
    key = "stages.1.0.shortcut.0.weight"

    def dropping(self, model):
        spec = original(self, model)
        return dataclasses.replace(spec, tensors={k: v for k, v in spec.tensors.items() if k != key})

    monkeypatch.setattr(trace_mod._Tracer, "build_spec", dropping)
    model, x = make("resnet20-bn")
    assert key in model.state_dict()
    with pytest.raises(SpecError, match=key.replace(".", r"\.")):
        mc.symmetry_spec(model, x)
