"""A traced spec must keep the function of a perturbed copy of the model — checked before it is returned.

Neither :meth:`SymmetrySpec.validate` nor planted recovery can see a tensor that the spec binds wrongly or leaves
unbound while its space moves: the plant uses the same wrong spec, and at stock initialisation such a tensor is
often constant along the space (LayerNorm ``γ = 1, β = 0``, BatchNorm mean 0 / variance 1, zero biases), so
moving the space does not change the outputs either. On a copy whose every floating tensor is perturbed — weights
and biases by ``0.1·std`` (``0.1`` absolute where the tensor is constant), BatchNorm variances by a factor
``exp(0.2·N(0, 1))``; layers that break the symmetry by design (W-asymmetric layers: ``symmetric_fixed_structure()``)
are set to their symmetric values — a random group element must leave the outputs unchanged:
``max|y(g·θ̃) − y(θ̃)| ≤ rtol · max(1, max|y(θ̃)|)`` (eval mode; in fp32, and when that fails once more in fp64 so
that rounding in models with large activations is not mistaken for a wrong binding). Otherwise :class:`SpecError` names the spaces
whose transform alone changes the outputs and the tensors bound to no space that have an axis of such a space's
size (the usual culprit: a norm or scale that a rule did not bind).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import SpecError
from .spec import SymmetrySpec

RTOL = 1e-4


def perturbed_copy(model: nn.Module, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> nn.Module:
    """An eval-mode copy of ``model`` in ``dtype`` with every floating parameter and buffer perturbed (module
    docstring)."""
    m = copy.deepcopy(model).to(dtype).eval()
    seen: set[int] = set()
    with torch.no_grad():
        for name, t in m.state_dict(keep_vars=True).items():
            if not t.is_floating_point() or id(t) in seen:
                continue
            seen.add(id(t))  # tied tensors are perturbed once
            noise = torch.randn(t.shape, generator=generator).to(t.device)
            if name.endswith("running_var"):
                t.mul_(noise.mul_(0.2).exp_())
            else:
                std = float(t.std()) if t.numel() > 1 else 0.0
                t.add_(noise, alpha=0.1 * std if std > 0 else 0.1)
        for mod in m.modules():  # symmetry broken by design (W-asymmetric layers): test the symmetric layer
            for name, value in getattr(mod, "symmetric_fixed_structure", dict)().items():
                getattr(mod, name).copy_(value)
    return m


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out.double()]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _tensors(v)]
    return []


def _forward(model: nn.Module, inputs: Sequence[Any], state: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """``model``'s outputs on ``inputs`` (cast to its floating dtype), with its tensors replaced by ``state`` if given
    (``torch.func.functional_call``: the model itself is not written)."""
    dtype = next((t.dtype for t in model.state_dict().values() if t.is_floating_point()), torch.float32)
    args = [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    with torch.no_grad():
        if state is None:
            return _tensors(model(*args))
        return _tensors(torch.func.functional_call(model, state, tuple(args), tie_weights=False))


def _change(spec: SymmetrySpec, model: nn.Module, state: dict[str, torch.Tensor], ref: list[torch.Tensor],
            inputs: Sequence[Any], element: dict[str, torch.Tensor]) -> float:
    """Relative output change of ``model`` run with ``element`` applied to its ``state``."""
    got = _forward(model, inputs, spec.apply(state, element))
    return max(float((a - b).abs().max()) / max(1.0, float(a.abs().max())) for a, b in zip(ref, got, strict=True))


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
                             rtol: float = RTOL) -> float:
    """Check that a random element of ``spec`` keeps the outputs of a perturbed copy of ``model`` on ``inputs`` (its
    first :data:`EXAMPLES` rows when the inputs are one batch of tensors: the check's cost, not its power, grows with
    the batch).

    Returns the relative output change (≤ ``rtol``). Nothing is checked (0.0 returned) when the perturbed copy
    itself computes non-finite outputs (an unstable model; nothing to compare). ``model`` is never modified.

    Raises: SpecError naming the spaces whose transform alone changes the outputs and the unbound tensors with an
        axis of their size.
    """
    g = spec.random_element(seed=seed)
    inputs = first_examples(inputs, EXAMPLES)
    for dtype in (torch.float32, torch.float64):  # fp64 only to rule out fp32 rounding (large activations)
        base = perturbed_copy(model, torch.Generator().manual_seed(seed), dtype)
        state = base.state_dict()
        ref = _forward(base, inputs)
        if not ref or not all(torch.isfinite(t).all() for t in ref):
            return 0.0
        err = _change(spec, base, state, ref, inputs, g)
        if err <= rtol:
            return err
    ident = spec.identity()
    bad = [s for s in spec.spaces if _change(spec, base, state, ref, inputs, ident | {s: g[s]}) > rtol]
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
