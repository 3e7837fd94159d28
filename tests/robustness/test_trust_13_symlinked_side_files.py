"""Trust class 13 — symlinked side files.

A ``tokenizer.json`` in checkpoint B that is a symlink to a private file outside the checkpoint had its content
copied into the output of a streaming align/merge. Every file modeconn reads from a checkpoint and may carry into an
output — side files (:func:`modeconn.io.hf.side_files`), files copied by :func:`modeconn.io.lazy.write_like`,
weights files, shards and the index (:class:`~modeconn.io.lazy.LazyCheckpoint`), ``config.json`` and weights of
modeconn checkpoints (:func:`~modeconn.io.load_checkpoint`) — must resolve inside the checkpoint's directory tree
(:func:`modeconn.io.check_in_checkpoint`): else a CheckpointError names the file and its target, before any heavy
work. The Hugging Face cache layout (``<repo>/snapshots/<rev>/f -> ../../blobs/<hash>``) stays allowed.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

import pytest
from cli_runner import run_cli
from hf_tiny import make

from modeconn.errors import CheckpointError
from modeconn.io import check_in_checkpoint, load_checkpoint, save_checkpoint
from modeconn.io.lazy import LazyCheckpoint, write_like
from modeconn.models import build_model
from modeconn.io.hf import side_files
from modeconn.recipes.hf_stream import align_hf_checkpoints, merge_hf_checkpoints

io_mod = importlib.import_module("modeconn.io")
io_checkpoint_mod = importlib.import_module("modeconn.io.checkpoint")
io_stream_mod = importlib.import_module("modeconn.io.lazy")
io_hf_mod = importlib.import_module("modeconn.io.hf")
io_vocabulary_mod = importlib.import_module("modeconn.io.vocabulary")
stream_mod = importlib.import_module("modeconn.recipes.hf_stream")

SECRET = '{"private": "do not copy me"}'


def _boom(*args, **kwargs):
    raise AssertionError("heavy work started before the symlink was refused")


def assert_symlink_refused(fn, link: Path, target: Path) -> None:
    """The check of this class: CheckpointError naming the symlinked file and where it points."""
    with pytest.raises(CheckpointError) as err:
        fn()
    assert str(link) in str(err.value) and str(target.resolve()) in str(err.value), str(err.value)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("links")
    for seed, name in ((0, "a"), (1, "b")):
        make("gpt_neox", seed).save_pretrained(root / name, max_shard_size="20KB")
    return root / "a", root / "b"


@pytest.fixture
def secret(tmp_path) -> Path:
    (tmp_path / "private").mkdir()
    path = tmp_path / "private" / "secret.json"
    path.write_text(SECRET)
    return path


def linked_copy(src: Path, dst: Path, name: str, target: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / name).unlink(missing_ok=True)
    (dst / name).symlink_to(target)
    return dst


def test_side_file_symlinked_outside_is_refused_before_matching(pair, secret, tmp_path, monkeypatch):
    a, b = pair
    bad = linked_copy(b, tmp_path / "b", "tokenizer.json", secret)
    monkeypatch.setattr(stream_mod, "weight_matching", _boom)
    assert_symlink_refused(lambda: side_files(bad), bad / "tokenizer.json", secret)
    assert_symlink_refused(lambda: align_hf_checkpoints(a, bad, tmp_path / "o"), bad / "tokenizer.json", secret)
    assert_symlink_refused(lambda: merge_hf_checkpoints([bad, a], tmp_path / "o"), bad / "tokenizer.json", secret)
    res = run_cli("align", a, bad, "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "tokenizer.json" in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "o").exists()


def test_write_like_refuses_a_file_to_copy_that_links_out_of_its_directory(pair, secret, tmp_path):
    a, _ = pair
    link = tmp_path / "side" / "tokenizer.json"
    link.parent.mkdir()
    link.symlink_to(secret)
    ckpt = LazyCheckpoint(a)
    assert_symlink_refused(lambda: write_like(tmp_path / "o", ckpt, _boom, files={"tokenizer.json": link}),
                           link, secret)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("which", ["shard", "index", "single"])
def test_weights_read_through_a_symlink_out_of_the_checkpoint_are_refused(pair, tmp_path, which):
    a, _ = pair
    outside = tmp_path / "elsewhere"
    shutil.copytree(a, outside)
    if which == "single":
        make("gpt_neox", 2).save_pretrained(outside / "single")
        src, name = outside / "single", "model.safetensors"
        ckpt = tmp_path / "ckpt"
        shutil.copytree(src, ckpt)
    else:
        name = min(p.name for p in a.glob("model-*.safetensors")) if which == "shard" else "model.safetensors.index.json"
        src, ckpt = outside, tmp_path / "ckpt"
        shutil.copytree(a, ckpt)
    (ckpt / name).unlink()
    (ckpt / name).symlink_to(src / name)
    assert_symlink_refused(lambda: LazyCheckpoint(ckpt), ckpt / name, src / name)


def test_modeconn_checkpoint_weights_and_config_symlinked_outside_are_refused(tmp_path):
    good = save_checkpoint(tmp_path / "good", build_model("mlp", in_shape=(1, 2, 2), num_classes=2, depth=1, width=3))
    for name in ("model.safetensors", "config.json"):
        ckpt = linked_copy(good, tmp_path / f"linked-{name}", name, good / name)
        assert_symlink_refused(lambda: load_checkpoint(ckpt), ckpt / name, good / name)
        res = run_cli("align", ckpt, ckpt, "--out", tmp_path / "o", ok=False)
        assert res.exit_code == 2 and name in res.output and "Traceback" not in res.output, res.output


def test_symlink_loop_is_a_checkpoint_error(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.json").symlink_to(tmp_path / "c" / "y.json")
    (tmp_path / "c" / "y.json").symlink_to(tmp_path / "c" / "x.json")
    with pytest.raises(CheckpointError, match="x.json"):
        check_in_checkpoint(tmp_path / "c" / "x.json", tmp_path / "c")


# ----------------------------------------------------------------------------------------- still allowed
def hf_cache_layout(src: Path, repo: Path) -> Path:
    """``src`` laid out as the Hugging Face hub cache does: every file a blob, the snapshot only symlinks."""
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, f in enumerate(sorted(src.iterdir())):
        shutil.copyfile(f, repo / "blobs" / f"blob{i:03d}")
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i:03d}")
    return snap


def test_hugging_face_cache_snapshots_and_links_inside_the_checkpoint_are_allowed(pair, tmp_path):
    a, b = pair
    tok = tmp_path / "b-with-tokenizer"
    shutil.copytree(b, tok)
    (tok / "tokenizer.json").write_text('{"model": "bpe"}')
    a = shutil.copytree(a, tmp_path / "a-with-tokenizer")  # one tokenizer for both (vocabularies are compared)
    shutil.copyfile(tok / "tokenizer.json", a / "tokenizer.json")
    snap_a = hf_cache_layout(a, tmp_path / "hub" / "models--x--a")
    snap_b = hf_cache_layout(tok, tmp_path / "hub" / "models--x--b")
    assert all(p.is_symlink() for p in snap_b.iterdir())
    align_hf_checkpoints(snap_a, snap_b, tmp_path / "o", restarts=1, max_iter=1)
    assert (tmp_path / "o" / "tokenizer.json").read_text() == '{"model": "bpe"}'
    inside = tmp_path / "inside"
    shutil.copytree(tok, inside)
    (inside / "sub").mkdir()
    os.replace(inside / "tokenizer.json", inside / "sub" / "tokenizer.json")
    (inside / "tokenizer.json").symlink_to(Path("sub") / "tokenizer.json")  # a link within the checkpoint
    assert side_files(inside)["tokenizer.json"] == inside / "tokenizer.json"


# --------------------------------------------------------------------------------------------- negative control
def test_negative_control_without_the_check_the_private_file_is_copied(pair, secret, tmp_path, monkeypatch):
    """With the containment check disabled, the private file a side file links to ends up in the output: the
    refusal above is what keeps it out."""
    resolve_only = lambda file, root: Path(file).resolve()  # noqa: E731
    for mod in (io_mod, io_checkpoint_mod, io_stream_mod, io_hf_mod, io_vocabulary_mod):
        monkeypatch.setattr(mod, "check_in_checkpoint", resolve_only)
    a, b = pair
    bad = linked_copy(b, tmp_path / "b", "tokenizer.json", secret)
    a = shutil.copytree(a, tmp_path / "a-with-tokenizer")
    (a / "tokenizer.json").write_text(SECRET)  # the same bytes as B's: the vocabulary check passes
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        assert_symlink_refused(lambda: side_files(bad), bad / "tokenizer.json", secret)
    align_hf_checkpoints(a, bad, tmp_path / "o", restarts=1, max_iter=1)
    assert (tmp_path / "o" / "tokenizer.json").read_text() == SECRET  # leaked
