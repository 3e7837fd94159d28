"""Every command's ``--help`` as a user sees it in an 80-column terminal (typer's rich rendering): at most 80 lines,
no line wider than 80 columns, no word of the command's or an option's text cut ("…") or swallowed by rich markup
(``'modeconn[mergekit]'`` stays), no internal reference (issue numbers, "seed 001"). The check fails on a deliberately
long, cut or marked-up help (negative control)."""

from __future__ import annotations

import re

import pytest
import typer
import typer.main
from test_docs import ISSUE_REFS
from typer.testing import CliRunner

from modeconn.cli import app
from modeconn.cli._help import Command

COLUMNS = 80
MAX_LINES = 80
BOX = re.compile(r"[│╭╮╰╯─]")


def commands(group) -> list[tuple[list[str], object]]:
    """``(argv, command)`` for the group and every command and sub-command under it."""
    out = [([], group)]
    for name, cmd in sorted(getattr(group, "commands", {}).items()):
        out += [([name, *argv], sub) for argv, sub in commands(cmd)]
    return out


def render(typer_app: typer.Typer, argv: list[str]) -> str:
    res = CliRunner().invoke(typer_app, [*argv, "--help"], prog_name="modeconn",
                             env={"COLUMNS": str(COLUMNS), "NO_COLOR": "1", "TERM": "dumb"})
    assert res.exit_code == 0, res.output
    return res.output


def expected_texts(cmd) -> list[str]:
    """The texts a command's help must show in full: its own and each parameter's (live ones as shown now), as
    written (a ``\\[`` is how a literal bracket is written for rich)."""
    live = getattr(cmd, "live", {})
    texts = [cmd.help or ""] + [live[p.name]() if p.name in live else p.help or "" for p in cmd.params
                                if not getattr(p, "hidden", False)]
    return [t.replace("\\[", "[") for t in texts if t]


def help_problems(output: str, texts: list[str]) -> list[str]:
    """What is wrong with a rendered help: too many lines, a line too wide, a word of ``texts`` missing from the
    output in order (cut with "…" or swallowed as markup), an internal reference."""
    lines = output.rstrip("\n").splitlines()
    problems = [f"{len(lines)} lines (most {MAX_LINES})"] if len(lines) > MAX_LINES else []
    problems += [f"line {i + 1} is {len(line)} wide: {line!r}" for i, line in enumerate(lines) if len(line) > COLUMNS]
    shown = BOX.sub(" ", output).split()
    for text in texts:
        at = 0
        for word in text.split():
            try:
                at = shown.index(word, at) + 1
            except ValueError:
                problems.append(f"{word!r} of {text[:60]!r}… is not shown (cut or taken as markup)")
                break
    problems += [f"internal reference {m!r}" for m in ISSUE_REFS.findall(output)]
    return problems


GROUP = typer.main.get_command(app)
ALL = commands(GROUP)


def test_every_command_is_checked():
    names = {" ".join(argv) for argv, _ in ALL}
    assert {"", "align", "merge", "barrier", "path", "check", "eval", "train", "sweep", "experiment", "demo",
            "list"} <= names
    assert all(isinstance(cmd, Command) for argv, cmd in ALL if argv)  # every command renders its help compactly


@pytest.mark.parametrize("argv,cmd", ALL, ids=[" ".join(a) or "modeconn" for a, _ in ALL])
def test_help_fits_80_columns_whole(argv, cmd):
    output = render(app, argv)
    assert help_problems(output, expected_texts(cmd)) == []


def test_pip_extras_keep_their_brackets():
    assert "'modeconn[mergekit]'" in render(app, ["merge"]) and "'modeconn[eval]'" in render(app, ["eval"])


def test_long_lists_are_one_command_away():
    for argv, listing in ((["align"], "modeconn list methods"), (["merge"], "modeconn list rules"),
                          (["path"], "modeconn list path-methods"), (["path"], "modeconn list settings"),
                          (["experiment"], "modeconn list experiments")):
        assert listing in " ".join(BOX.sub(" ", render(app, argv)).split()), (argv, listing)


def _bad_app() -> typer.Typer:
    bad = typer.Typer(add_completion=False)

    @bad.command(cls=Command, help="A command with a help far too long.\n\n" + "\n\n".join(
        f"Paragraph {i} of many." for i in range(60)))
    def long(x: int = typer.Option(0, help="a setting")) -> None:
        pass

    @bad.command(cls=Command)
    def cut(out: str = typer.Option("", help="set -o restart_init=" + "x" * 90 + " and more"),
            extra: str = typer.Option("", help="pip install 'modeconn[mergekit]' (unescaped: rich takes it)")) -> None:
        """A command whose texts are cut and swallowed."""

    @bad.command(cls=Command)
    def internal() -> None:
        """Fixed in issue #22 (seed 001)."""

    return bad


@pytest.mark.parametrize("name,problem", [("long", "lines (most 80)"), ("cut", "restart_init="),
                                          ("cut", "'modeconn[mergekit]'"), ("internal", "internal reference")])
def test_the_check_fails_on_a_bad_help(name, problem):
    """Negative control: a help too long, a word cut with "…", a bracket taken as markup, an issue number."""
    bad = _bad_app()
    cmd = typer.main.get_command(bad).commands[name]
    problems = help_problems(render(bad, [name]), expected_texts(cmd))
    assert any(problem in p for p in problems), problems
