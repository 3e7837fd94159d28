"""Every registry as Markdown, read from the registries themselves: the back-end of ``modeconn list`` and of the
docs' generated registry reference (``docs/gen_reference.py``), so both always show what is registered.

:data:`LISTINGS` maps what ``modeconn list KIND`` accepts to the section it prints; :func:`settings` gives one
alignment or path method's settings (its config class's fields with their defaults and meanings).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

from ..registry import Registry, unknown_name


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("``", "`").replace("|", "\\|") if text not in (None, "") else "—"


def markdown_table(header: list[str], rows: list[list[object]]) -> list[str]:
    """A Markdown table (cells on one line each, pipes escaped, empty cells shown as a dash), then a blank line."""
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
    return markdown_table(["setting", "default", "meaning"], rows) if rows else ["(no settings)", ""]


def path_method_config(check) -> type | None:
    """The config class a path method's ``check`` validates with (held in its closure), if any."""
    from pydantic import BaseModel

    for cell in getattr(check, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, type) and issubclass(value, BaseModel):
            return value
    return None


# ------------------------------------------------------------------------------------------------------- sections
def alignment_methods() -> list[str]:
    from ..match.methods import ALIGNMENT_METHODS

    lines = ["## Alignment methods", "",
             ("`modeconn.match.methods.ALIGNMENT_METHODS` — `modeconn align --method`, `modeconn barrier --method`, "
              "`modeconn merge --align`; each method's settings: `modeconn list settings NAME`."), ""]
    return lines + markdown_table(["name", "what it does", "needs data", "streams", "command line"],
                          [[f"`{e.name}`", e.summary, "yes" if e.needs_data else "no", "yes" if e.streams else "no",
                            "yes" if e.command_line else "no"] for e in ALIGNMENT_METHODS.entries()])


def alignment_settings(name: str) -> list[str]:
    from ..match.methods import ALIGNMENT_METHODS

    e = ALIGNMENT_METHODS.get(name)
    return [f"### `{e.name}`", "", f"Paper: {_cell(e.paper)}.", "",
            f"Groups it solves: {', '.join(f'`{g}`' for g in e.supported_groups())}.", "",
            f"Settings (`{e.config.__name__}`), given as `-o key=value`:", ""] + settings_table(e.config)


def merge_rules() -> list[str]:
    from ..path.merge_rules import MERGE_RULES

    lines = ["## Merge rules", "", "`modeconn.path.merge_rules.MERGE_RULES` — `modeconn merge --rule`, `merge_method:` in a recipe.", ""]
    lines += markdown_table(["name", "what it does", "base model", "parameters (`--param`)", "needs"],
                    [[f"`{r.name}`", r.summary, r.base, ", ".join(r.params), r.requires or ""]
                     for r in MERGE_RULES.entries()])
    return lines + ["Sources:", ""] + [f"- `{r.name}`: {_cell(r.source)}" for r in MERGE_RULES.entries()] + [""]


def path_methods() -> list[str]:
    from ..path.methods import PATH_METHODS

    lines = ["## Path methods", "", ("`modeconn.path.methods.PATH_METHODS` — `modeconn path --method`; settings (`modeconn list settings "
              "NAME`) are given as `-o key=value` or the `options` mapping of `find_path`."), ""]
    return lines + markdown_table(["name", "what it does", "checkpoints and resumes"],
                          [[f"`{m.name}`", m.summary, "yes" if m.checkpoints else "no"] for m in PATH_METHODS.entries()])


def path_settings(name: str) -> list[str]:
    from ..path.methods import PATH_METHODS

    cfg = path_method_config(PATH_METHODS.get(name).check)
    if cfg is None:
        return [f"### `{name}`", "", "(no settings)", ""]
    return [f"### `{name}`", "", f"Settings (`{cfg.__name__}`), given as `-o key=value`:", ""] + settings_table(cfg)


def families() -> list[str]:
    from ..symmetry.hf.refused import REFUSED
    from ..symmetry.hf.registry import ADAPTERS

    lines = ["## Hugging Face families", "",
             ("`modeconn.symmetry.hf.registry.ADAPTERS`, keyed by `config.model_type`. A model type without an entry "
              "is tried against every registered layout and kept only if a random element of each group it grants "
              "keeps its outputs."), ""]
    lines += markdown_table(["model type", "model classes", "normalization absorption"],
                            [[f"`{a.family}`", ", ".join(a.classes), "yes" if a.absorb is None else f"no: {a.absorb}"]
                             for a in ADAPTERS.entries()])
    lines += ["", "### Refused with the reason", "",
              ("`modeconn.symmetry.hf.refused.REFUSED`: model types no layout can describe yet, refused before any "
               "layout is tried."), ""]
    return lines + markdown_table(["model type", "why"], [[f"`{t}`", why] for t, why in sorted(REFUSED.items())])


def experiments() -> list[str]:
    from ..experiments import EXPERIMENTS

    lines = ["## Experiments", "", "`modeconn.experiments.EXPERIMENTS` — `modeconn experiment NAME [--quick]`.", ""]
    return lines + markdown_table(["name", "what it measures", "sizes", "outputs"],
                          [[f"`{e.name}`", e.summary, ", ".join(e.sizes), ", ".join(e.outputs)]
                           for e in EXPERIMENTS.entries()])


