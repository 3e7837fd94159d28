"""The ``modeconn`` command line (typer): one module per command; a command parses its options, calls one recipe
and prints. Every command prints where its outputs went."""

from . import align, barrier, check, demo, evaluate, experiment, fuse, listing, merge, moe, path, sweep, train  # noqa: F401  (register the commands)
from ._app import app, console

__all__ = ["app", "console", "main"]


def main() -> None:  # pragma: no cover - entry point
    app()
