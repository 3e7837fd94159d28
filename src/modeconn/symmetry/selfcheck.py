"""A traced spec must keep the function of a perturbed copy of the model — checked before it is returned.

Neither :meth:`SymmetrySpec.validate` nor planted recovery can see a tensor that the spec binds wrongly or leaves
unbound while its space moves: the plant uses the same wrong spec, and at stock initialisation such a tensor is often
constant along the space (LayerNorm ``γ = 1, β = 0``, BatchNorm mean 0 / variance 1, zero biases), so moving the
space does not change the outputs either. On a perturbed copy of the state — every floating tensor gets independent
noise ``u`` of unit variance (uniform on ``[−√3, √3]``): weights and biases ``+ 0.1·std·u`` (``0.1·u`` where the
tensor is constant; ``std`` estimated on a strided sample), BatchNorm variances ``· exp(0.2·u)``; layers that break
the symmetry by design (W-asymmetric layers: ``symmetric_fixed_structure()``) are set to their symmetric values — a
random group element must leave the outputs unchanged: ``max|y(g·θ̃) − y(θ̃)| ≤ rtol · max(1, max|y(θ̃)|)`` (eval
mode; in fp32, and when that fails once more in fp64 so that rounding in models with large activations is not
mistaken for a wrong binding). Otherwise :class:`SpecError` names the spaces whose transform alone changes the
outputs and the tensors bound to no space that have an axis of such a space's size (the usual culprit: a norm or
scale that a rule did not bind).

The model runs with the perturbed state through ``torch.func.functional_call`` (it is never written, and never copied
as a module); the state is transformed in place for the second forward, and the first is the tracer's own shape
propagation run with that state (:func:`propagate_shapes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from .._util.modes import eval_mode
from ..errors import SpecError
from .spec import SymmetrySpec

RTOL = 1e-4


def perturbed_state(model: nn.Module, generator: torch.Generator,
                    dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """``model``'s state dict in ``dtype`` with every floating tensor perturbed (module docstring), as new tensors —
    ``model`` is not written. Tied tensors are perturbed once (one tensor under each of their names); floating
    buffers outside the state dict are included in ``dtype``, unperturbed, so that a forward with this state
    (``torch.func.functional_call``) runs in ``dtype`` throughout."""
    state: dict[str, torch.Tensor] = {}
    made: dict[int, torch.Tensor] = {}
    noise = torch.empty(0)
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if not t.is_floating_point():
                state[name] = t.detach().clone()  # never the model's own storage: the check writes the state
            elif id(t) in made:
                state[name] = made[id(t)]
            else:
                if noise.numel() < t.numel():
                    noise = torch.empty(t.numel())
                # unit-variance uniform noise (cheaper to draw than normal); fresh tensors, never the model's storage
                n = noise[:t.numel()].uniform_(-_SQRT3, _SQRT3, generator=generator).reshape(t.shape).to(t.device, dtype)
                src = t.detach().to(dtype)
                if name.endswith("running_var"):
                    new = torch.mul(src, n.mul_(0.2).exp_())
                else:
                    std = _spread(src)
                    new = torch.add(src, n, alpha=0.1 * std if std > 0 else 0.1)
                made[id(t)] = state[name] = new
        for name, t in model.named_buffers():
            if name not in state and t.is_floating_point():
                state[name] = t.detach().to(dtype, copy=True)
        for prefix, mod in model.named_modules():  # symmetry broken by design (W-asymmetric layers): test the symmetric layer
            for attr, value in getattr(mod, "symmetric_fixed_structure", dict)().items():
                state[f"{prefix}.{attr}" if prefix else attr].copy_(value)
    return state


_SQRT3 = 3.0 ** 0.5
_SPREAD_SAMPLE = 1 << 14


def _spread(t: torch.Tensor) -> float:
    """The standard deviation of ``t``, estimated on an evenly strided sample of at most :data:`_SPREAD_SAMPLE`
    entries (it only scales the noise)."""
    flat = t.reshape(-1)
    return float(flat[::max(1, flat.numel() // _SPREAD_SAMPLE)].std()) if flat.numel() > 1 else 0.0


def _apply_in_place(spec: SymmetrySpec, state: dict[str, torch.Tensor], g: dict[str, torch.Tensor]) -> None:
    """``state`` (of :func:`perturbed_state`: its own tensors) overwritten with ``g·state``; each tensor once."""
    done: set[int] = set()
    with torch.no_grad():
        for key, t in state.items():
            if spec.tensors.get(key) and id(t) not in done:
                done.add(id(t))
                t.copy_(spec.apply_tensor(key, t, g))


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out.double()]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _tensors(v)]
    return []


def _forward(model: nn.Module, inputs: Sequence[Any], state: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """``model``'s outputs on ``inputs`` (cast to the floating dtype of ``state``) with its tensors replaced by ``state``
    (``torch.func.functional_call``: the model itself is not written), in eval mode."""
    with eval_mode(model), torch.no_grad():
        return _tensors(torch.func.functional_call(model, state, tuple(_cast(inputs, state)), tie_weights=False))


class _ShapeProp(nn.Module):
    """Holds a GraphModule so that ``torch.func.functional_call`` can swap its tensors around ``ShapeProp``."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__()
        self.gm = gm

    def forward(self, *args: Any) -> Any:
        return ShapeProp(self.gm).propagate(*args)


