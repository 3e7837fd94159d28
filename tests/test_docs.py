"""The documentation: the site builds with ``mkdocs build --strict``; every Python block of README.md and docs/ runs
(each page's blocks in order, in a fresh process and an empty working directory) unless it is marked as not run, with
its reason, on the line above it; a broken block fails the page (negative control); the generated references name
every registry entry; README.md stays a front door (at most 200 lines) and no user-facing page cites issue numbers."""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
NOT_RUN = re.compile(r"^<!-- docs-test: not-run \((?P<reason>[^)]{10,})\) -->$")
MARKER = "<!-- docs-test:"
FENCE_OPEN = re.compile(r"^```(?P<lang>[\w+-]*)")
PYTHON = {"python", "py", "python3", "pycon"}
ISSUE_REFS = re.compile(r"(?<![&\w/])#\d+\b|\bissues? #?\d+\b|\bseed 0\d\d\b", re.I)


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    code: str
    not_run: str | None  # the reason given in the marker above it, or None: the block runs


def python_blocks(text: str, page: str) -> list[Block]:
    """Every Python code block of a markdown page, with the not-run marker (if any) on the line above it."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i].strip())
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{page}:{i + 1}: unclosed code block"
        if m.group("lang") in PYTHON:
            marker = NOT_RUN.match(lines[i - 1].strip()) if i else None
            blocks.append(Block(page, i + 1, "\n".join(lines[i + 1:end]), marker.group("reason") if marker else None))
        i = end + 1
    return blocks


def script(blocks: list[Block]) -> str:
    """One script running a page's runnable blocks in order, each introduced by a comment naming its page and line."""
    parts = [f"# ---- {b.page}, block at line {b.line}\n{b.code}\n" for b in blocks if b.not_run is None]
    return "\n".join(parts)


def run_blocks(blocks: list[Block], workdir: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run ``blocks`` as one script in ``workdir`` with this checkout's ``src`` first on the path."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "docs_blocks.py"
    path.write_text(script(blocks))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, str(path)], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=timeout)


def pages() -> list[Path]:
    """README.md and every markdown page under docs/ (the generated experiment reports included)."""
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def runnable_pages() -> list[str]:
    return [rel(p) for p in pages() if any(b.not_run is None for b in python_blocks(p.read_text(), rel(p)))]


# ------------------------------------------------------------------------------------------- the blocks' rules
def test_python_blocks_are_found_and_markers_need_a_reason():
    text = ("intro\n\n```python\nx = 1\n```\n\n<!-- docs-test: not-run (needs a GPU cluster of your own) -->\n"
            "```python\ny = 2\n```\n\n<!-- docs-test: not-run (short) -->\n```py\nz = 3\n```\n\n```bash\nls\n```\n")
    blocks = python_blocks(text, "page.md")
    assert [(b.line, b.code, b.not_run) for b in blocks] == [
        (3, "x = 1", None), (8, "y = 2", "needs a GPU cluster of your own"), (13, "z = 3", None)]  # too short: runs
    assert "y = 2" not in script(blocks) and "page.md, block at line 13" in script(blocks)


def test_every_not_run_marker_has_a_reason_and_sits_above_a_python_block():
    for page in pages():
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith(MARKER):
                assert NOT_RUN.match(line.strip()), f"{rel(page)}:{i + 1}: a not-run marker needs a reason: {line}"
                assert i + 1 < len(lines) and FENCE_OPEN.match(lines[i + 1].strip()).group("lang") in PYTHON, (
                    f"{rel(page)}:{i + 1}: a not-run marker must be on the line above a python block")


