"""torch.fx tracing at the example's shapes, for models whose forward branches on sizes (timm's MobileViT, EfficientViT,
TinyViT, Twins, CrossViT, Hiera pad or resize only when a size is not a multiple of a window or patch).

Every proxy carries the value its node computes on the example input (run alongside the trace), so ``x.shape``,
``x.size()``, ``x.dim()``, ``len(x)``, ``x.device`` and ``x.dtype`` are plain Python values and a branch on them is
taken as the example takes it: the graph is the model's computation *at the example's shapes* (sizes appear in it as
numbers). A branch on a tensor's values stays a :class:`torch.fx.proxy.TraceError` (it would depend on the data). The
tracer derives the spec from this graph; the self-check then runs the model itself, not the graph.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.fx

_PLAIN = (bool, int, float, str, torch.device, torch.dtype, torch.Size, type(None))


class _ConcreteProxy(torch.fx.Proxy):
    """A proxy with ``_value``: what its node computes on the example (absent where it could not be computed)."""

    def _concrete(self) -> Any:
        return self.__dict__.get("_value", _MISSING)

    def size(self, dim: int | None = None) -> Any:
        v = self._concrete()
        if isinstance(v, torch.Tensor):
            return v.size() if dim is None else v.size(dim)
        return self.tracer.create_proxy("call_method", "size", (self,) if dim is None else (self, dim), {})

    def dim(self) -> Any:
        v = self._concrete()
        return v.dim() if isinstance(v, torch.Tensor) else self.tracer.create_proxy("call_method", "dim", (self,), {})

    def __len__(self) -> int:
        v = self._concrete()
        if v is _MISSING:
            return super().__len__()
        return len(v)

    def __getattr__(self, k: str) -> Any:
        v = self.__dict__.get("_value", _MISSING)
        if k in ("shape", "device", "dtype", "ndim", "is_cuda") and isinstance(v, torch.Tensor):
            return getattr(v, k)
        return super().__getattr__(k)


_MISSING = object()


class ConcreteTracer(torch.fx.Tracer):
    """:class:`torch.fx.Tracer` whose proxies carry their values on ``example`` (positional inputs of ``forward``)."""

    def __init__(self, example: tuple[torch.Tensor, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.example = list(example)
        self._leaf_forward: Any = None
        self._computing = False  # running a leaf's forward on values: nothing it calls is recorded

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> torch.fx.Graph:
        """The graph of ``root`` on the example; ``forward``'s parameters after the example's take their defaults
        (Hiera's ``mask=None``), as constants."""
        params = list(inspect.signature(root.forward).parameters.values())[len(self.example):]
        defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        return super().trace(root, {**defaults, **(concrete_args or {})})

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _ConcreteProxy(node, self)

    def call_module(self, m: torch.nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        if self._computing:
            return forward(*args, **kwargs)
        self._leaf_forward = forward
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict) -> Any:
        return attr_val if self._computing else super().getattr(attr, attr_val, parameter_proxy_cache)

    def to_bool(self, obj: torch.fx.Proxy) -> bool:
        v = obj.__dict__.get("_value", _MISSING)
        if isinstance(v, _PLAIN):
            return bool(v)
        return super().to_bool(obj)

    def iter(self, obj: torch.fx.Proxy) -> Any:
        v = obj.__dict__.get("_value", _MISSING)
        if isinstance(v, (tuple, list)):
            return iter(obj[i] for i in range(len(v)))
        return super().iter(obj)

    def create_proxy(self, kind: str, target: Any, args: tuple, kwargs: dict, *rest: Any, **more: Any) -> Any:
        rv = super().create_proxy(kind, target, args, kwargs, *rest, **more)
        try:
            rv._value = self._compute(kind, target, args, kwargs)
        except Exception:  # noqa: BLE001 — a value we cannot compute stays symbolic (fx's own errors then apply)
            pass
        return rv

    def _compute(self, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        a, kw = torch.fx.node.map_aggregate(args, _value_of), torch.fx.node.map_aggregate(kwargs, _value_of)
        if kind == "placeholder":
            return self.example.pop(0) if self.example else _MISSING
        self._computing = True
        try:
            if kind == "get_attr":
                return _attr(self.root, target)
            if kind == "call_function":
                return target(*a, **kw)
            if kind == "call_method":
                return getattr(a[0], target)(*a[1:], **kw)
            return self._leaf_forward(*a, **kw) if kind == "call_module" else _MISSING
        finally:
            self._computing = False


def _value_of(v: Any) -> Any:
    if isinstance(v, torch.fx.Proxy):
        value = v.__dict__.get("_value", _MISSING)
        if value is _MISSING:
            raise LookupError(v.node.name)
        return value
    return v


def _attr(root: torch.nn.Module, target: str) -> Any:
    obj: Any = root
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj
