"""The one progress protocol of the alignment methods: ``progress(stage, done, total, **metrics)``.

``stage`` names what is running (``"run 1/4 sweep 2"``, ``"dual matching"``), ``done`` of ``total`` units are
finished (``total`` None when unknown) and ``metrics`` carry the numbers of the moment (``loss=`` per step of a
learned method, ``lam=`` its λ). Metrics are passed only to callbacks that take ``**metrics``; a callback with the
three positional parameters alone is called without them. Learned and dual matching used to call
``progress(step, steps, loss)``: a callback without ``**metrics`` passed to them is still called that way, with a
DeprecationWarning.

In the API ``progress=True`` (the default of the long phases, e.g. activation matching) draws a tqdm bar per stage
on stderr (:func:`tqdm_progress`; ``TQDM_DISABLE=1`` hides it); ``progress=False`` (or None) is silent.
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


def tqdm_progress(file: Any = None) -> ProgressFn:
    """A reporter drawing one tqdm bar per stage (on stderr, or ``file``), with the metrics as its postfix; a bar
    closes when its stage ends or the next stage begins."""
    from tqdm.auto import tqdm

    state: dict[str, Any] = {"bar": None, "stage": None}

    def update(stage: str, done: int, total: int | None = None, **metrics: Any) -> None:
        bar = state["bar"]
        if bar is None or state["stage"] != stage or done < bar.n:
            if bar is not None:
                bar.close()
            bar = state["bar"] = tqdm(total=total, desc=stage, leave=False, dynamic_ncols=True, file=file)
            state["stage"] = stage
        if metrics:
            bar.set_postfix(metrics, refresh=False)
        bar.update(done - bar.n)
        if total is not None and done >= total:
            bar.close()
            state["bar"] = None

    return update


def reporter(progress: Callable[..., Any] | bool | None, legacy: Legacy | None = None, *,
             what: str = "") -> ProgressFn:
    """A ``(stage, done, total, **metrics)`` function calling ``progress`` the way it accepts.

    ``progress`` None or False: a no-op. True: a tqdm bar per stage (:func:`tqdm_progress`). Taking ``**metrics``:
    called as is. Otherwise: ``legacy(progress, stage, done,
    total, metrics)`` when given (after a DeprecationWarning naming ``what``), else ``progress(stage, done, total)``.
    """
    if progress is None or progress is False:
        return _silent
    if progress is True:
        return tqdm_progress()
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
