"""A traced spec must keep the function of a perturbed copy of the model — checked before it is returned.

Neither :meth:`SymmetrySpec.validate` nor planted recovery can see a tensor that the spec binds wrongly or leaves
unbound while its space moves: the plant uses the same wrong spec, and at stock initialisation such a tensor is often
constant along the space (LayerNorm ``γ = 1, β = 0``, BatchNorm mean 0 / variance 1, zero biases), so moving the
space does not change the outputs either. On a perturbed copy of the state — every floating tensor gets independent
noise ``u`` of unit variance (uniform on ``[−√3, √3]``): weights and biases ``+ 0.1·std·u`` (``0.1·u`` where the
tensor is constant; ``std`` estimated on a strided sample), then weight matrices and kernels scaled up to a standard
deviation of at least ``1/√fan_in`` (:func:`_unit_gain`: at a small initialisation the softmax of attention is
uniform and hides a wrong query/key binding), BatchNorm variances ``· exp(0.2·u)``; layers that break
the symmetry by design (W-asymmetric layers: ``symmetric_fixed_structure()``) are set to their symmetric values — a
random group element whose permutations move every unit (:func:`moving_element`) must leave the outputs unchanged:
``max|y(g·θ̃) − y(θ̃)| ≤ rtol · max(1, max|y(θ̃)|)`` (per example), in three comparisons (:func:`_passes`):

* eval mode, on :func:`check_examples` — the first :data:`EXAMPLES` rows of the example batch, the second ×
  :data:`SCALE` (a separate eval pass at ×:data:`SCALE` when the example is no batch of two);
* train mode on the same rows: dropout off (every dropout function returns its input), every other random draw from
  one seed for both forwards (a per-sample stochastic depth is then alike), BatchNorm with the batch's statistics
  (updated in copies of its buffers). A train-mode forward that draws noise per feature (not dropout) cannot be
  made alike for ``θ`` and ``g·θ``: it fails the comparison, and the SpecError says that this may be why;
* a comparison that fails in fp32 is repeated in fp64, so that rounding (large activations; BatchNorm over two
  values, which is ill-conditioned in training) is not mistaken for a wrong binding.

Otherwise :class:`SpecError` names the spaces whose transform alone changes the outputs (and the mode and scale) and
the tensors bound to no space that have an axis of such a space's size (the usual culprit: a norm or scale that a rule
did not bind). A model whose forwards keep changing its Python state — an attribute of a module that is not a
parameter, buffer or submodule changes between two forwards after the first (a counter, a growing list, a tensor
written in place), or a parameter or buffer written by an eval-mode forward — is refused (:class:`_StateWatch`). Known
memo caches of a function of the parameters (:data:`MEMO_CACHES`) are emptied before and after every forward of the
check instead, so that each forward recomputes them from the state it runs with.

What a passing check shows: on the perturbed weights, at these examples and at ×:data:`SCALE`, in both modes, the
traced graph's bindings keep the outputs under one element that moves every unit — so a binding that is wrong
anywhere on the examples' path, a stock layer's rule applied to a module that acts otherwise (registered or given in
``leaf_modules``), and a train-only or large-input behaviour that the examples reach are caught. What it cannot
show: behaviour on inputs it does not try (a branch above ×:data:`SCALE`, or hidden by a saturating activation at
that scale; units inactive on both examples), behaviour that depends on state outside the model (globals, the
clock, a closure), a per-feature random draw in training (refused only when the comparison fails), and a subclass of
a stock layer with its own ``forward`` is never trusted to keep its base's rule: the tracer follows its ``forward``
(:func:`modeconn.symmetry.trace.leaves.rule_leaf`) or refuses it, unless it is registered
(:func:`modeconn.symmetry.trace.register_rule`), in which case only this check stands behind it.

The model runs with the perturbed state through ``torch.func.functional_call`` (it is never written, and never copied
as a module); the state is transformed in place for the second forward, and the first eval-mode forward is the
tracer's own shape propagation run with that state (:func:`propagate_shapes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp
from torch.overrides import TorchFunctionMode

from .._util.modes import eval_mode, train_mode
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
                    new = _unit_gain(name, torch.add(src, n, alpha=0.1 * std if std > 0 else 0.1))
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


def _unit_gain(name: str, w: torch.Tensor) -> torch.Tensor:
    """A weight matrix or kernel (``…weight``, ≥ 2-D) scaled up, never down, to a standard deviation of at least
    ``1/√fan_in``: at a small initialisation (timm's ``std = 0.02``) attention logits are so small that the softmax
    is uniform, and a wrong query/key binding could not change the outputs."""
    if w.dim() < 2 or not name.endswith("weight") or w.numel() == 0:
        return w
    std, target = _spread(w), (w.numel() // w.shape[0]) ** -0.5
    return w.mul_(target / std) if 0 < std < target else w


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


_DROPOUT_FUNCTIONS = frozenset({
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout, torch.dropout,
    torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout,
})


class _WithoutDropout(TorchFunctionMode):
    """Every dropout function (``nn.Dropout`` modules call them too) returns its input, as in eval mode: a mask drawn
    per feature is no symmetry of anything, and dropping nothing is one of the functions training samples from."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUT_FUNCTIONS:
            return args[0] if args else kwargs["input"]
        return func(*args, **kwargs)


def _train_forward(model: nn.Module, inputs: Sequence[Any], state: dict[str, torch.Tensor],
                   seed: int) -> list[torch.Tensor]:
    """As :func:`_forward`, in train mode without dropout (:class:`_WithoutDropout`); every other random draw comes
    from the global generator seeded with ``seed`` (so per-sample draws — stochastic depth — are the same for ``θ`` and
    ``g·θ``), and the buffers are fresh copies (BatchNorm's running statistics are updated there, not in ``state``);
    BatchNorm normalises with the batch's statistics, which follow every permutation of its channels."""
    buffers = {k for k, _ in model.named_buffers(remove_duplicate=False)}
    fresh = {k: t.clone() if k in buffers else t for k, t in state.items()}
    devices = sorted({t.device.index or 0 for t in state.values() if t.device.type == "cuda"})
    with train_mode(model), torch.no_grad(), torch.random.fork_rng(devices=devices), _WithoutDropout():
        torch.manual_seed(seed)
        return _tensors(torch.func.functional_call(model, fresh, tuple(_cast(inputs, state)), tie_weights=False))


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


def relative_change(ref: list[torch.Tensor], got: list[torch.Tensor], rows: int = 0) -> float:
    """``max|got − ref| / max(1, max|ref|)`` over the outputs; per row of an output whose leading size is ``rows``
    (≥ 2: the examples are at different scales, each row is compared at its own)."""
    worst = 0.0
    for a, b in zip(ref, got, strict=True):
        if a.numel() == 0:
            continue
        if rows >= 2 and a.dim() and a.shape[0] == rows:
            diff, size = (a - b).abs().reshape(rows, -1).amax(1), a.abs().reshape(rows, -1).amax(1).clamp_min(1.0)
            worst = max(worst, float((diff / size).max()))
        else:
            worst = max(worst, float((a - b).abs().max()) / max(1.0, float(a.abs().max())))
    return worst


@dataclass(frozen=True)
class _Pass:
    """One comparison of the check: the model in ``mode`` on ``inputs`` (``rows`` examples compared row by row)."""

    mode: str
    inputs: Sequence[Any]
    rows: int = 0
    scaled: str = ""  # which inputs are at SCALE times their size, for messages ("" when none)
    optional: bool = False  # skipped when the model cannot run it (train mode with BatchNorm over one value)

    def run(self, model: nn.Module, state: dict[str, torch.Tensor], seed: int) -> list[torch.Tensor]:
        if self.mode == "train":
            return _train_forward(model, self.inputs, state, seed)
        return _forward(model, self.inputs, state)


def _change(spec: SymmetrySpec, model: nn.Module, state: dict[str, torch.Tensor], ref: list[torch.Tensor],
            inputs: Sequence[Any], element: dict[str, torch.Tensor], check: _Pass | None = None, seed: int = 0) -> float:
    """Relative output change of ``model`` run with ``element`` applied to its ``state`` (``state`` is not written), on
    ``inputs`` in eval mode or as the pass ``check`` runs it."""
    copies: dict[int, torch.Tensor] = {}
    for t in state.values():
        if id(t) not in copies:
            copies[id(t)] = t.clone()
    moved = {k: copies[id(t)] for k, t in state.items()}  # tied tensors stay one tensor
    _apply_in_place(spec, moved, element)
    check = check if check is not None else _Pass("eval", inputs)
    return relative_change(ref, check.run(model, moved, seed), check.rows)


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


SCALE = 100.0
"""The check compares the outputs at the inputs as given and at inputs ``SCALE`` times larger (floating inputs only):
a module that acts differently on large inputs (a gain above a threshold, a clamp) shows there."""


def _rows(inputs: Sequence[Any]) -> int:
    """The leading size shared by every input when all are tensors with a leading axis (one batch), else 0."""
    if not inputs or not all(isinstance(x, torch.Tensor) and x.dim() > 0 for x in inputs):
        return 0
    sizes = {x.shape[0] for x in inputs}
    return sizes.pop() if len(sizes) == 1 else 0


def _scaled(inputs: Sequence[Any], rows: slice = slice(None)) -> list[Any]:
    """``inputs`` with the rows ``rows`` of every floating tensor multiplied by :data:`SCALE` (new tensors)."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.clone()
            x[rows] *= SCALE
        out.append(x)
    return out


def check_examples(inputs: Sequence[Any]) -> Sequence[Any]:
    """The inputs the check — and the tracer's shape propagation — runs on: the first :data:`EXAMPLES` rows of one
    batch (:func:`first_examples`), the floating inputs of every row but the first multiplied by :data:`SCALE` (so the
    check sees two input scales at the cost of one forward); ``inputs`` unchanged when they are no batch of two rows or
    more or hold no floating tensor."""
    ex = first_examples(inputs, EXAMPLES)
    if _rows(ex) < 2 or not any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in ex):
        return ex
    return _scaled(ex, slice(1, None))


def _passes(inputs: Sequence[Any], scale: bool = True) -> list[_Pass]:
    """The comparisons of the check: eval and train mode on :func:`check_examples` (two scales when they are one
    batch), plus eval mode at :data:`SCALE` times the inputs when they are not (``scale=False``: the inputs as given,
    once per mode)."""
    ex = check_examples(inputs) if scale else first_examples(inputs, EXAMPLES)
    rows = _rows(ex)
    floating = any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in ex)
    label = f"the examples after the first at ×{SCALE:g}" if scale and floating and rows >= 2 else ""
    out = [_Pass("eval", ex, rows, label), _Pass("train", ex, rows, label, optional=True)]
    if scale and floating and rows < 2:
        out.append(_Pass("eval", _scaled(ex), rows, f"the inputs at ×{SCALE:g}", optional=True))
    return out


_MODULE_INTERNALS = frozenset(vars(nn.Module()))
MEMO_CACHES = frozenset({"attention_bias_cache"})
"""Module attributes that memoise a function of the module's parameters per device (timm's attention-bias gather in
EfficientFormer, LeViT, TinyViT, EfficientViT-MSRA: a dict that ``train()`` empties)."""
_ABSENT = object()


def _fingerprint(v: Any, depth: int = 0) -> Any:
    """A comparable summary of a Python value: scalars and strings themselves, containers item by item (three levels,
    64 items), tensors by shape, dtype and in-place writes (:class:`_InPlace`), other objects by identity."""
    if v is None or isinstance(v, (bool, int, str, bytes)):
        return v
    if isinstance(v, (float, complex)):
        return repr(v)  # NaN compares unequal to itself
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype, _InPlace(id(v), v._version))
    if isinstance(v, (torch.dtype, torch.device, torch.Size)):
        return repr(v)
    if isinstance(v, (list, tuple, dict, set, frozenset)):
        items = sorted(map(repr, v)) if isinstance(v, (set, frozenset)) else list(v.items() if isinstance(v, dict) else v)
        inner = tuple(_fingerprint(i, depth + 1) for i in items[:64]) if depth < 3 else ()
        return (type(v).__name__, len(v), inner)
    return (type(v).__name__, id(v))


@dataclass(frozen=True, eq=False)
class _InPlace:
    """A tensor attribute's identity and version: unequal only when the same tensor was written in place (an
    accumulator); a tensor replaced by a new one (a cache, a recorded activation) compares equal."""

    ident: int
    version: int

    def __eq__(self, other: object) -> bool:
        return not (isinstance(other, _InPlace) and other.ident == self.ident and other.version != self.version)

    __hash__ = None  # type: ignore[assignment]


def _python_state(model: nn.Module) -> dict[tuple[str, str], Any]:
    """Every attribute of every submodule that is neither a module nor ``nn.Module``'s own bookkeeping (``training``,
    hooks, the parameter and buffer tables): ``(module path, attribute) → fingerprint``."""
    return {(path, k): _fingerprint(v) for path, m in model.named_modules(remove_duplicate=False)
            for k, v in vars(m).items() if k not in _MODULE_INTERNALS | MEMO_CACHES and not isinstance(v, nn.Module)}


def _clear_memo_caches(model: nn.Module) -> None:
    for m in model.modules():
        for k in MEMO_CACHES & vars(m).keys():
            if isinstance(vars(m)[k], dict):
                vars(m)[k] = {}


class _StateWatch:
    """Refuses a model whose forwards keep changing its Python state (a call counter, a running total, a list that
    grows): such a forward computes something else on every call, which no comparison of two calls can verify. The
    state after the first forward is the reference (a cache filled on the first call is fine)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.first: dict[tuple[str, str], Any] | None = None

    def run(self, check: _Pass, state: dict[str, torch.Tensor], seed: int) -> list[torch.Tensor]:
        versions = {k: t._version for k, t in state.items()}
        _clear_memo_caches(self.model)
        try:
            return check.run(self.model, state, seed)
        finally:
            _clear_memo_caches(self.model)
            self.seen()
            if check.mode == "eval":  # train mode writes fresh copies of the buffers (BatchNorm statistics)
                self.unwritten(state, versions)

    def unwritten(self, state: dict[str, torch.Tensor], versions: dict[str, int]) -> None:
        written = [k for k, t in state.items() if t._version != versions[k]]
        if written:
            raise SpecError(
                f"{type(self.model).__name__} writes its own tensors in an eval-mode forward ({', '.join(written[:6])}"
                f"{' …' if len(written) > 6 else ''}): its outputs may depend on how often it ran, which no comparison "
                "of two forwards can verify, so no symmetry spec of it is trusted; write the spec by hand, or "
                "check=False skips this check"
            )

    def seen(self) -> None:
        now = _python_state(self.model)
        if self.first is None:
            self.first = now
            return
        changed = [k for k in dict.fromkeys([*self.first, *now]) if self.first.get(k, _ABSENT) != now.get(k, _ABSENT)]
        if changed:
            path, attr = changed[0]
            mod = self.model.get_submodule(path) if path else self.model
            names = ", ".join(f"{p or '<model>'}.{a}" for p, a in changed[:6]) + (" …" if len(changed) > 6 else "")
            raise SpecError(
                f"{type(self.model).__name__} changes its Python state on every forward (module {path!r} "
                f"({type(mod).__name__}), attribute {attr!r}; changed: {names}): its outputs may depend on how often it "
                "ran, which no comparison of two forwards can verify, so no symmetry spec of it is trusted. Keep such "
                "state out of forward (or in a buffer), or write the spec by hand; check=False skips this check"
            )