def checkpoint_kinds() -> list[str]:
    from ..checkpoints import CHECKPOINT_KINDS

    lines = ["## Checkpoint kinds", "",
             ("`modeconn.checkpoints.CHECKPOINT_KINDS`, in detection order (the first kind whose `detect` accepts a "
              "directory's `config.json` opens it)."), ""]
    return lines + markdown_table(["name", "label", "streams", "in memory (every in-memory command)", "operations of its own"],
                          [[f"`{k.name}`", k.label, "yes" if k.streams else "no",
                            "yes" if getattr(k, "in_memory", False) else "no", ", ".join(sorted(k.operations))]
                           for k in CHECKPOINT_KINDS.values()])


def capabilities() -> list[str]:
    from . import capabilities

    return ["## Commands × checkpoint kinds", "",
            ("`modeconn.recipes.capabilities`, read from the kinds' operations: what each command does on each kind, "
             "or why it refuses."), "", capabilities.markdown().strip(), ""]


def datasets() -> list[str]:
    from ..data.datasets import DATASETS
    from ..data.text import TEXT_DATASETS

    lines = ["## Datasets", "", ("`modeconn.data.datasets.DATASETS` (images) and `modeconn.data.text.TEXT_DATASETS` "
                                "— `--dataset NAME`; your own data is a `--dataset PATH` (docs: Data)."), ""]
    rows = [[f"`{d.name}`", "images", d.num_classes, "×".join(map(str, d.input_shape))] for d in DATASETS.entries()]
    rows += [[f"`{name}`", "text (next-token prediction)", "—", "—"] for name in TEXT_DATASETS]
    return lines + markdown_table(["name", "kind", "classes", "input (C×H×W)"], rows)


def architectures() -> list[str]:
    from ..models import MODELS

    lines = ["## Architectures", "", "`modeconn.models.MODELS` — `modeconn train --model NAME` (options: `-m key=value`).",
             ""]
    return lines + markdown_table(["name", "what it is"], [[f"`{name}`", _first_line(MODELS.get(name))]
                                                           for name in MODELS])


def _first_line(obj: object) -> str:
    return (inspect.getdoc(obj) or "").split("\n\n")[0]


def settings(name: str) -> list[str]:
    """The settings of the alignment method and/or path method called ``name``; ConfigError with a did-you-mean
    over both registries for an unknown name."""
    from ..match.methods import ALIGNMENT_METHODS
    from ..path.methods import PATH_METHODS

    if name not in ALIGNMENT_METHODS and name not in PATH_METHODS:
        raise unknown_name("method", name, {*ALIGNMENT_METHODS, *PATH_METHODS})
    out = alignment_settings(name) if name in ALIGNMENT_METHODS else []
    return out + (path_settings(name) if name in PATH_METHODS else [])


LISTINGS: Registry[Callable[[], list[str]]] = Registry("listing")
"""What ``modeconn list KIND`` prints, by KIND (``settings`` takes a method name: :func:`settings`)."""
for _kind, _section in {"methods": alignment_methods, "rules": merge_rules, "path-methods": path_methods,
                        "families": families, "kinds": checkpoint_kinds, "capabilities": capabilities,
                        "experiments": experiments, "datasets": datasets, "models": architectures,
                        "settings": settings}.items():
    LISTINGS.register(_kind)(_section)


def listing(kind: str, name: str | None = None) -> str:
    """``modeconn list KIND [NAME]`` as Markdown; ConfigError (with a did-you-mean) for an unknown kind or name, a
    missing method name for ``settings`` and a name given to any other kind."""
    from ..errors import ConfigError

    section = LISTINGS.get(kind)
    if (kind == "settings") != (name is not None):
        raise ConfigError("`modeconn list settings` takes a method name (modeconn list settings llpf)" if name is None
                          else f"`modeconn list {kind}` takes no name (a name goes with: modeconn list settings NAME)")
    return "\n".join(section(name) if name is not None else section())


def registries_page() -> str:
    """Markdown: every registry, entry by entry, every method's settings included (the docs' registry reference)."""
    from ..match.methods import ALIGNMENT_METHODS
    from ..path.methods import PATH_METHODS

    lines = ["# Registries", "",
             ("Generated at build time from the registries themselves: every name the command line and the API "
              "accept (`modeconn list KIND` prints each section in a terminal). Each section names the registry "
              "object, so `REGISTRY.get(name)` in Python gives the entry (a typo raises `ConfigError` with a \"did "
              "you mean\"). How to add an entry: [Extending modeconn](../extending/index.md)."), ""]
    lines += alignment_methods() + [line for e in ALIGNMENT_METHODS.entries() for line in alignment_settings(e.name)]
    lines += merge_rules() + path_methods()
    lines += [line for m in PATH_METHODS.entries() if path_method_config(m.check) for line in path_settings(m.name)]
    for section in (families, datasets, architectures, experiments, checkpoint_kinds, capabilities):
        lines += section()
    return "\n".join(lines) + "\n"
