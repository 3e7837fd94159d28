"""Trust round 3, class 9 — model cards and records.

A model name containing ``#``, ``:``, ``[`` or a newline broke the card's YAML front matter or injected keys (a
directory named ``evil\\nlicense: mit`` added a license); ``alignment.json`` and the config of merged / aligned
modeconn checkpoints recorded absolute machine paths. Now the front matter is emitted by a YAML dumper
(:func:`modeconn.recipes.merge_recipe.front_matter`), names in the card's body are escaped, and every record names its
inputs (:func:`modeconn.io.hf.model_names`), never by machine path.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from cli_runner import run_cli
from hf_tiny import make

from modeconn._util.outdir import MARKER
from modeconn.io import save_checkpoint
from modeconn.models import build_model

recipe_mod = importlib.import_module("modeconn.recipes.merge_recipe")

EVIL = ["evil\nlicense: mit", "a: b #c [x]", "---\ntags: [injected]\n---"]


def front_matter(card: str) -> tuple[dict, list[str]]:
    """The card's front matter parsed as a model hub reads it (between the first two ``---`` lines) and the body."""
    lines = card.split("\n")
    assert lines[0] == "---", card
    end = lines.index("---", 1)
    return yaml.safe_load("\n".join(lines[1:end])), lines[end + 1:]


def outside_fences(body: list[str]) -> list[str]:
    out, fence = [], None
    for line in body:
        if fence is None and line.startswith("```"):
            fence = line[:len(line) - len(line.lstrip("`"))]
        elif fence is not None and line == fence:
            fence = None
        elif fence is None:
            out.append(line)
    return out


@pytest.fixture
def evil(tmp_path):
    for seed, name in enumerate(EVIL):
        make("llama", seed).save_pretrained(tmp_path / name)
    return [tmp_path / n for n in EVIL]


def test_names_cannot_break_or_inject_into_the_model_card(evil, tmp_path):
    out = tmp_path / "merged # [x]: y"
    run_cli("merge", *evil, "--align", "none", "--out", out)
    card = (out / "README.md").read_text()
    meta, body = front_matter(card)
    assert set(meta) == {"library_name", "tags", "base_model"}, meta
    assert meta["base_model"] == EVIL and "injected" not in meta["tags"]  # the names round-trip, nothing added
    assert not any(line.startswith("license") for line in card.split("\n"))
    text = outside_fences(body)
    assert [line for line in text if line.startswith("#")] == ["# merged \\# \\[x\\]: y", "## Inputs", "## Method",
                                                               "## Recipe"]
    assert "- a: b \\#c \\[x\\]" in text and not any(line.startswith(("license", "---")) for line in text)
    # the recipe written beside it parses to the same models (paths relative to the output, resolvable)
    ran = yaml.safe_load((out / "merge_recipe.yml").read_text())
    assert [(out / m["model"]).resolve() for m in ran["models"]] == [p.resolve() for p in evil]


def test_front_matter_is_a_yaml_mapping_whatever_the_names():
    for names in (EVIL, ["plain"], ["x: [1, 2]", "'quoted'", '"dq"', "- dash", "key: value\n  nested: 1"]):
        meta, _ = front_matter(recipe_mod.front_matter({"library_name": "transformers", "base_model": names}) + "body")
        assert meta == {"library_name": "transformers", "base_model": names}


def assert_names_only(out: Path, *roots: Path) -> None:
    """No record written under ``out`` holds an absolute path under one of ``roots``."""
    records = [p for p in out.rglob("*") if p.is_file() and p.suffix in (".json", ".yml", ".yaml", ".md")
               and p.name != MARKER]
    assert records
    for p in records:
        text = p.read_text()
        for root in roots:
            assert str(root) not in text and str(root.resolve()) not in text, f"{p.relative_to(out)} holds {root}"


def test_hugging_face_records_name_their_inputs(evil, tmp_path):
    a, b = evil[1], evil[2]
    run_cli("merge", a, b, "--align", "weight", "--restarts", 1, "--max-iter", 3, "--out", tmp_path / "m")
    run_cli("align", a, b, "--restarts", 1, "--max-iter", 3, "--out", tmp_path / "al")
    for out in (tmp_path / "m", tmp_path / "al"):
        assert_names_only(out, tmp_path)


def test_modeconn_records_name_their_inputs(tmp_path):
    paths = [save_checkpoint(tmp_path / "in" / n, build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=1,
                                                              width=8, seed=s), config={"dataset": "digits"})
             for s, n in enumerate("ab")]
    run_cli("merge", *paths, "--align", "weight", "--bn", "interpolate", "--out", tmp_path / "m")
    run_cli("align", *paths, "--out", tmp_path / "al")
    for out in (tmp_path / "m", tmp_path / "al"):
        assert_names_only(out, tmp_path)


# ---------------------------------------------------------------------------------- negative controls
def test_negative_control_hand_written_front_matter_is_caught(monkeypatch):
    def by_hand(fields):  # broken: the old f-string front matter
        return "---\n" + "".join(f"{k}:\n" + "".join(f"- {v}\n" for v in vs) if isinstance(vs, list) else f"{k}: {vs}\n"
                                 for k, vs in fields.items()) + "---\n"

    monkeypatch.setattr(recipe_mod, "front_matter", by_hand)
    with pytest.raises((AssertionError, yaml.YAMLError)):  # keys injected, or the front matter broken
        test_front_matter_is_a_yaml_mapping_whatever_the_names()
