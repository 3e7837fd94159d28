"""Every registry entry reaches the command line: each alignment method the command line offers, merge rule, path
method and experiment is named in its command's ``--help``, and each Hugging Face family in ``modeconn list families``
(the long list a help points to), all generated from the registries, so a new entry is one registration; and each hand
list beside a registry equals what the registry derives."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from modeconn.cli import app
from modeconn.diagnostics.compare import METHODS
from modeconn.experiments import EXPERIMENTS
from modeconn.match.methods import ALIGNMENT_METHODS, command_line_methods
from modeconn.path.merge_rules import MERGE_RULES
from modeconn.path.methods import PATH_METHODS
from modeconn.symmetry.hf.registry import ADAPTERS


def help_words(command: str) -> set[str]:
    res = CliRunner().invoke(app, command.split() if " " in command else [command, "--help"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    return set(re.findall(r"[\w-]+", res.output))


REGISTRIES = {
    "alignment methods (align)": ("align", lambda: [e.name for e in ALIGNMENT_METHODS.entries() if e.command_line]),
    "alignment methods (barrier)": ("barrier", lambda: list(METHODS)),
    "merge rules": ("merge", lambda: list(MERGE_RULES)),
    "path methods": ("path", lambda: list(PATH_METHODS)),
    "experiments": ("experiment", lambda: list(EXPERIMENTS)),
    "Hugging Face families": ("list families", lambda: list(ADAPTERS)),
}


@pytest.mark.parametrize("registry", list(REGISTRIES))
def test_every_entry_is_in_its_commands_help(registry):
    command, names = REGISTRIES[registry]
    words = help_words(command)
    assert [n for n in names() if n not in words] == []


def test_the_hand_lists_are_derived_from_the_alignment_registry():
    from modeconn.recipes.align import IN_MEMORY, LANGUAGE_MODEL
    from modeconn.recipes.merge_modeconn import ALIGN_CHOICES
    from modeconn.recipes.sweep import BarrierTask

    offered = [e for e in ALIGNMENT_METHODS.entries() if e.command_line]
    assert set(IN_MEMORY) == {e.name for e in offered if not e.needs_continuous}
    assert set(LANGUAGE_MODEL) == {e.name for e in offered if e.needs_continuous}
    assert set(ALIGN_CHOICES) == {*command_line_methods(learns=False), *command_line_methods(continuous=True), "none"}
    assert set(BarrierTask.model_fields["method"].annotation.__args__) == {"naive", *command_line_methods(learns=False)}


def test_a_registered_path_method_runs_on_a_tiny_model():
    import torch

    from modeconn.path.methods import find_path

    model = torch.nn.Linear(2, 2)
    a, b = model.state_dict(), {k: v + 1 for k, v in model.state_dict().items()}
    path = find_path("linear", model, a, b, None, {"n": 3})
    assert len(path) == 3 and torch.equal(path[0]["weight"], a["weight"])