def _finite(out: list[torch.Tensor] | None) -> bool:
    return bool(out) and all(bool(torch.isfinite(t).all()) for t in out)


def _references(watch: _StateWatch, passes: list[_Pass], state: dict[str, torch.Tensor], seed: int,
                first: list[torch.Tensor] | None = None) -> list[list[torch.Tensor] | None]:
    """The outputs of every pass with the untransformed ``state`` (``first``: the first pass's, computed already).
    ``None`` for a pass that gives non-finite outputs, or for an optional pass whose forward fails (a model that cannot
    run in train mode on these examples — BatchNorm over one value per channel): such a pass checks nothing."""
    refs: list[list[torch.Tensor] | None] = []
    for i, check in enumerate(passes):
        if i == 0 and first is not None:
            out = first
        elif check.optional:
            try:
                out = watch.run(check, state, seed)
            except SpecError:
                raise
            except Exception:  # noqa: BLE001 — whatever the model raises here, the pass cannot be compared
                out = None
        else:
            out = watch.run(check, state, seed)
        refs.append(out if _finite(out) else None)
    return refs


def _errors(watch: _StateWatch, spec: SymmetrySpec, passes: list[_Pass], refs: list[list[torch.Tensor] | None],
            state: dict[str, torch.Tensor], g: dict[str, torch.Tensor], seed: int) -> list[float]:
    """The relative output change of every pass with a reference, once ``g`` is applied to ``state`` (in place)."""
    _apply_in_place(spec, state, g)  # the perturbed state is ours: no second copy of the model
    return [relative_change(ref, watch.run(c, state, seed), c.rows) if ref is not None else 0.0
            for c, ref in zip(passes, refs, strict=True)]


