"""The architecture registry, kwargs validation, seeded construction and the config a model carries."""

from __future__ import annotations

import copy
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from torch import nn

from ..errors import ConfigError
from ..registry import Registry
from ._validation import check_size_bounds, parameter_budget, unknown_names_error, validation_error_to_config_error

Builder = Callable[..., nn.Module]

MODELS: Registry[Builder] = Registry("architecture")
"""Architecture builders by name. A builder is ``fn(in_shape, num_classes, **options) -> nn.Module``."""

CONFIG_ATTR = "modeconn_config"
"""Attribute every model built by :func:`build_model` carries: ``{"architecture": name, "kwargs": {...}}``."""


@functools.cache
def _kwargs_schema(name: str) -> type[BaseModel]:
    """A pydantic model (extra="forbid") mirroring the builder's signature and type annotations."""
    fn = MODELS.get(name)
    hints = typing.get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"architecture builder {name!r} must not take *args/**kwargs")
        default = ... if param.default is param.empty else param.default
        fields[pname] = (hints.get(pname, Any), default)
    return create_model(  # type: ignore[call-overload]
        f"{name}_kwargs", __config__=ConfigDict(extra="forbid", frozen=True), **fields
    )


def _takes_bool(annotation: Any) -> bool:
    """Whether a field annotation admits a bool (``bool``, ``Any``, or a union/alias containing one)."""
    if annotation is bool or annotation is Any:
        return True
    return any(_takes_bool(a) for a in typing.get_args(annotation))


def _refuse_bools(name: str, schema: type[BaseModel], kwargs: dict[str, Any]) -> None:
    """ConfigError for ``true``/``false`` given to a size or other non-bool argument (pydantic's lax mode would
    read ``"width": true`` as 1)."""
    for key, value in kwargs.items():
        if isinstance(value, bool) and not _takes_bool(schema.model_fields[key].annotation):
            raise ConfigError(f"invalid kwargs for architecture {name!r}: {key}: expected "
                              f"{schema.model_fields[key].annotation}, got the bool {value!r}")


def validate_model_kwargs(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Validate ``kwargs`` for architecture ``name``; return all arguments (defaults filled in), JSON-ready.

    Lists are accepted where tuples are expected (so kwargs read back from ``config.json`` validate).
    Options whose default is ``None`` and that are left at ``None`` (e.g. ``asymmetric``) are omitted, so
    configs of models without an optional feature look exactly as before the feature existed.

    Raises:
        ConfigError: unknown architecture (lists the valid ones), unknown kwarg (names it and lists the valid
            ones, with a close-match hint), missing required kwarg, or a value of the wrong type/range (sizes above
            :data:`~modeconn.models._validation.MAX_SIZE` included).
    """
    schema = _kwargs_schema(name)
    valid = list(schema.model_fields)
    unknown = [k for k in kwargs if k not in schema.model_fields]
    if unknown:
        raise unknown_names_error(f"architecture {name!r}", unknown, valid)
    _refuse_bools(name, schema, kwargs)
    try:
        validated = schema(**kwargs)
    except ValidationError as err:
        raise validation_error_to_config_error(err, f"kwargs for architecture {name!r}", valid) from None
    dumped = validated.model_dump(mode="json")
    check_size_bounds(f"kwargs for architecture {name!r}", dumped)
    return {
        k: v for k, v in dumped.items() if not (v is None and schema.model_fields[k].default is None)
    }


def build_model(name: str, *, seed: int | None = None, **kwargs: Any) -> nn.Module:
    """Build architecture ``name`` with ``kwargs`` (always ``in_shape=(C, H, W)`` and ``num_classes``).

    The model maps inputs of shape (N, C, H, W) to logits (N, num_classes), is on the CPU in fp32, and
    remembers its architecture name and the full validated kwargs (defaults included) in
    ``model.modeconn_config`` so :func:`model_config` / ``config.json`` can rebuild it exactly.

    Args:
        name: a registered architecture (``MODELS.names()``), e.g. "mlp", "vgg", "resnet20", "cnn".
        seed: if given, parameters are initialised with the CPU generator seeded to ``seed`` inside
            ``torch.random.fork_rng`` so the caller's global RNG state is left untouched (parameters are
            created on the CPU, so only the CPU generator is seeded); the same seed
            gives identical weights. ``None`` uses (and advances) the global RNG as PyTorch does.
        **kwargs: architecture options, validated against the builder's signature before anything is built.

    Raises:
        ConfigError: unknown architecture or kwarg (both listed with the valid choices), bad kwarg value, sizes
            beyond the sanity bounds (a number above ``MAX_SIZE``; more than ``MAX_PARAMETERS`` parameters or
            ``MAX_MODULES`` submodules, counted while the model is first built on the meta device).
    """
    builder = MODELS.get(name)
    resolved = validate_model_kwargs(name, kwargs)
    # Build from the validated python values (tuples, ints) rather than the JSON form.
    call_kwargs = dict(_kwargs_schema(name)(**resolved))
    what = f"kwargs for architecture {name!r}"
    if torch.get_default_device().type != "meta":
        # sizes first, on the meta device (nothing allocated, the caller's RNG untouched): a malformed config fails
        # here in milliseconds with a ConfigError instead of exhausting memory or time
        with torch.random.fork_rng(devices=[]), torch.device("meta"), parameter_budget(what, resolved):
            builder(**call_kwargs)
    with parameter_budget(what, resolved):
        model = _build(builder, call_kwargs, seed)
    setattr(model, CONFIG_ATTR, {"architecture": name, "kwargs": resolved})
    return model


def _build(builder: Builder, call_kwargs: dict[str, Any], seed: int | None) -> nn.Module:
    if seed is None:
        model = builder(**call_kwargs)
    else:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"build_model: seed must be an int or None, got {seed!r}")
        with torch.random.fork_rng(devices=[]):
            # only the CPU generator: torch.manual_seed would also reseed (and disturb) every CUDA generator
            try:
                torch.default_generator.manual_seed(seed)
            except (ValueError, RuntimeError) as err:
                raise ConfigError(f"build_model: invalid seed {seed!r}: {err}") from None
            model = builder(**call_kwargs)
    return model


def model_config(model: nn.Module) -> dict[str, Any]:
    """``{"architecture": name, "kwargs": {...}}`` of a model built by :func:`build_model` (a deep copy).

    ``build_model(cfg["architecture"], **cfg["kwargs"])`` rebuilds the same architecture; with the same
    ``seed`` it also gives the same initial weights. Values are JSON-ready (tuples stored as lists).

    Raises:
        ConfigError: ``model`` was not built by :func:`build_model` (it has no ``modeconn_config``).
    """
    cfg = getattr(model, CONFIG_ATTR, None)
    if not isinstance(cfg, dict) or "architecture" not in cfg or "kwargs" not in cfg:
        raise ConfigError(
            f"{type(model).__name__} has no {CONFIG_ATTR!r} attribute: build it with "
            "modeconn.models.build_model(name, **kwargs) so it can be saved and rebuilt from config"
        )
    return copy.deepcopy(cfg)
