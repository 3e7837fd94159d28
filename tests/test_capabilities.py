"""The capability table (command × checkpoint kind, modeconn.recipes.capabilities) is held to the code: every cell the
kinds support names what it does and a test that exists and runs it through the CLI; every other cell states why it is
refused, and the command refuses it."""

from __future__ import annotations

import ast
from pathlib import Path

from cli_runner import run_cli

from modeconn.recipes import capabilities as cap

ROOT = Path(__file__).resolve().parents[1]


def _test_exists(ref: str) -> bool:
    file, _, name = ref.partition("::")
    tree = ast.parse((ROOT / file).read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def test_every_supported_cell_says_what_it_does_and_names_an_existing_test():
    rows = cap.table()
    assert {r["kind"] for r in rows} >= {"modeconn", "huggingface", "absorbed", "timm", "torchvision"}
    for r in rows:
        key = (r["kind"], r["command"])
        if r["supported"]:
            assert r["text"], f"{key}: supported but no note"
            refs = cap.TESTED_BY.get(key, ())
            refs = (refs,) if isinstance(refs, str) else refs
            assert refs and all(_test_exists(ref) for ref in refs), f"{key}: no test runs it ({refs})"
        else:
            assert key in cap.REFUSED, f"{key}: refused without a stated reason"


def test_a_claim_without_the_operation_is_caught(monkeypatch):
    """The negative control: a kind that loses an operation turns its cell into a refusal without a reason."""
    from modeconn.checkpoints import CHECKPOINT_KINDS

    kind = CHECKPOINT_KINDS["torchvision"]
    monkeypatch.setattr(type(kind), "operation", lambda self, op: None if self.name == "torchvision" else
                        self.operations.get(op))
    missing = [r for r in cap.table() if r["kind"] == "torchvision" and not r["supported"]]
    assert missing and all((r["kind"], r["command"]) not in cap.REFUSED for r in missing)


def test_refused_cells_are_refused_by_the_command(tmp_path):
    from hf_tiny import make

    from modeconn.symmetry import absorb_normalization, save_absorbed

    d = save_absorbed(absorb_normalization(make("gpt_neox")), tmp_path / "absorbed")
    for command in ("align", "merge"):
        assert not next(r for r in cap.table() if r["kind"] == "absorbed" and r["command"] == command)["supported"]
        res = run_cli(command, d, d, "--out", tmp_path / "o", ok=False)
        assert res.exit_code == 2 and "is not one" in res.output, res.output


def test_the_markdown_table_has_a_row_per_kind():
    text = cap.markdown()
    assert text.count("\n") == 2 + len(cap.table()) // len(cap.COMMANDS)
    assert "✘ absorbed checkpoints are dual matching's output" in text
