"""Trust round 3, class 6: ``--overwrite`` replaces only what modeconn wrote — never a file the user added.

The marker (``.modeconn-output.json``) lists every file and directory modeconn wrote into an output (size and SHA-256
of each file). ``--overwrite`` refuses, naming the first offender, an output (or a ``cp -r`` copy of one) holding a
file or directory added since, a file changed since, a symlink, a marker that is itself a symlink (never followed)
or an earlier version's marker without the list. ``--out .`` writes into an empty working directory and refuses a
non-empty one with the true reason. The check of this class is :func:`user_files_intact`; the negative control
puts back the old rule (a marker anywhere proves ownership) and shows the user's file deleted.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from modeconn._util import outdir as outdir_mod
from modeconn._util.digest import sha256_file
from modeconn._util.outdir import MARKER, check_output_target, is_modeconn_output, output_directory, unowned_entry
from modeconn.errors import ConfigError
from modeconn.io import save_checkpoint
from modeconn.models import build_model

from cli_runner import run_cli
from hf_tiny import make


def _mlp_checkpoint(path: Path, seed: int) -> Path:
    model = build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=1, width=8, seed=seed)
    return save_checkpoint(path, model, config={"dataset": "digits"})


@pytest.fixture
def pair(tmp_path):
    return _mlp_checkpoint(tmp_path / "a", 0), _mlp_checkpoint(tmp_path / "b", 1)


def _merge(a: Path, b: Path, out: Path, *extra, ok=True):
    return run_cli("merge", a, b, "--align", "none", "--out", out, *extra, ok=ok)


def user_files_intact(files: dict[Path, bytes]) -> None:
    """The check of this class: every file the user put there still exists with the same bytes."""
    lost = [str(p) for p, data in files.items() if not p.is_file() or p.read_bytes() != data]
    assert not lost, f"user files deleted or changed: {lost}"


def _refused(res, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    for needle in needles:
        assert needle in res.output, res.output


def test_the_marker_lists_every_file_with_size_and_digest(pair, tmp_path):
    a, b = pair
    out = tmp_path / "merged"
    _merge(a, b, out)
    record = json.loads((out / MARKER).read_text())
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != MARKER)
    assert sorted(record["files"]) == on_disk
    for rel, entry in record["files"].items():
        assert entry == {"size": (out / rel).stat().st_size, "sha256": sha256_file(out / rel)}
    assert unowned_entry(out) is None


def test_a_copy_with_a_user_file_added_is_refused_and_the_file_kept(pair, tmp_path):
    a, b = pair
    out = tmp_path / "merged"
    _merge(a, b, out)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)  # cp -r: the marker travels with the files
    (copy / "notes").mkdir()
    mine = {copy / "my-notes.md": b"results I wrote down", copy / "notes" / "plot.png": b"\x89PNG mine"}
    for p, data in mine.items():
        p.write_bytes(data)
    _refused(_merge(a, b, copy, "--overwrite", ok=False), "my-notes.md", "modeconn did not write")
    user_files_intact(mine)
    (copy / "my-notes.md").unlink()
    _refused(_merge(a, b, copy, "--overwrite", ok=False), "notes/", "directory modeconn did not write")
    user_files_intact({k: v for k, v in mine.items() if k.exists()})


def test_an_unaltered_copy_is_replaced(pair, tmp_path):
    a, b = pair
    out = tmp_path / "merged"
    _merge(a, b, out)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = (copy / "model.safetensors").read_bytes()
    _merge(a, b, copy, "--weights", "0.2,0.8", "--overwrite")
    assert (copy / "model.safetensors").read_bytes() != before and unowned_entry(copy) is None


@pytest.mark.parametrize("change", ["same size", "other size", "subdir file", "symlink", "empty dir"])
def test_changed_or_added_entries_are_named(tmp_path, change):
    out = tmp_path / "run"
    with output_directory(out) as tmp:
        (tmp / "results.json").write_text('{"run": 1}')
        (tmp / "path").mkdir()
        (tmp / "path" / "shard-0.bin").write_bytes(b"\0" * 64)
    edit, named = {
        "same size": (lambda: (out / "results.json").write_text('{"run": 2}'), "results.json, changed"),
        "other size": (lambda: (out / "results.json").write_text('{"run": 22}'), "results.json, changed"),
        "subdir file": (lambda: (out / "path" / "mine.txt").write_text("x"), "path/mine.txt"),
        "symlink": (lambda: (out / "link").symlink_to(tmp_path), "link, a symlink"),
        "empty dir": (lambda: (out / "drafts").mkdir(), "drafts/"),
    }[change]
    edit()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and not p.is_symlink()}
    with pytest.raises(ConfigError, match="never other files") as err:
        check_output_target(out, overwrite=True)
    assert named in str(err.value)
    with pytest.raises(ConfigError, match=named.split(",")[0]), output_directory(out, overwrite=True) as tmp:
        (tmp / "results.json").write_text('{"run": 3}')
    user_files_intact(before)


def test_a_listed_file_that_is_gone_is_fine(tmp_path):
    out = tmp_path / "run"
    with output_directory(out) as tmp:
        (tmp / "a.json").write_text("{}")
        (tmp / "b.json").write_text("{}")
    (out / "b.json").unlink()
    assert unowned_entry(out) is None
    check_output_target(out, overwrite=True)


def test_a_symlinked_marker_is_never_followed(pair, tmp_path):
    a, b = pair
    out = tmp_path / "merged"
    _merge(a, b, out)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("\\chapter{Intro}")
    (victim / MARKER).symlink_to(out / MARKER)  # a marker borrowed from a real output
    _refused(_merge(a, b, victim, "--overwrite", ok=False), "symlink", MARKER)
    user_files_intact({victim / "thesis.tex": b"\\chapter{Intro}"})
    assert not is_modeconn_output(victim)


def test_an_earlier_marker_without_a_file_list_is_refused(tmp_path):
    old = tmp_path / "old-run"
    old.mkdir()
    (old / MARKER).write_text(json.dumps({"tool": "modeconn", "command": "merge", "modeconn_version": "0.9"}))
    (old / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(ConfigError, match="earlier modeconn version.*delete it yourself"):
        check_output_target(old, overwrite=True)
    assert (old / "model.safetensors").read_bytes() == b"weights"


def test_out_dot_writes_into_an_empty_working_directory(pair, tmp_path, monkeypatch):
    a, b = pair
    here = tmp_path / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    _merge(a, b, ".")
    assert Path.cwd() == here.resolve() and os.path.samefile(".", here)  # still there: filled, not swapped
    assert (here / "model.safetensors").is_file() and unowned_entry(here) is None
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left beside it
    # inside that output, the true reason and the way out
    res = _merge(a, b, ".", "--overwrite", ok=False)
    _refused(res, "working directory", "earlier modeconn output", "--out empty --overwrite")
    res = _merge(a, b, ".", ok=False)
    _refused(res, "working directory")
    assert "pass --overwrite" not in res.output  # it would be refused too: not offered
    monkeypatch.chdir(tmp_path)
    _merge(a, b, "empty", "--weights", "0.3,0.7", "--overwrite")
    assert unowned_entry(here) is None


def test_out_dot_in_a_users_folder_names_the_reason(pair, tmp_path, monkeypatch):
    a, b = pair
    here = tmp_path / "mine"
    here.mkdir()
    (here / "data.csv").write_text("1,2")
    monkeypatch.chdir(here)
    _refused(_merge(a, b, ".", "--overwrite", ok=False), "working directory", "no " + MARKER)
    user_files_intact({here / "data.csv": b"1,2"})


def _commands(a: Path, b: Path, out: Path) -> dict[str, list]:
    return {
        "align": ["align", a, b, "--out", out],
        "merge": ["merge", a, b, "--align", "none", "--out", out],
        "barrier": ["barrier", a, b, "--method", "naive", "--lambdas", "2", "--eval-limit", "50", "--out", out],
        "path": ["path", a, b, "--method", "linear", "--eval-limit", "50", "--sub-points", "1", "--out", out],
    }


@pytest.mark.parametrize("command", ["align", "merge", "barrier", "path"])
def test_every_command_lists_all_it_writes_and_replaces_its_own_output(pair, tmp_path, command):
    a, b = pair
    out = tmp_path / "out"
    argv = _commands(a, b, out)[command]
    run_cli(*argv)
    assert unowned_entry(out) is None, unowned_entry(out)
    run_cli(*argv, "--overwrite")
    assert unowned_entry(out) is None


@pytest.mark.parametrize("command", ["align", "merge"])
def test_hugging_face_outputs_list_all_they_write(tmp_path, command):
    for seed, name in ((0, "a"), (1, "b")):
        make("llama", seed).save_pretrained(tmp_path / name)
    out = tmp_path / "out"
    argv = [command, tmp_path / "a", tmp_path / "b", "--out", out, "--max-iter", "2"]
    run_cli(*argv)
    assert unowned_entry(out) is None, unowned_entry(out)
    (out / "added.txt").write_text("mine")
    res = run_cli(*argv, "--overwrite", ok=False)
    _refused(res, "added.txt")
    assert (out / "added.txt").read_text() == "mine"


def test_negative_control_the_marker_alone_lets_a_user_file_be_deleted(pair, tmp_path, monkeypatch):
    """The rule before this fix (any marker proves ownership): the copy's user file is deleted by --overwrite, and
    :func:`user_files_intact` reports it."""
    a, b = pair
    out = tmp_path / "merged"
    _merge(a, b, out)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    mine = {copy / "my-notes.md": b"results I wrote down"}
    (copy / "my-notes.md").write_bytes(mine[copy / "my-notes.md"])
    monkeypatch.setattr(outdir_mod, "unowned_entry",
                        lambda d: None if is_modeconn_output(d) else f"was not written by modeconn (no {MARKER})")
    _merge(a, b, copy, "--overwrite")
    with pytest.raises(AssertionError, match="user files deleted"):
        user_files_intact(mine)
