"""Trust class 1: ``--out`` / ``--overwrite`` never delete an input or a file modeconn did not write.

For every command that writes a directory (align, merge, barrier, path, train, demo, experiment; modeconn and Hugging
Face checkpoints): an ``--out`` that is, contains or lies inside an input is refused before any work, with or without
``--overwrite``; ``--overwrite`` replaces only a directory carrying modeconn's marker. The check of this class is
:func:`inputs_intact` — every byte of every input and of the user's own folder is still there. The negative control
removes the guard and shows that the same command then deletes the inputs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from modeconn._util import outdir as outdir_mod
from modeconn._util.outdir import MARKER, check_output_target, is_modeconn_output, output_directory
from modeconn.errors import CheckpointError, ConfigError
from modeconn.io import save_checkpoint
from modeconn.models import build_model

from cli_runner import run_cli
from hf_tiny import make


def tree(path: Path) -> dict[str, str]:
    """Every file under ``path`` (or the file itself) → sha256."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def inputs_intact(before: dict[str, str], *roots: Path) -> None:
    """The check of this class: every file recorded in ``before`` still exists with the same bytes."""
    after = {}
    for r in roots:
        after.update(tree(r) if r.exists() else {})
    lost = sorted(set(before) - set(after))
    changed = sorted(k for k in before if k in after and after[k] != before[k])
    assert not lost and not changed, f"inputs lost: {lost[:3]}; inputs changed: {changed[:3]}"


def _mlp_checkpoint(path: Path, seed: int) -> Path:
    model = build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=1, width=8, seed=seed)
    return save_checkpoint(path, model, config={"dataset": "digits"})


@pytest.fixture
def runs(tmp_path):
    """``runs/a`` and ``runs/b`` (modeconn checkpoints) next to ``runs/notes.txt`` (a user's own file)."""
    root = tmp_path / "runs"
    a, b = _mlp_checkpoint(root / "a", 0), _mlp_checkpoint(root / "b", 1)
    (root / "notes.txt").write_text("my lab notes")
    return root, a, b


@pytest.fixture
def hf_runs(tmp_path):
    root = tmp_path / "hf"
    dirs = []
    for seed, name in ((0, "a"), (1, "b")):
        make("llama", seed).save_pretrained(root / name)
        dirs.append(root / name)
    (root / "notes.txt").write_text("my lab notes")
    return root, *dirs


def _commands(a: Path, b: Path, out: Path) -> dict[str, list]:
    return {
        "align": ["align", a, b, "--out", out, "--overwrite"],
        "merge": ["merge", a, b, "--align", "none", "--out", out, "--overwrite"],
        "barrier": ["barrier", a, b, "--method", "naive", "--lambdas", "2", "--out", out, "--overwrite"],
        "path": ["path", a, b, "--method", "linear", "--out", out, "--overwrite"],
    }


@pytest.mark.parametrize("command", ["align", "merge", "barrier", "path"])
@pytest.mark.parametrize("where", ["parent", "input", "inside"])
def test_out_related_to_an_input_is_refused(runs, command, where):
    root, a, b = runs
    out = {"parent": root, "input": b, "inside": a / "aligned"}[where]
    before = tree(root)
    res = run_cli(*_commands(a, b, out)[command], ok=False)
    assert res.exit_code == 2 and "inputs are never written to" in res.output, res.output
    inputs_intact(before, root)


@pytest.mark.parametrize("command", ["align", "merge"])
@pytest.mark.parametrize("where", ["parent", "input"])
def test_hf_out_related_to_an_input_is_refused(hf_runs, command, where):
    root, a, b = hf_runs
    out = root if where == "parent" else a
    before = tree(root)
    res = run_cli(*_commands(a, b, out)[command], ok=False)
    assert res.exit_code == 2 and "inputs are never written to" in res.output, res.output
    inputs_intact(before, root)