def test_a_broken_block_fails_its_page_and_is_named(tmp_path):
    """Negative control: the runner does not pass a page whose block raises, and the failure names page and line."""
    page = "intro\n\n```python\nvalue = 41\n```\n\ntext\n\n```python\nassert value == 42, 'broken snippet'\n```\n"
    res = run_blocks(python_blocks(page, "docs/broken.md"), tmp_path)
    assert res.returncode != 0 and "broken snippet" in res.stderr
    assert "docs/broken.md, block at line 9" in (tmp_path / "docs_blocks.py").read_text()
    fixed = run_blocks(python_blocks(page.replace("41", "42"), "docs/fixed.md"), tmp_path / "fixed")
    assert fixed.returncode == 0, fixed.stderr


def test_the_pages_have_runnable_blocks():
    runnable = runnable_pages()
    for page in ("README.md", "docs/tutorials/own-model.md", "docs/tutorials/language-models.md",
                 "docs/guides/paths.md", "docs/guides/check.md",
                 "docs/extending/merge-rule.md", "docs/extending/tracer-rule.md"):
        assert page in runnable, page


OUTPUTS = {  # what a page's blocks must leave in the working directory
    "docs/tutorials/own-model.md": ["barrier.png"],
    "docs/guides/paths.md": ["runs/bezier-path"],
    "docs/guides/streaming.md": ["ckpt/b_aligned/model.safetensors", "ckpt/merged/config.json"],
    "README.md": ["hf/merged/model.safetensors"],
}


@pytest.mark.slow
@pytest.mark.parametrize("page", runnable_pages())
def test_every_python_block_of_the_page_runs(page, tmp_path, shared_data):
    res = run_blocks(python_blocks((REPO / page).read_text(), page), tmp_path)
    assert res.returncode == 0, f"{page}: a block failed\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    assert [f for f in OUTPUTS.get(page, []) if not (tmp_path / f).exists()] == []


# ------------------------------------------------------------------------------------------------ user-facing text
def test_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\(((?:docs/)?[\w/.-]+\.(?:md|cff))\)", text):
        assert (REPO / link).is_file(), f"README links to a missing file: {link}"


def test_no_issue_numbers_in_user_facing_pages():
    """The markdown sources here; the built site (generated pages included) in test_the_site_builds_strictly."""
    found = {}
    for page in pages():
        hits = ISSUE_REFS.findall(page.read_text())
        if hits:
            found[rel(page)] = hits
    assert found == {}
    assert ISSUE_REFS.findall("see #12, issue 22 and seed 001") == ["#12", "issue 22", "seed 001"]
    assert not ISSUE_REFS.findall("[link](page.md#alignment-methods), &#8203;, C# code")


# ----------------------------------------------------------------------------------------- generated references
def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_registry_reference_names_every_entry():
    from modeconn.checkpoints import CHECKPOINT_KINDS
    from modeconn.experiments import EXPERIMENTS
    from modeconn.match.methods import ALIGNMENT_METHODS
    from modeconn.path.merge_rules import MERGE_RULES
    from modeconn.path.methods import PATH_METHODS
    from modeconn.symmetry.hf.registry import ADAPTERS

    page = _generator().registries_page()
    for names in (ALIGNMENT_METHODS, MERGE_RULES, PATH_METHODS, EXPERIMENTS, ADAPTERS, CHECKPOINT_KINDS):
        missing = [n for n in names if f"`{n}`" not in page]
        assert missing == []
    assert "`restarts`" in page and "`ticks`" in page  # settings of weight matching and LLPF, with defaults


def test_the_cli_reference_has_every_command_and_the_layer_table_every_layer():
    import typer.main

    from modeconn.cli import app

    gen = _generator()
    page = gen.cli_page()
    for name in typer.main.get_command(app).commands:
        assert f"## `modeconn {name}`" in page and f"Usage: modeconn {name}" in page
    table = gen.layer_table()
    for package in ("cli", "recipes", "checkpoints", "symmetry", "io", "_util", "nn_utils"):
        assert f"`{package}`" in table


