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
import inspect
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
def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("``", "`").replace("|", "\\|") if text not in (None, "") else "—"


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out + [""]


def attribute_docs(cls: type) -> dict[str, str]:
    """``{field: text}`` from a Google-style ``Attributes:`` section of ``cls``'s docstring."""
    doc = inspect.getdoc(cls) or ""
    if "Attributes:" not in doc:
        return {}
    out: dict[str, str] = {}
    current = None
    for line in doc.split("Attributes:", 1)[1].splitlines():
        m = re.match(r"^    ([\w, ]+):\s*(.*)$", line)
        if m:
            names = [n.strip() for n in m.group(1).split(",")]
            for n in names:
                out[n] = m.group(2)
            current = names
        elif line.startswith("        ") and current:
            for n in current:
                out[n] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            break
    return out


def settings_table(cls: type) -> list[str]:
    """A config class's fields: name, default, description (from its ``Attributes:``)."""
    docs = attribute_docs(cls)
    rows = []
    for name, field in cls.model_fields.items():
        default = "required" if field.is_required() else repr(field.default)
        rows.append([f"`{name}`", f"`{default}`", docs.get(name, field.description or "")])
    return _table(["setting", "default", "meaning"], rows) if rows else ["(no settings)", ""]


def _config_of(check) -> type | None:
    """The config class a path method's ``check`` validates with (held in its closure), if any."""
    from pydantic import BaseModel

    for cell in getattr(check, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, type) and issubclass(value, BaseModel):
            return value
    return None


def registries_page() -> str:
    """Markdown: every registry, entry by entry."""
    lines = ["# Registries", "",
             "Generated at build time from the registries themselves: every name the command line and the API",
             "accept. Each section names the registry object, so `REGISTRY.get(name)` in Python gives the entry",
             "(a typo raises `ConfigError` with a \"did you mean\"). How to add an entry:",
             "[Extending modeconn](../extending/index.md).", ""]
    for section in (_alignment, _merge_rules, _path_methods, _families, _experiments, _checkpoint_kinds, _capabilities):
        lines += section()
    return "\n".join(lines) + "\n"


def _alignment() -> list[str]:
    from modeconn.match.methods import ALIGNMENT_METHODS

    entries = ALIGNMENT_METHODS.entries()
    lines = ["## Alignment methods", "", "`modeconn.match.methods.ALIGNMENT_METHODS` — `modeconn align --method`,",
             "`modeconn barrier --method`, `modeconn merge --align`.", ""]
    lines += _table(["name", "what it does", "needs data", "streams", "command line"],
                    [[f"`{e.name}`", e.summary, "yes" if e.needs_data else "no", "yes" if e.streams else "no",
                      "yes" if e.command_line else "no"] for e in entries])
    for e in entries:
        lines += [f"### `{e.name}`", "", f"Paper: {_cell(e.paper)}.", "",
                  f"Groups it solves: {', '.join(f'`{g}`' for g in e.supported_groups())}.", "",
                  f"Settings (`{e.config.__name__}`):", ""] + settings_table(e.config)
    return lines


def _merge_rules() -> list[str]:
    from modeconn.path.merge_rules import MERGE_RULES

    lines = ["## Merge rules", "", "`modeconn.path.merge_rules.MERGE_RULES` — `modeconn merge --rule`,",
             "`merge_method:` in a recipe.", ""]
    lines += _table(["name", "what it does", "base model", "parameters (`--param`)", "needs"],
                    [[f"`{r.name}`", r.summary, r.base, ", ".join(r.params), r.requires or ""]
                     for r in MERGE_RULES.entries()])
    return lines + ["Sources:", ""] + [f"- `{r.name}`: {_cell(r.source)}" for r in MERGE_RULES.entries()] + [""]


def _path_methods() -> list[str]:
    from modeconn.path.methods import PATH_METHODS

    lines = ["## Path methods", "", "`modeconn.path.methods.PATH_METHODS` — `modeconn path --method`; settings are",
             "given as `-o key=value` (command line) or the `options` mapping of `find_path`.", ""]
    lines += _table(["name", "what it does", "checkpoints and resumes"],
                    [[f"`{m.name}`", m.summary, "yes" if m.checkpoints else "no"] for m in PATH_METHODS.entries()])
    for m in PATH_METHODS.entries():
        cfg = _config_of(m.check)
        if cfg is not None:
            lines += [f"### `{m.name}`", "", f"Settings (`{cfg.__name__}`), given as `-o key=value`:", ""] + settings_table(cfg)
    return lines


def _families() -> list[str]:
    from modeconn.symmetry.hf.registry import ADAPTERS

    lines = ["## Hugging Face families", "", "`modeconn.symmetry.hf.registry.ADAPTERS`, keyed by `config.model_type`.",
             "A model type without an entry is tried against every registered layout and kept only if a random",
             "element of the group keeps its outputs.", ""]
    from modeconn.symmetry.hf.refused import REFUSED

    lines += _table(["model type", "model classes", "normalization absorption"],
                    [[f"`{a.family}`", ", ".join(a.classes), "yes" if a.absorb is None else f"no: {a.absorb}"]
                     for a in ADAPTERS.entries()])
    lines += ["", "### Refused with the reason", "", "`modeconn.symmetry.hf.refused.REFUSED`: model types no layout can",
              "describe yet, refused before any layout is tried.", ""]
    return lines + _table(["model type", "why"], [[f"`{t}`", why] for t, why in sorted(REFUSED.items())])


def _experiments() -> list[str]:
    from modeconn.experiments import EXPERIMENTS

    lines = ["## Experiments", "", "`modeconn.experiments.EXPERIMENTS` — `modeconn experiment NAME [--quick]`.", ""]
    return lines + _table(["name", "what it measures", "sizes", "outputs"],
                          [[f"`{e.name}`", e.doc.split("\n\n")[0], ", ".join(e.sizes), ", ".join(e.outputs)]
                           for e in EXPERIMENTS.entries()])


def _checkpoint_kinds() -> list[str]:
    from modeconn.checkpoints import CHECKPOINT_KINDS

    lines = ["## Checkpoint kinds", "", "`modeconn.checkpoints.CHECKPOINT_KINDS`, in detection order (the first kind",
             "whose `detect` accepts a directory's `config.json` opens it).", ""]
    return lines + _table(["name", "label", "streams", "in memory (every in-memory command)", "operations of its own"],
                          [[f"`{k.name}`", k.label, "yes" if k.streams else "no",
                            "yes" if getattr(k, "in_memory", False) else "no", ", ".join(sorted(k.operations))]
                           for k in CHECKPOINT_KINDS.values()])


def _capabilities() -> list[str]:
    from modeconn.recipes import capabilities

    return ["## Commands × checkpoint kinds", "",
            "`modeconn.recipes.capabilities`, read from the kinds' operations: what each command does on each kind, or",
            "why it refuses.", "", capabilities.markdown().strip(), ""]


# ------------------------------------------------------------------------------------------------ example scripts
def example_page(script: Path) -> str:
    """A page for one of ``examples/tutorial_*.py`` (run by ``tests/test_tutorials.py``): its docstring, then its code."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    title, _, rest = doc.partition("\n")
    return (f"# {title.removeprefix('Tutorial: ').strip()}\n\n{rest.strip()}\n\n"
            f"The script, `examples/{script.name}` (the test suite runs it at its quick size):\n\n"
            f"```python\n{script.read_text()}```\n")


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
    md = _table(["rank", "packages / modules", "what"], [[r[0], r[1].replace("``", "`"), r[2].replace("``", "`")]
                                                       for r in rows])
    return "\n".join(md)


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
