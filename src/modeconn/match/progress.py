"""The one progress protocol of the alignment methods: ``progress(stage, done, total, **metrics)``.

``stage`` names what is running (``"run 1/4 sweep 2"``, ``"dual matching"``), ``done`` of ``total`` units are
finished (``total`` None when unknown) and ``metrics`` carry the numbers of the moment (``loss=`` per step of a
learned method, ``lam=`` its λ). Metrics are passed only to callbacks that take ``**metrics``; a callback with the
three positional parameters alone is called without them. Learned and dual matching used to call
``progress(step, steps, loss)``: a callback without ``**metrics`` passed to them is still called that way, with a
DeprecationWarning.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any, Protocol


class ProgressFn(Protocol):
    def __call__(self, stage: str, done: int, total: int | None, **metrics: Any) -> None: ...


Legacy = Callable[[Callable[..., Any], str, int, "int | None", dict[str, Any]], None]


def takes_metrics(fn: Callable[..., Any]) -> bool:
    """True if ``fn`` accepts arbitrary keyword arguments (``**metrics``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _silent(stage: str, done: int, total: int | None, **metrics: Any) -> None:
    """The reporter when no callback is given."""


def reporter(progress: Callable[..., Any] | None, legacy: Legacy | None = None, *, what: str = "") -> ProgressFn:
    """A ``(stage, done, total, **metrics)`` function calling ``progress`` the way it accepts.

    ``progress`` None: a no-op. Taking ``**metrics``: called as is. Otherwise: ``legacy(progress, stage, done,
    total, metrics)`` when given (after a DeprecationWarning naming ``what``), else ``progress(stage, done, total)``.
    """
    if progress is None:
        return _silent
    if takes_metrics(progress):
        return progress
    if legacy is None:
        return lambda stage, done, total, **metrics: progress(stage, done, total)
    warnings.warn(f"{what}: progress(step, steps, loss) callbacks are deprecated; take (stage, done, total, **metrics) "
                  "instead (the loss arrives as metrics['loss'])", DeprecationWarning, stacklevel=3)
    return lambda stage, done, total, **metrics: legacy(progress, stage, done, total, metrics)


def step_loss_legacy(fn: Callable[..., Any], stage: str, done: int, total: int | None, metrics: dict[str, Any]) -> None:
    """The former call of learned / dual matching: ``fn(step, steps, loss)``."""
    fn(done, total, metrics.get("loss"))