def propagate_shapes(gm: torch.fx.GraphModule, examples: Sequence[Any],
                     state: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """``torch.fx`` ShapeProp of ``gm`` on ``examples`` (shapes in ``node.meta["tensor_meta"]``); its outputs. With
    ``state`` (a :func:`perturbed_state` of the traced model) the graph runs with those tensors in place of its own
    and the floating examples cast to their dtype: shapes do not depend on the values, and the outputs are then the
    self-check's reference (one forward of the model instead of two)."""
    if state is None:
        return _tensors(ShapeProp(gm).propagate(*examples))
    names = {k for k, _ in gm.named_parameters(remove_duplicate=False)} | {k for k, _ in gm.named_buffers(remove_duplicate=False)}
    swap = {f"gm.{k}": t for k, t in state.items() if k in names}
    return _tensors(torch.func.functional_call(_ShapeProp(gm), swap, tuple(_cast(examples, state)), tie_weights=False))


def _cast(inputs: Sequence[Any], state: dict[str, torch.Tensor]) -> list[Any]:
    """``inputs`` with every floating tensor cast to the floating dtype of ``state``."""
    dtype = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
    return [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


def _relative_change(ref: list[torch.Tensor], got: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max()) / max(1.0, float(a.abs().max())) for a, b in zip(ref, got, strict=True))


def _change(spec: SymmetrySpec, model: nn.Module, state: dict[str, torch.Tensor], ref: list[torch.Tensor],
            inputs: Sequence[Any], element: dict[str, torch.Tensor]) -> float:
    """Relative output change of ``model`` run with ``element`` applied to its ``state`` (``state`` is not written)."""
    copies: dict[int, torch.Tensor] = {}
    for t in state.values():
        if id(t) not in copies:
            copies[id(t)] = t.clone()
    moved = {k: copies[id(t)] for k, t in state.items()}  # tied tensors stay one tensor
    _apply_in_place(spec, moved, element)
    return _relative_change(ref, _forward(model, inputs, moved))


EXAMPLES = 2
"""Examples (along dim 0 of the inputs) the check — and the tracer's shape propagation — runs on: one generic input
shows a wrong binding; a second guards against units that happen to be inactive on the first, and keeps the batch axis
from being mistaken for a broadcast one (size 1)."""


def first_examples(inputs: Sequence[Any], k: int) -> Sequence[Any]:
    """The first ``k`` rows of every input when all are tensors with one leading size above ``k`` (a batch), else
    ``inputs`` unchanged."""
    if not inputs or not all(isinstance(x, torch.Tensor) and x.dim() > 0 for x in inputs):
        return inputs
    sizes = {x.shape[0] for x in inputs}
    return [x[:k] for x in inputs] if len(sizes) == 1 and sizes.pop() > k else inputs


def check_function_preserved(spec: SymmetrySpec, model: nn.Module, inputs: Sequence[Any], *, seed: int = 0,
                             rtol: float = RTOL,
                             reference: tuple[dict[str, torch.Tensor], list[torch.Tensor]] | None = None) -> float:
    """Check that a random element of ``spec`` keeps the outputs of a perturbed copy of ``model`` on ``inputs`` (its
    first :data:`EXAMPLES` rows when the inputs are one batch of tensors: the check's cost, not its power, grows with
    the batch).

    ``reference``: the fp32 pass's perturbed state (``perturbed_state(model, Generator().manual_seed(seed))``, which
    the check then overwrites) and the outputs it gives on those rows, when they were computed already (the tracer's
    shape propagation runs with them, :func:`propagate_shapes`).

    Returns the relative output change (≤ ``rtol``). Nothing is checked (0.0 returned) when the perturbed copy
    itself computes non-finite outputs (an unstable model; nothing to compare). ``model`` is never modified.

    Raises: SpecError naming the spaces whose transform alone changes the outputs and the unbound tensors with an
        axis of their size.
    """
    g = spec.random_element(seed=seed)
    inputs = first_examples(inputs, EXAMPLES)
    for dtype in (torch.float32, torch.float64):  # fp64 only to rule out fp32 rounding (large activations)
        if reference is not None and dtype == torch.float32:
            state, ref = reference
        else:
            state = perturbed_state(model, torch.Generator().manual_seed(seed), dtype)
            ref = _forward(model, inputs, state)
        if not ref or not all(torch.isfinite(t).all() for t in ref):
            return 0.0
        _apply_in_place(spec, state, g)  # the perturbed state is ours: no second copy of the model
        err = _relative_change(ref, _forward(model, inputs, state))
        if err <= rtol:
            return err
    state = perturbed_state(model, torch.Generator().manual_seed(seed), torch.float64)  # untransformed, to diagnose
    ident = spec.identity()
    bad = [s for s in spec.spaces if _change(spec, model, state, ref, inputs, ident | {s: g[s]}) > rtol]
    sizes = {spec.spaces[s].size for s in bad}
    shapes = dict(spec.shapes) if spec.shapes else {k: tuple(t.shape) for k, t in state.items()}
    unbound = [k for k, binds in spec.tensors.items() if not binds and k not in spec.aliases
               and any(n in sizes for n in shapes.get(k, ()))]
    raise SpecError(
        f"the traced spec of {type(model).__name__} changes its function: a random group element moved the outputs "
        f"of a perturbed copy by {err:.3g} (relative; tolerance {rtol:g}). Spaces whose transform alone changes the "
        f"outputs: {bad or 'none alone (an interaction of spaces)'}; tensors bound to no space with an axis of their "
        f"size: {unbound[:12] or 'none'}{' …' if len(unbound) > 12 else ''}. A module's rule binds its tensors wrongly: "
        "register a rule for it (leaf_modules / an adapter) or write the spec by hand; check=False skips this check"
    )
