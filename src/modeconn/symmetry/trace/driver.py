"""The tracer driver: :func:`symmetry_spec` traces a model, runs the tracer over its graph, assembles and checks
the spec."""

from __future__ import annotations

import torch
import torch.fx
from torch import nn

from ..._util.modes import eval_mode
from ...errors import ConfigError, SpecError, TraceError, UnsupportedOperationError
from ..selfcheck import check_examples, check_function_preserved, perturbed_state, propagate_shapes
from ..spec import SymmetrySpec
from .leaves import tables
from .library import library_modules, library_rules
from .tracer import OnUnsupported, Tracer


def symmetry_spec(
    model: nn.Module,
    example_input: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
    *,
    on_unsupported: OnUnsupported = "error",
    leaf_modules: tuple[type[nn.Module], ...] = (),
    check: bool = True,
) -> SymmetrySpec:
    """Trace ``model`` with torch.fx and derive its permutation symmetries.

    A Hugging Face ``transformers.PreTrainedModel`` (or a module wrapping exactly one) is not traced: its
    family adapter gives the spec (:func:`modeconn.symmetry.hf.hf_symmetry_spec`; ``example_input`` and the
    tracing options are ignored).

    Args:
        model: any nn.Module built from the supported layers (see module docstring). Not modified: its
            train/eval flags are restored and shape propagation runs under ``no_grad`` in eval mode, on
            :func:`~modeconn.symmetry.selfcheck.check_examples` of ``example_input`` (its first rows when it is one
            batch).
        example_input: a tensor (or tuple of tensors) of the shape the model takes, e.g. (N, C, H, W);
            required unless ``model`` is a Hugging Face model.
        on_unsupported: ``"error"`` (default) raises :class:`UnsupportedOperationError` naming the node and the
            module whose forward holds it; ``"freeze"`` leaves every space touching such a node unpermuted.
        check: verify the traced spec on a perturbed copy before returning it
            (:func:`modeconn.symmetry.selfcheck.check_function_preserved`: random norm affines, BN statistics and
            biases, a random group element, outputs compared on ``example_input`` and on a larger copy of it, in eval
            and train mode; what it can and cannot prove is in that module's docstring). ``False`` skips it.
    Returns: a validated :class:`SymmetrySpec` (every state-dict tensor listed exactly once; input and
        output spaces never permuted) that keeps the model's function.
    Raises: :class:`ConfigError` for a bad option, :class:`TraceError` if fx cannot trace the model,
        :class:`SpecError` if the traced spec changes the function of the perturbed copy (naming the spaces and the
        tensors that do not follow them), if a forward keeps changing the model's Python state, or if a subclass of a
        stock layer with its own ``forward`` cannot be traced into and is not registered (naming its path and class).
    """
    from ..hf.registry import find_hf_model, hf_symmetry_spec  # lazy: never imports transformers itself

    if find_hf_model(model) is not None:
        return hf_symmetry_spec(model)
    if example_input is None:
        raise ConfigError(f"symmetry_spec({type(model).__name__}) needs an example_input to trace the model")
    if on_unsupported not in ("error", "freeze"):
        raise ConfigError(f"on_unsupported must be 'error' or 'freeze', got {on_unsupported!r}")
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    _register_known_rules()
    # the self-check's perturbed state: shape propagation runs with it, so its outputs are the check's reference
    state = perturbed_state(model, torch.Generator().manual_seed(0)) if check else None
    with eval_mode(model):  # traced in eval mode: train-only branches (BatchNorm counters, dropout paths) stay out
        examples = check_examples(inputs)
        gm = tables()._fx_trace(model, leaf_modules, trust_layer_subclasses=False, example=examples)
        try:
            with torch.no_grad():  # shapes need no more than the examples the self-check runs on
                outputs = propagate_shapes(gm, examples, state)
        except Exception as exc:  # any failure of the example forward is a user-facing trace error
            raise TraceError(f"running {type(model).__name__} on the example input failed: {exc}") from exc
    tracer = Tracer(gm, on_unsupported, frozenset(model.state_dict()))
    try:
        tracer.run()
        spec = tracer.build_spec(model)
    except UnsupportedOperationError as exc:
        raise UnsupportedOperationError(f"{exc} {_freeze_cost(gm, model)}") from None
    spec.validate(model)
    if state is not None:
        check_function_preserved(spec, model, inputs, reference=(state, outputs))
    return spec


def _freeze_cost(gm: torch.fx.GraphModule, model: nn.Module) -> str:
    """What ``on_unsupported="freeze"`` would cost: how many of the writers' spaces it leaves unpermuted."""
    tracer = Tracer(gm, "freeze", frozenset(model.state_dict()))
    try:
        tracer.run()
        spec = tracer.build_spec(model)
    except (UnsupportedOperationError, TraceError, SpecError) as exc:
        return f"(freezing is not possible either: {exc})"
    writers = {name for name, _, _ in tracer.writers}
    live = {b.space for name in writers for b in spec.tensors.get(f"{name}.weight", ()) if b.side == "out"}
    bound = {name for name in writers if any(b.side == "out" for b in spec.tensors.get(f"{name}.weight", ()))}
    return (f"(freezing would leave {len(writers) - len(bound)} of {len(writers)} writer layers' output spaces "
            f"unpermuted; {len(live)} spaces would remain)")


def _register_known_rules() -> None:
    """The rules of :mod:`~modeconn.symmetry.trace.library` for the libraries imported by now."""
    tables().LIBRARY_RULES.update(library_rules())
    tables().LIBRARY_MODULES.update(library_modules())