@pytest.mark.parametrize("command", ["align", "merge", "barrier", "path"])
def test_overwrite_refuses_a_directory_modeconn_did_not_write(runs, tmp_path, command):
    _, a, b = runs
    mine = tmp_path / "thesis"
    (mine / "chapters").mkdir(parents=True)
    (mine / "chapters" / "1.tex").write_text("\\chapter{Intro}")
    before = tree(mine)
    res = run_cli(*_commands(a, b, mine)[command], ok=False)
    assert res.exit_code == 2 and "not written by modeconn" in res.output, res.output
    inputs_intact(before, mine)


def test_train_refuses_its_data_directory_and_foreign_out(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train-images-idx3-ubyte").write_bytes(b"\0" * 64)
    before = tree(data)
    for out in (data, data / "ckpt", tmp_path):
        res = run_cli("train", "--out", out, "--dataset", "mnist", "--data", data, "--overwrite", ok=False)
        assert res.exit_code == 2 and "inputs are never written to" in res.output, res.output
    inputs_intact(before, data)


@pytest.mark.parametrize("argv", [["demo", "--epochs", "1"], ["experiment", "identifiability-sigma", "--quick"]])
def test_recipes_without_checkpoints_refuse_a_foreign_out(tmp_path, argv):
    mine = tmp_path / "photos"
    mine.mkdir()
    (mine / "cat.jpg").write_bytes(b"\xff\xd8cat")
    before = tree(mine)
    res = run_cli(*argv, "--out", mine, "--overwrite", ok=False)
    assert res.exit_code == 2 and "not written by modeconn" in res.output, res.output
    inputs_intact(before, mine)


def test_overwrite_replaces_modeconn_output_and_keeps_inputs(runs, tmp_path):
    _, a, b = runs
    out = tmp_path / "merged"
    run_cli("merge", a, b, "--align", "none", "--out", out)
    assert is_modeconn_output(out)
    before = tree(a) | tree(b)
    first = (out / "model.safetensors").read_bytes()
    run_cli("merge", a, b, "--align", "none", "--weights", "0.25,0.75", "--out", out, "--overwrite")
    assert (out / "model.safetensors").read_bytes() != first  # replaced
    inputs_intact(before, a, b)
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []  # no hidden leftovers


def test_api_writers_apply_the_same_rules(runs, tmp_path):
    """The rule lives below the CLI: save_checkpoint and output_directory refuse the same targets."""
    root, a, b = runs
    model = build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=1, width=8, seed=2)
    before = tree(root)
    with pytest.raises(CheckpointError, match="inputs are never written to"):
        save_checkpoint(root, model, inputs=[a, b], overwrite=True)
    with pytest.raises(CheckpointError, match="not written by modeconn"):
        save_checkpoint(root, model, overwrite=True)  # runs/ holds notes.txt and has no marker
    with pytest.raises(ConfigError, match="inputs are never written to"), output_directory(root / "a", inputs=[a]):
        pass
    inputs_intact(before, root)
    # an old modeconn-looking directory without the marker is a user's directory
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=MARKER):
        check_output_target(legacy, overwrite=True)


def test_symlinked_out_to_an_input_is_refused(runs, tmp_path):
    _, a, b = runs
    link = tmp_path / "link"
    link.symlink_to(a, target_is_directory=True)
    before = tree(a)
    res = run_cli(*_commands(a, b, link)["merge"], ok=False)
    assert res.exit_code == 2, res.output
    inputs_intact(before, a)


def test_negative_control_without_the_guard_inputs_are_deleted(runs, monkeypatch):
    """Remove the check (the behaviour before the fix): the same command deletes both inputs and the user's file,
    and :func:`inputs_intact` reports it."""
    root, a, b = runs
    before = tree(root)
    monkeypatch.setattr(outdir_mod, "check_not_an_input", lambda out, inputs, **kw: None)
    monkeypatch.setattr(outdir_mod, "unowned_entry", lambda path: None)
    run_cli(*_commands(a, b, root)["merge"])
    with pytest.raises(AssertionError, match="inputs lost"):
        inputs_intact(before, root)
    assert not (root / "notes.txt").exists()
