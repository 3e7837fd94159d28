"""The ``device=`` option (``--device`` on align / merge / check): parsed and checked before any work.

:func:`resolve_device` turns a user's device string into a ``torch.device`` the run can compute on, or raises a
ConfigError naming the option: an unparsable name, a device type weights cannot be computed on (``meta``: it holds
shapes, no values), or an accelerator this machine does not have (``cuda`` without a visible GPU, ``cuda:3`` on a
2-GPU machine, ``mps`` off Apple silicon). ``None`` stays ``None``: the default, which keeps every computation where
it ran before the option existed (the inputs' device, the CPU when streaming).

The device types are a registry (:data:`DEVICE_TYPES`): type → (how many devices of that type are usable, a hint
for when there are none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import ConfigError


@dataclass(frozen=True)
class DeviceType:
    """A device type modeconn computes on: ``count()`` usable devices (0: none here), ``missing`` says why not."""

    name: str
    count: Callable[[], int]
    missing: str


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _mps_count() -> int:
    mps = getattr(torch.backends, "mps", None)
    return 1 if mps is not None and mps.is_available() else 0


def _xpu_count() -> int:
    xpu = getattr(torch, "xpu", None)
    return xpu.device_count() if xpu is not None and xpu.is_available() else 0


DEVICE_TYPES: dict[str, DeviceType] = {d.name: d for d in (
    DeviceType("cpu", lambda: 1, ""),
    DeviceType("cuda", _cuda_count, "CUDA is not available here (torch built without CUDA, or no GPU visible)"),
    DeviceType("mps", _mps_count, "MPS (Apple GPU) is not available here"),
    DeviceType("xpu", _xpu_count, "XPU (Intel GPU) is not available here"),
)}
"""Device types computations may run on (``meta``, ``disk`` … hold no values to compute with and are refused)."""


def resolve_device(device: str | torch.device | None, option: str = "device") -> torch.device | None:
    """``device`` as a ``torch.device`` that exists here (``None`` stays ``None``: the default placement).

    Raises: ConfigError naming ``option`` and the value — not a device name; a type not in :data:`DEVICE_TYPES`
    (e.g. ``meta``); an accelerator that is not available (the reason named, ``--device cpu`` suggested); an index
    beyond the devices present (their number named)."""
    if device is None:
        return None
    try:
        dev = device if isinstance(device, torch.device) else torch.device(str(device))
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"{option} {device!r}: not a device name (e.g. cpu, cuda, cuda:1, mps)") from None
    kind = DEVICE_TYPES.get(dev.type)
    if kind is None:
        raise ConfigError(f"{option} {device!r}: modeconn does not compute on {dev.type!r} devices; "
                          f"valid types: {', '.join(DEVICE_TYPES)}")
    count = kind.count()
    if count == 0:
        raise ConfigError(f"{option} {device!r}: {kind.missing}; use {option} cpu")
    if dev.index is not None and dev.index >= count:
        raise ConfigError(f"{option} {device!r}: device index {dev.index} requested, but only {count} {dev.type} "
                          f"device(s) are visible")
    return dev


def is_cpu(device: torch.device | None) -> bool:
    """Whether ``device`` keeps the computation on the CPU (``None``, the default placement there, included)."""
    return device is None or device.type == "cpu"
