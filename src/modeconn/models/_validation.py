"""Turn pydantic validation failures and unknown keyword arguments into :class:`ConfigError` messages; bound sizes.

Used for architecture kwargs (:func:`modeconn.models.build_model`) and for
:class:`modeconn.train.TrainConfig`, so every typo is reported the same way: the offending name, the
valid names and, where one is close, a "did you mean" hint. Sizes from untrusted configs are bounded twice:
every number of a size argument (:func:`check_size_bounds`) and the parameter/module count registered while the
model is built on the meta device (:func:`parameter_budget`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigError


def unknown_names_error(
    what: str, unknown: Iterable[str], valid: Iterable[str], noun: str = "argument"
) -> ConfigError:
    """A ConfigError naming the ``unknown`` keys of ``what`` and listing the ``valid`` ones."""
    valid = sorted(valid)
    unknown = sorted(unknown)
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1)
        if close:
            hints.append(f"{name!r} → did you mean {close[0]!r}?")
    msg = (
        f"unknown {noun}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for {what}; "
        f"valid {noun}s: {', '.join(valid)}"
    )
    if hints:
        msg += " (" + "; ".join(hints) + ")"
    return ConfigError(msg)


def validation_error_to_config_error(
    err: ValidationError, what: str, valid: Iterable[str] = (), noun: str = "argument"
) -> ConfigError:
    """A ConfigError listing every failing field of ``err`` with its message and the rejected value.

    Extra (unknown) fields are reported with the ``valid`` names and a close-match hint.
    """
    valid = list(valid)
    unknown = [str(e["loc"][0]) for e in err.errors() if e["type"] == "extra_forbidden" and e["loc"]]
    if unknown:
        return unknown_names_error(what, unknown, valid, noun)
    parts: list[str] = []
    seen: set[tuple[str, str]] = set()
    for e in err.errors():
        loc = list(e["loc"])
        if e["type"] == "missing" and len(loc) == 1:
            key, text = str(loc[0]), "missing required argument"
        else:
            # keep field names and indices; drop pydantic's union-branch tags such as "tuple[int, ...]"
            kept = [str(p) for i, p in enumerate(loc) if i == 0 or isinstance(p, int)]
            key = ".".join(kept) or "<root>"
            shown = e.get("input")
            text = f"{e['msg']} (got {shown!r})"
        if (key, text) not in seen:
            seen.add((key, text))
            parts.append(f"{key}: {text}")
    return ConfigError(f"invalid {what}: " + "; ".join(parts))


# ------------------------------------------------------------------------------------------------ size bounds
MAX_SIZE = 2**24
"""Largest number a size argument (width, depth, channels, heads, vocabulary … or an entry of a tuple of them) may
hold: 16,777,216. Larger values come from malformed configs (``"width": 1e12``), not from real models."""

MAX_PARAMETERS = 10**10
"""Largest parameter (plus buffer) count :func:`modeconn.models.build_model` builds: ten billion (40 GB in fp32)."""

MAX_MODULES = 2048
"""Largest number of submodules a model may register: bounds the time a huge depth takes to be refused (building on
the meta device costs about 0.3 ms per module: every torch call goes through the device mode). modeconn's
architectures have tens to a few hundred (ResNet-20: 70; a 12-layer ViT: about 150)."""

MAX_TENSORS = 2 * MAX_MODULES
"""Largest number of parameters and buffers (tensors, not elements) a model may register: a builder that creates
all its layers before registering them as submodules is stopped by this count."""


def _numbers(value: Any) -> Iterator[float]:
    """Every int/float in ``value`` and in nested lists/tuples (not in dicts: option objects such as ``asymmetric``
    carry seeds, not sizes); bools are not numbers here."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _numbers(v)


def check_size_bounds(what: str, kwargs: Mapping[str, Any]) -> None:
    """ConfigError naming the argument when a number in it (or in its tuple) exceeds :data:`MAX_SIZE` or is not
    finite, checked before anything is built."""
    for key, value in kwargs.items():
        for x in _numbers(value):
            if not math.isfinite(x) or x > MAX_SIZE:
                raise ConfigError(f"invalid {what}: {key}={value!r} is beyond the size bound {MAX_SIZE} "
                                  "(a malformed config?)")


def _sizes(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if any(True for _ in _numbers(v)))


@contextmanager
def parameter_budget(what: str, kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Count the parameters, buffers and submodules registered while the block builds a model; ConfigError (naming
    the size arguments) as soon as they exceed :data:`MAX_PARAMETERS` / :data:`MAX_TENSORS` / :data:`MAX_MODULES`, and for an error torch
    raises on impossible sizes (an overflowing tensor size). Meant around a build on the meta device, where it costs
    microseconds per module and allocates nothing: the general rule that bounds every architecture's size."""
    from torch.nn.modules import module as module_mod

    count = {"elements": 0, "modules": 0, "tensors": 0}

    def on_tensor(_module, _name, tensor):
        if tensor is not None:
            count["elements"] += tensor.numel()
            count["tensors"] += 1
            if count["tensors"] > MAX_TENSORS:
                raise ConfigError(f"invalid {what}: the model would have more than {MAX_TENSORS} parameter and buffer "
                                  f"tensors (the sanity bound; {_sizes(kwargs)})")
            if count["elements"] > MAX_PARAMETERS:
                raise ConfigError(f"invalid {what}: the model would have more than {MAX_PARAMETERS:.0e} parameters "
                                  f"(the sanity bound; {_sizes(kwargs)})")

    def on_module(_module, _name, _sub):
        count["modules"] += 1
        if count["modules"] > MAX_MODULES:
            raise ConfigError(f"invalid {what}: the model would have more than {MAX_MODULES} submodules "
                              f"(the sanity bound; {_sizes(kwargs)})")

    handles = [module_mod.register_module_parameter_registration_hook(on_tensor),
               module_mod.register_module_buffer_registration_hook(on_tensor),
               module_mod.register_module_module_registration_hook(on_module)]
    try:
        yield
    except ConfigError:
        raise
    except (RuntimeError, OverflowError) as err:
        raise ConfigError(f"invalid {what}: these sizes do not give a model ({_sizes(kwargs)}): {err}") from None
    finally:
        for h in handles:
            h.remove()
