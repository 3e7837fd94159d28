"""How every command's ``--help`` is rendered: typer's rich help made to fit an 80-column terminal — the docstring's
paragraphs re-wrapped at the terminal's width, short metavars (INT, PATH …), a flag's off switch named in its text
rather than a column of its own — and help texts that name a registry's entries read when help is shown."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption


def _metavar(param: TyperOption) -> str:
    """A short metavar: INT, FLOAT, PATH or TEXT."""
    kind = param.type_descriptor
    element = kind.annotation
    if kind.is_list:
        element = typing.get_args(element)[0]
    return "PATH" if kind.is_path else {int: "INT", float: "FLOAT"}.get(element, "TEXT")


def unwrapped(text: str | None) -> str | None:
    """A docstring's paragraphs each on one line, so the help renderer wraps them at the terminal's width instead of
    keeping the source's line breaks (ragged lines)."""
    if text is None:
        return None
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


class Command(TyperCommand):
    """Every command's class: its help is the docstring's paragraphs re-wrapped at the terminal's width, with short
    metavars (INT, PATH …) so that the option texts keep most of an 80-column line; options named in :attr:`live`
    get their help text from ``live[name]()`` each time help is shown (texts naming a registry's entries name those
    registered by then, not at import), and :attr:`live_epilog` gives the text shown under the options (full-width
    lists such as the methods with their summaries)."""

    live: dict[str, Callable[[], str]] = {}
    live_epilog: Callable[[], str] | None = None

    def format_help(self, ctx, formatter) -> None:
        self.help = unwrapped(self.help)
        if self.live_epilog is not None:
            self.epilog = unwrapped(self.live_epilog())
        for param in self.params:
            if param.name in self.live:
                param.help = self.live[param.name]()
        _short_metavars(self.get_params(ctx))
        folded = {p: (p.secondary_opts, p.help) for p in self.params if getattr(p, "secondary_opts", None)}
        for param, (secondary, text) in folded.items():  # "--no-x" in the text, not in a column of its own
            param.secondary_opts, param.help = [], f"{text or ''} (off: {', '.join(secondary)})".strip()
        try:
            super().format_help(ctx, formatter)
        finally:
            for param, (secondary, text) in folded.items():
                param.secondary_opts, param.help = secondary, text


class Group(TyperGroup):
    """The app's group: its own options (--version, --help) with :class:`Command`'s short metavars."""

    def format_help(self, ctx, formatter) -> None:
        _short_metavars(self.get_params(ctx))
        super().format_help(ctx, formatter)


def _short_metavars(params) -> None:
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
        elif isinstance(param, TyperOption) and param.metavar is None:
            param.metavar = _metavar(param)


def live_help(epilog: Callable[[], str] | None = None, **helps: Callable[[], str]) -> type[Command]:
    """A :class:`Command` class whose options named in ``helps`` get their help text from ``helps[name]()`` and whose
    epilog (shown under the options) is ``epilog()``, each time help is shown."""
    return type("LiveHelpCommand", (Command,), {"live": helps, "live_epilog": staticmethod(epilog) if epilog else None})


class App(typer.Typer):
    """The typer app whose commands are :class:`Command` unless they name another class."""

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or Command, **kwargs)