def test_help_texts_point_into_the_docs_and_keep_their_extras():
    """The CLI reference is the commands' own help: no pointer to README sections that moved into the site, no
    issue numbers, and pip extras in square brackets survive rich markup (``'modeconn[mergekit]'``, not ``'modeconn'``)."""
    page = _generator().cli_page()
    assert "README" not in page.replace("README.md", "")  # a merge's model card is a README.md; sections are not
    assert ISSUE_REFS.findall(page) == []
    assert "'modeconn'" not in page and "'modeconn[mergekit]'" in page and "'modeconn[eval]'" in page


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-6000:]
    site = tmp_path / "site"
    for page in ("index.html", "tutorials/own-model/index.html", "api/modeconn/index.html",
                 "reference/cli/index.html", "reference/registries/index.html", "architecture/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "modeconn" / "index.html").read_text()
    import modeconn

    shown = {"check": "modeconn.diagnostics.check.check", "interpolate": "modeconn.path.interpolate.interpolate",
             "errors": None}  # check/interpolate share their module's name; errors has a page of its own
    for name in modeconn.__all__:
        if shown.get(name, f"modeconn.{name}") is not None:
            assert f'id="{shown.get(name, f"modeconn.{name}")}"' in api, name
    assert '<img alt="Test loss' in (site / "tutorials" / "own-model" / "index.html").read_text()
    # every built page's text, generated ones included (help texts, registries, docstrings, experiment reports)
    cited = {rel_page: hits for rel_page, hits in ((str(f.relative_to(site)), ISSUE_REFS.findall(visible_text(f)))
                                                   for f in site.rglob("*.html")) if hits}
    assert cited == {}


def visible_text(page: Path) -> str:
    """The text a reader sees on a built HTML page (no scripts, styles or tags)."""
    text = re.sub(r"<(script|style)\b.*?</\1>", "", page.read_text(), flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", text))


def command_block(page: str, heading: str) -> list[list[str]]:
    """The ``modeconn`` commands of the first bash block after ``heading`` in ``page`` (comments dropped)."""
    text = (REPO / page).read_text()
    block = text[text.index(heading):].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].split() for line in block.splitlines() if line.strip()]


def run_commands(commands: list[list[str]]) -> None:
    from typer.testing import CliRunner

    from modeconn.cli import app

    for argv in commands:
        assert argv[0] == "modeconn", argv
        res = CliRunner().invoke(app, argv[1:], env={"COLUMNS": "80"})
        assert res.exit_code == 0, (argv, res.output)


@pytest.mark.slow
def test_the_readme_command_line_quick_start_runs(tmp_path, monkeypatch):
    commands = command_block("README.md", "## Quick start: command line")
    assert [c[:2] for c in commands] == [["modeconn", "demo"], ["modeconn", "train"], ["modeconn", "train"],
                                        ["modeconn", "barrier"], ["modeconn", "merge"], ["modeconn", "check"]]
    monkeypatch.chdir(tmp_path)
    run_commands(commands[1:] + [["modeconn", "demo", "--out", "runs/demo", "--epochs", "1"]])  # demo: quick form
    for out in ("runs/barrier/report.md", "runs/merged/model.safetensors", "runs/check/report.md", "runs/demo"):
        assert (tmp_path / out).exists(), out


@pytest.mark.slow
def test_the_vision_pair_tutorial_runs(tmp_path, monkeypatch):
    commands = command_block("docs/tutorials/vision-pair.md", "# A vision pair end to end")
    assert [c[1] for c in commands] == ["train", "train", "barrier", "merge", "check"]
    monkeypatch.chdir(tmp_path)
    run_commands(commands)
    results = json.loads((tmp_path / "runs/vision/barrier/results.json").read_text())
    barriers = {m: results["barriers"][m]["test"]["barrier_mean_loss"] for m in ("naive", "weight")}
    assert barriers["weight"] < barriers["naive"], barriers  # what the page says the figure shows
    for out in ("barrier/barrier.png", "merged/model.safetensors", "check/report.md"):
        assert (tmp_path / "runs/vision" / out).exists(), out