DERANGED = 4
"""Permutation spaces of this many units or more get a derangement in :func:`moving_element`."""
_DRAWS = 64


def moving_element(spec: SymmetrySpec, seed: int) -> dict[str, torch.Tensor]:
    """A random element of ``spec`` (``seed``) whose permutations of :data:`DERANGED` units or more move every unit (a
    uniformly random derangement): a random permutation keeps a given unit in place with probability ``1/n``, and
    with it a behaviour tied to that unit's index (a gain on one channel) would go unseen. Smaller spaces keep a
    uniformly random permutation, so that two spaces that should be one still get different elements most of the
    time (a derangement of 2 units is always the same swap)."""
    g = spec.random_element(seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for name, space in spec.spaces.items():
        if space.group == "permutation" and space.size >= DERANGED:
            units = torch.arange(space.size)
            for _ in range(_DRAWS):  # a permutation is a derangement with probability ≈ 1/e
                perm = torch.randperm(space.size, generator=gen)
                if not bool((perm == units).any()):
                    g[name] = perm
                    break
    return g


def check_function_preserved(spec: SymmetrySpec, model: nn.Module, inputs: Sequence[Any], *, seed: int = 0,
                             rtol: float = RTOL,
                             reference: tuple[dict[str, torch.Tensor], list[torch.Tensor]] | None = None) -> float:
    """Check that a random element of ``spec`` keeps the outputs of a perturbed copy of ``model`` on ``inputs``, in eval
    and in train mode, at two input scales (module docstring; the first :data:`EXAMPLES` rows when the inputs are one
    batch of tensors: the check's cost, not its power, grows with the batch).

    ``reference``: the fp32 pass's perturbed state (``perturbed_state(model, Generator().manual_seed(seed))``, which
    the check then overwrites) and the eval-mode outputs it gives on :func:`check_examples` of ``inputs``, when they
    were computed already (the tracer's shape propagation runs with them, :func:`propagate_shapes`).

    Returns the largest relative output change (≤ ``rtol``). Nothing is checked (0.0 returned) when the perturbed copy
    itself computes non-finite outputs in eval mode on the inputs as given (an unstable model; nothing to compare).
    ``model`` is never modified.

    Raises: SpecError naming the spaces whose transform alone changes the outputs (and the mode and scale where they
        do; an eval-mode failure is reported before a train-mode one) and the unbound tensors with an axis of their
        size; SpecError naming the module and attribute (or tensor) when a forward keeps changing the model's Python
        state or writes its tensors in eval mode.
    """
    g = moving_element(spec, seed)
    watch = _StateWatch(model)
    state, first = reference if reference is not None else (perturbed_state(model, torch.Generator().manual_seed(seed)),
                                                            None)
    passes = _passes(inputs)
    refs = _references(watch, passes, state, seed, first)
    if refs[0] is None and passes[0].scaled:
        passes = _passes(inputs, scale=False)  # the larger scale overflows: the inputs as given only
        refs = _references(watch, passes, state, seed)
    if refs[0] is None:
        return 0.0
    errs = _errors(watch, spec, passes, refs, state, g, seed)
    failed = [i for i, e in enumerate(errs) if e > rtol]
    if not failed:
        return max(errs)
    # the failed passes again in fp64, to rule out fp32 rounding (large activations, BatchNorm over two values)
    passes = [passes[i] for i in failed]
    state = perturbed_state(model, torch.Generator().manual_seed(seed), torch.float64)
    refs = _references(watch, passes, state, seed)
    errs = [e if ref is not None else errs[i] for i, e, ref in
            zip(failed, _errors(watch, spec, passes, refs, state, g, seed), refs, strict=True)]
    failing = [i for i, e in enumerate(errs) if e > rtol]
    if not failing:
        return max(errs)
    worst = next((i for i in failing if passes[i].mode == "eval"), failing[0])  # eval mode: deterministic, diagnosed
    if refs[worst] is None:
        raise SpecError(f"the traced spec of {type(model).__name__} changes its function: a random group element moved "
                        f"the outputs of a perturbed copy by {errs[worst]:.3g} {_where(passes[worst])} (relative; "
                        f"tolerance {rtol:g}) in fp32, and the model does not run in fp64 to rule out rounding")
    raise _changed_function(spec, model, passes[worst], refs[worst], g, seed, errs[worst], rtol)


def _where(check: _Pass) -> str:
    return f"in {check.mode} mode" + (f" ({check.scaled})" if check.scaled else "")


def _changed_function(spec: SymmetrySpec, model: nn.Module, check: _Pass, ref: list[torch.Tensor],
                      g: dict[str, torch.Tensor], seed: int, err: float, rtol: float) -> SpecError:
    """The SpecError of a failed check (pass ``check``, fp64 outputs ``ref``): the spaces whose transform alone moves the
    outputs and the unbound tensors with an axis of their size."""
    state = perturbed_state(model, torch.Generator().manual_seed(seed), torch.float64)  # untransformed, to diagnose
    ident = spec.identity()
    bad = [s for s in spec.spaces if _change(spec, model, state, ref, check.inputs, ident | {s: g[s]}, check, seed) > rtol]
    sizes = {spec.spaces[s].size for s in bad}
    shapes = dict(spec.shapes) if spec.shapes else {k: tuple(t.shape) for k, t in state.items()}
    unbound = [k for k, binds in spec.tensors.items() if not binds and k not in spec.aliases
               and any(n in sizes for n in shapes.get(k, ()))]
    return SpecError(
        f"the traced spec of {type(model).__name__} changes its function: a random group element moved the outputs "
        f"of a perturbed copy by {err:.3g} {_where(check)} (relative; tolerance {rtol:g}). Spaces whose transform "
        f"alone changes the outputs: {bad or 'none alone (an interaction of spaces)'}; tensors bound to no space with "
        f"an axis of their size: {unbound[:12] or 'none'}{' …' if len(unbound) > 12 else ''}. A module's rule binds "
        "its tensors wrongly, or a module acts differently in training or on large inputs"
        + (" (or draws random numbers per feature in training, which one seed cannot make alike for θ and g·θ)"
           if check.mode == "train" else "")
        + ": register a rule for it (leaf_modules / an adapter) or write the spec by hand; check=False skips this check"
    )
