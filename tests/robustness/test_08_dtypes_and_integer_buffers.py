"""Class 8 — integer buffers averaged; dtypes changed on output; fp16 and bf16 inputs mixed.

Integer and bool buffers (``num_batches_tracked``, step counters, masks, codes) are never averaged: they come from
the first model with their dtype. Every output keeps its input's dtype; floating tensors are accumulated in fp32
(fp64 for fp64 — no silent rounding). Mixed floating dtypes follow one documented rule
(:mod:`modeconn.path.interpolate`): the result takes the *first* model's dtype at every λ, and a value that
overflows it (fp16's ±65504, e.g. a bf16 B merged into an fp16 A) raises NonFiniteError naming the key.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from rb_helpers import batches, recovered
from torch import nn

import modeconn as mc
from modeconn.errors import NonFiniteError
from modeconn.path import weighted_average

interp_mod = importlib.import_module("modeconn.path.interpolate")  # the module (the package exports the function)

INT_KEYS = ("bn.num_batches_tracked", "step", "mask", "codes")


class WithBuffers(nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.bn, self.fc2 = nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)
        self.register_buffer("step", torch.tensor(3 + 5 * seed, dtype=torch.int32))
        self.register_buffer("mask", torch.arange(8) % (2 + seed) == 0)
        self.register_buffer("codes", torch.arange(8, dtype=torch.uint8) * (1 + seed))
        self.bn.num_batches_tracked.fill_(5 + 4 * seed)
        self.bn.running_mean.normal_()

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def _pair():
    return WithBuffers(0).eval(), WithBuffers(1).eval()


def check_integer_buffers(outputs: dict, sd_a, expected_counter: int | None = None) -> None:
    """The check: integer/bool buffers are A's (value and dtype) in every output."""
    for name, out in outputs.items():
        for k in INT_KEYS:
            assert out[k].dtype == sd_a[k].dtype, f"{name}: {k} became {out[k].dtype}"
            if k == "bn.num_batches_tracked" and expected_counter is not None:
                assert int(out[k]) == expected_counter, f"{name}: {k}"
            else:
                assert torch.equal(out[k], sd_a[k]), f"{name}: {k} = {out[k].tolist()} is not A's {sd_a[k].tolist()}"


def _outputs(a, sd_a, sd_b):
    return {
        "interpolate 0.3": mc.interpolate(sd_a, sd_b, 0.3),
        "interpolate 1": mc.interpolate(sd_a, sd_b, 1.0),
        "weighted_average": weighted_average([sd_a, sd_b, sd_b], [0.5, 0.25, 0.25]),
        "merge": mc.merge([sd_a, sd_b]),
        "merge bn=interpolate": mc.merge([sd_a, sd_b], model=a, bn="interpolate"),
    }


def test_integer_and_bool_buffers_are_never_averaged():
    a, b = _pair()
    sd_a, sd_b = a.state_dict(), b.state_dict()
    assert all(not torch.equal(sd_a[k], sd_b[k]) for k in INT_KEYS), "test setup: buffers must differ"
    check_integer_buffers(_outputs(a, sd_a, sd_b), sd_a)
    loader = batches((6,), n=3)
    reset = mc.merge([sd_a, sd_b], model=a, bn_loader=loader)  # statistics re-estimated: the counter counts batches
    check_integer_buffers({"merge bn=reset": reset}, sd_a, expected_counter=3)


def test_negative_control_averaging_integer_buffers_is_caught(monkeypatch):
    monkeypatch.setattr(interp_mod, "is_interpolable", lambda t: True)  # broken: every tensor is averaged
    a, b = _pair()
    with pytest.raises(AssertionError, match="is not A's"):
        check_integer_buffers(_outputs(a, a.state_dict(), b.state_dict()), a.state_dict())


