"""Class 9 — tensors on two devices; a cost matrix built on the GPU indexed with CPU indices.

Every entry point checks, before any work, that all tensors live on one device, and raises DeviceMismatchError
naming a tensor of each model and both devices (the meta device stands in for a second device). On an
accelerator, the LAP's CPU permutations are moved to the device of the tensor they index (``PermutationGroup.act``)
and the cost matrix is moved to the CPU for scipy (``solve_lap``).

CI has no GPU, so the accelerator is *emulated*: :class:`FakeCuda` tensors report ``cuda:0`` and a
TorchFunctionMode enforces CUDA's rules (an op mixing a "cuda" tensor with a non-scalar CPU tensor raises, except
the CPU index tensors ``__getitem__`` accepts; ``.numpy()`` needs ``.cpu()`` first; ``.to("cuda")`` and factory
functions with ``device="cuda"`` produce FakeCuda tensors). The negative control shows the emulation catches a
CPU index that is not moved.
"""

from __future__ import annotations

import copy

import pytest
import torch
from archs import make
from rb_helpers import batches, recovered
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

import modeconn as mc
from modeconn.checks import check_one_device
from modeconn.errors import DeviceMismatchError
from modeconn.path import weighted_average
from modeconn.symmetry.groups import PermutationGroup

CUDA = torch.device("cuda", 0)


class FakeCuda(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0 (its rules are enforced by :class:`FakeCudaMode`)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return CUDA

    @property
    def is_cuda(self):
        return True


def _cuda_target(d) -> bool | None:
    if isinstance(d, (str, torch.device)):
        return torch.device(d).type == "cuda"
    return None


_INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)


def _move(func, args, kwargs):
    """``Tensor.to/cuda/cpu``: a FakeCuda result for a "cuda" target, a plain copy for a CPU target."""
    src, *rest = args
    devices = [a for a in [*rest, kwargs.pop("device", None)] if _cuda_target(a) is not None]
    rest = [a for a in rest if _cuda_target(a) is None]
    if func is torch.Tensor.cuda:
        to_cuda = True
    elif func is torch.Tensor.cpu:
        to_cuda = False
    else:  # .to(device, dtype, ...); a dtype-only .to keeps the device
        to_cuda = _cuda_target(devices[-1]) if devices else isinstance(src, FakeCuda)
    plain = src.as_subclass(torch.Tensor) if isinstance(src, FakeCuda) else src
    out = plain.to(*rest, **kwargs) if func is torch.Tensor.to else plain
    if to_cuda:
        return out.as_subclass(FakeCuda)
    return out.clone() if out is plain and isinstance(src, FakeCuda) else out  # a device copy is a copy


class FakeCudaMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            return _move(func, args, kwargs)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        on_cuda = any(isinstance(t, FakeCuda) for t in tensors)
        if getattr(func, "__name__", "") == "numpy" and on_cuda:
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() first.")
        if _cuda_target(kwargs.get("device")):  # factory functions: torch.arange(n, device="cuda")
            kwargs["device"], on_cuda = "cpu", True
        if on_cuda:
            cpu = [t for t in tensors if not isinstance(t, FakeCuda) and t.dim() > 0]  # 0-dim CPU tensors are allowed
            if func in _INDEXING and isinstance(args[0], FakeCuda):
                cpu = []  # CUDA tensors accept CPU index tensors in x[idx] (they are copied over)
            if cpu:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
                                   f"cpu! ({getattr(func, '__name__', func)})")
        out = func(*args, **kwargs)
        if on_cuda:
            out = tree_map(lambda t: t.as_subclass(FakeCuda) if type(t) is torch.Tensor else t, out)
        return out


def _to_cuda(sd):
    return {k: v.clone().as_subclass(FakeCuda) for k, v in sd.items()}


def test_emulation_enforces_cuda_rules():
    with FakeCudaMode():
        a = torch.randn(3).cuda()
        assert a.device == CUDA and (a + a).device == CUDA and (a * torch.tensor(2.0)).device == CUDA
        assert a[torch.tensor([0, 2])].device == CUDA  # CPU indices are accepted by __getitem__, as on CUDA
        assert torch.arange(3, device=a.device).device == CUDA
        assert type(a.cpu()) is torch.Tensor
        with pytest.raises(RuntimeError, match="two devices"):
            a + torch.randn(3)
        with pytest.raises(RuntimeError, match="two devices"):
            a.index_select(0, torch.tensor([0]))
        with pytest.raises(TypeError, match="numpy"):
            a.numpy()


