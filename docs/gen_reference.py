"""mkdocs hook: the pages that are generated rather than written, built afresh on every ``mkdocs build``.

- ``reference/cli.md``: every command's ``--help``, as the command prints it (typer/click introspection);
- ``reference/registries.md``: every registry entry (alignment methods with their settings, merge rules, path methods
  with their settings, Hugging Face families, experiments, checkpoint kinds), read from the registries themselves;
- ``architecture-layers.md`` is not a page: the layer table of ``tests/test_layering.py`` (the table that test holds
  the imports to) is spliced into ``architecture.md`` where it says ``{{ layer_table }}``;
- ``tutorials/*.md`` for ``examples/tutorial_*.py`` (run by ``tests/test_tutorials.py``): docstring and code;
- ``changelog.md``: the repository's ``CHANGELOG.md`` (its ``docs/`` links made relative to the site).

So a new command, option, registry entry or layer shows up in the site without editing a page.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER_MARK = "{{ layer_table }}"


# ------------------------------------------------------------------------------------------------ CLI reference
def cli_page(columns: int = 80) -> str:
    """Markdown: one section per command with its ``--help`` at ``columns`` columns."""
    import typer.main

    from modeconn.cli import app

    group = typer.main.get_command(app)
    lines = ["# Command-line reference", "",
             "Generated at build time from the commands' own `--help` (so it is always the installed version's).",
             "Every command also prints this with `modeconn COMMAND --help`.", ""]
    lines += _help_section("modeconn", [], app, columns)
    for name in sorted(group.commands):
        lines += _help_section(f"modeconn {name}", [name], app, columns)
    return "\n".join(lines) + "\n"


def _help_section(title: str, argv: list[str], app, columns: int) -> list[str]:
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, [*argv, "--help"], prog_name="modeconn",
                             env={"COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "dumb"})
    text = "\n".join(line.rstrip() for line in res.output.strip("\n").splitlines()).replace("```", "'''")
    return [f"## `{title}`", "", "```text", text, "```", ""]


# ------------------------------------------------------------------------------------------- registry reference
def registries_page() -> str:
    """Markdown: every registry, entry by entry (the sections ``modeconn list`` prints, from the same code)."""
    from modeconn.recipes.registries import registries_page as page

    return page()


# ------------------------------------------------------------------------------------------------ example scripts
def example_page(script: Path) -> str:
    """A page for one of ``examples/tutorial_*.py`` (run by ``tests/test_tutorials.py``): its docstring, then its code."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    title, _, rest = doc.partition("\n")
    helpers = script.parent / "cli_helpers.py"
    return (f"# {title.removeprefix('Tutorial: ').strip()}\n\n{rest.strip()}\n\n"
            f"The script, `examples/{script.name}` (the test suite runs it at its quick size):\n\n"
            f"```python\n{script.read_text()}```\n\n"
            f"The helpers it imports, `examples/{helpers.name}`:\n\n```python\n{helpers.read_text()}```\n")


def example_scripts() -> dict[str, Path]:
    return {f"tutorials/{p.stem.removeprefix('tutorial_').replace('_', '-')}.md": p
            for p in sorted((ROOT / "examples").glob("tutorial_*.py"))}


# ------------------------------------------------------------------------------------------------ architecture
def layer_table() -> str:
    """The layer table of ``tests/test_layering.py``'s docstring as a markdown table."""
    doc = ast.get_docstring(ast.parse((ROOT / "tests" / "test_layering.py").read_text()))
    rows: list[list[str]] = []
    for line in doc.split("====\n", 2)[2].splitlines():  # after the header rule
        if line.startswith("====") or not line.strip():
            continue
        rank, rest = line[:6].strip(), line[6:]
        names, what = (re.split(r"\s{2,}", rest.strip(), maxsplit=1) + [""])[:2]
        if rank:
            rows.append([rank, names, what])
        elif rest.startswith(" "):
            rows[-1][2] += " " + rest.strip()
        else:
            rows[-1][1] += " " + names
            rows[-1][2] += " " + what
    from modeconn.recipes.registries import markdown_table

    return "\n".join(markdown_table(["rank", "packages / modules", "what"],
                                    [[r[0], r[1].replace("``", "`"), r[2].replace("``", "`")] for r in rows]))


# ------------------------------------------------------------------------------------------------ mkdocs hooks
GENERATED = {"reference/cli.md": cli_page, "reference/registries.md": registries_page,
             "changelog.md": lambda: (ROOT / "CHANGELOG.md").read_text().replace("](docs/", "](")}


def on_files(files, config):
    from mkdocs.structure.files import File

    for uri, make in GENERATED.items():
        files.append(File.generated(config, uri, content=make()))
    for uri, script in example_scripts().items():
        files.append(File.generated(config, uri, content=example_page(script)))
    return files


def on_page_markdown(markdown, page, config, files):
    if LAYER_MARK in markdown:
        markdown = markdown.replace(LAYER_MARK, layer_table())
    return markdown


SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|data|mod|meth|attr|exc|obj|const|ref):<code>(~?)([^<]*)</code>")


def on_page_content(html, page, config, files):
    """Docstrings cite with Sphinx roles (``:func:`~modeconn.x.f```); the API and reference pages show the name in
    code font."""
    return SPHINX_ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>",
                           html)