def check_dtypes_kept(sd_a, sd_b, spec) -> None:
    outs = {f"interpolate {lam}": mc.interpolate(sd_a, sd_b, lam) for lam in (0.0, 0.5, 1.0)}
    outs["merge"] = mc.merge([sd_a, sd_b])
    outs["spec.apply"] = spec.apply(sd_b, spec.random_element(seed=0))
    outs["aligned"] = mc.weight_matching(spec, sd_a, sd_b).apply(sd_b)
    for name, out in outs.items():
        changed = {k: (sd_a[k].dtype, v.dtype) for k, v in out.items() if v.dtype != sd_a[k].dtype}
        assert not changed, f"{name} changed dtypes: {changed}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_output_dtypes_equal_input_dtypes(dtype):
    a, b = _pair()
    spec = mc.symmetry_spec(a, torch.randn(4, 6))
    def cast(sd):
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    check_dtypes_kept(cast(a.state_dict()), cast(b.state_dict()), spec)


def test_negative_control_result_left_in_fp32_is_caught(monkeypatch):
    monkeypatch.setattr(interp_mod, "checked_cast", lambda t, dtype, key: t)  # broken: no cast back
    a, b = _pair()
    spec = mc.symmetry_spec(a, torch.randn(4, 6))
    def half(sd):
        return {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}
    with pytest.raises(AssertionError, match="changed dtypes"):
        check_dtypes_kept(half(a.state_dict()), half(b.state_dict()), spec)


def test_float64_is_averaged_in_float64():
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(1000, generator=g, dtype=torch.float64) for _ in range(2))
    mid = mc.merge([{"w": a}, {"w": b}])["w"]
    torch.testing.assert_close(mid, 0.5 * a + 0.5 * b, rtol=1e-15, atol=1e-15)  # fp32 accumulation errs by ~1e-8


def check_mixed_rule(first_dtype, second_dtype) -> None:
    """Mixed fp16/bf16: result in the first model's dtype at every λ, computed in fp32; overflow is an error."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(256, generator=g), torch.randn(256, generator=g)
    sa, sb = {"w": x.to(first_dtype)}, {"w": y.to(second_dtype)}
    for lam in (0.0, 0.5, 1.0):
        out = mc.interpolate(sa, sb, lam)["w"]
        assert out.dtype == first_dtype, (lam, out.dtype)
        ref = ((1 - lam) * sa["w"].float() + lam * sb["w"].float()).to(first_dtype)
        assert torch.equal(out, ref), lam
    assert mc.merge([sa, sb])["w"].dtype == first_dtype
    if first_dtype == torch.float16:
        big = {"w": torch.full((256,), 2e5, dtype=second_dtype)}  # representable in bf16, not in fp16
        for fn in (lambda: mc.merge([sa, big]), lambda: mc.interpolate(sa, big, 1.0), lambda: mc.interpolate(sa, big, 0.9)):
            with pytest.raises(NonFiniteError, match="'w'.*overflows float16"):
                fn()


@pytest.mark.parametrize("first, second", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)],
                         ids=["fp16+bf16", "bf16+fp16"])
def test_mixed_half_precisions_follow_the_documented_rule(first, second):
    check_mixed_rule(first, second)


def test_negative_control_silent_fp16_overflow_is_caught(monkeypatch):
    monkeypatch.setattr(interp_mod, "checked_cast", lambda t, dtype, key: t.to(dtype))  # broken: no overflow guard
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        check_mixed_rule(torch.float16, torch.bfloat16)


def test_weight_matching_accepts_mixed_precisions():
    """Matching is computed in fp32, so an fp16 A and a bf16 (rounded, permuted) B still align exactly."""
    a, _ = _pair()
    spec = mc.symmetry_spec(a, torch.randn(4, 6))
    sd16 = {k: v.half() if v.is_floating_point() else v for k, v in a.state_dict().items()}
    g = spec.random_element(seed=2)
    sd_b = {k: v.bfloat16() if v.is_floating_point() else v for k, v in spec.apply(sd16, g).items()}
    res = mc.weight_matching(spec, sd16, sd_b)
    assert recovered(spec, res, g)
    assert all(v.dtype == sd_b[k].dtype for k, v in res.apply(sd_b).items())