def _planted(arch="vgg-bn"):
    model, x = make(arch)
    spec = mc.symmetry_spec(model, x)
    g = spec.random_element(seed=0)
    return model, x, spec, g, model.state_dict(), spec.apply(model.state_dict(), g)


def check_on_accelerator(spec, g, sd, sd_b) -> None:
    """The accelerator check: matching, application and averaging on "cuda" state dicts with CPU indices."""
    with FakeCudaMode():
        a, b = _to_cuda(sd), _to_cuda(sd_b)
        res = mc.weight_matching(spec, a, b)
        assert recovered(spec, res, g)
        assert all(p.device.type == "cpu" for p in res.element.values()), "elements are returned on the CPU"
        aligned = res.apply(b)  # "cuda" tensors gathered with CPU permutations
        assert all(v.device == CUDA and torch.equal(v.cpu(), sd[k]) for k, v in aligned.items())
        for out in (mc.interpolate(a, b, 0.5), mc.merge([a, b]), weighted_average([a, b])):
            assert all(v.device == CUDA for v in out.values())


def test_matching_and_merging_on_an_accelerator():
    _, _, spec, g, sd, sd_b = _planted()
    check_on_accelerator(spec, g, sd, sd_b)


def test_negative_control_cpu_index_on_the_accelerator_is_caught(monkeypatch):
    def unmoved(self, t, axis, g, side, block):  # broken variant: the CPU permutation is not moved to t's device
        if block > 1:
            g = (g[:, None] * block + torch.arange(block)).reshape(-1)
        return t.index_select(axis, g)

    monkeypatch.setattr(PermutationGroup, "act", unmoved)
    _, _, spec, g, sd, sd_b = _planted()
    with pytest.raises(RuntimeError, match="two devices"):
        check_on_accelerator(spec, g, sd, sd_b)


def _two_device_calls(model, x, spec, sd):
    loader = batches(x.shape[1:], n=1)
    model_meta = copy.deepcopy(model).to("meta")
    return {
        "check_one_device": lambda b: check_one_device([sd, b], ["A", "B"]),
        "weight_matching": lambda b: mc.weight_matching(spec, sd, b),
        "learned_matching": lambda b: mc.learned_matching(spec, model, sd, b, loader, steps=1),
        "interpolate": lambda b: mc.interpolate(sd, b, 0.5),
        "weighted_average": lambda b: weighted_average([sd, b]),
        "merge": lambda b: mc.merge([sd, b]),
        "evaluate_path": lambda b: mc.evaluate_path(model, sd, b, loader, lambdas=3, bn_loader=loader),
        "activation_matching": lambda b: mc.activation_matching(spec, model, model_meta, loader),
    }


CALLS = ["check_one_device", "weight_matching", "learned_matching", "interpolate", "weighted_average", "merge",
         "evaluate_path", "activation_matching"]


@pytest.mark.parametrize("name", CALLS)
def test_two_devices_are_one_clear_error_before_any_work(name):
    model, x, spec, _, sd, sd_b = _planted("mlp-bn")
    fn = _two_device_calls(model, x, spec, sd)[name]
    with pytest.raises(DeviceMismatchError, match=r"is on meta but .*\[.*\] is on cpu|is on cpu but .* is on meta"):
        fn({k: v.to("meta") for k, v in sd_b.items()})


def test_cpu_and_accelerator_mixed_is_one_clear_error():
    _, _, spec, _, sd, sd_b = _planted("mlp-bn")
    with FakeCudaMode():
        b = _to_cuda(sd_b)
        for fn in (lambda: mc.weight_matching(spec, sd, b), lambda: mc.merge([sd, b]), lambda: mc.interpolate(sd, b, 0.5)):
            with pytest.raises(DeviceMismatchError, match=r"B\['.*'\] is on cuda:0 but A\['.*'\] is on cpu|model 1"):
                fn()


def test_meta_state_dicts_are_permuted_without_touching_data():
    """A model materialised on the meta device (or any other) is permuted on its own device."""
    _, _, spec, g, sd, _ = _planted("vgg-bn")
    meta = {k: v.to("meta") for k, v in sd.items()}
    out = spec.apply(meta, g)
    assert all(v.device.type == "meta" and v.shape == sd[k].shape and v.dtype == sd[k].dtype for k, v in out.items())
