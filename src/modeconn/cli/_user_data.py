"""The options of the user's own data (``--split``, ``--text-field``, ``--label-field``, ``--context-length``), declared
once: :func:`reads_user_data` adds them to a command that takes ``--dataset`` and runs the command with them set
(:func:`modeconn.data.user_data_options`), so no command repeats them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer

SPLIT_HELP = "your data: the held-out split or file (default: test/, val/ or 10%)"
TEXT_FIELD_HELP = "your text's field (default text)"
LABEL_FIELD_HELP = "your texts' label field (default label)"
CONTEXT_LENGTH_HELP = "your text corpus: tokens per block (default ≤ 128)"

OPTIONS: dict[str, tuple[str, Callable[[], Any]]] = {
    "split": ("str | None", lambda: typer.Option(None, "--split", help=SPLIT_HELP)),
    "text_field": ("str", lambda: typer.Option("text", "--text-field", help=TEXT_FIELD_HELP, show_default=False)),
    "label_field": ("str", lambda: typer.Option("label", "--label-field", help=LABEL_FIELD_HELP, show_default=False)),
    "context_length": ("int | None", lambda: typer.Option(None, "--context-length", min=1, help=CONTEXT_LENGTH_HELP)),
}
"""Parameter name → (annotation, the typer option)."""


@contextmanager
def user_data(dataset: str | None, seed: int | None, **given: Any) -> Iterator[None]:
    """Read the user's data (a ``--dataset`` path) with the options ``given`` (:data:`OPTIONS`' names) inside the
    block; ConfigError for options of the user's data given with a registered dataset name or none."""
    from ..data import UserDataOptions, user_data_options, user_data_path
    from ..errors import ConfigError

    options = UserDataOptions(**given, seed=seed or 0)
    if options.given() and user_data_path(dataset) is None:
        named = f"--dataset {dataset!r} is not a path" if dataset else "no --dataset is given"
        raise ConfigError(f"{', '.join(options.given())} apply to your own data (--dataset PATH); {named}")
    with user_data_options(options):
        yield


def reads_user_data(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` (taking ``dataset`` and ``seed``) with the :data:`OPTIONS` of the user's data added after its own;
    it runs inside :func:`user_data` with them (a refusal exits with status 2 before the command starts)."""
    from ._app import errors_exit

    signature = inspect.signature(command)
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option(), annotation=annotation)
             for name, (annotation, option) in OPTIONS.items()]

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in OPTIONS}
        with errors_exit(), user_data(kwargs.get("dataset"), kwargs.get("seed"), **given):
            return command(*args, **kwargs)

    run.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *extra])
    run.__annotations__ = {**command.__annotations__, **{name: ann for name, (ann, _) in OPTIONS.items()}}
    return run
