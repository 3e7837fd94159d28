"""Trust round 3, class 7 — information leak through the Hugging Face cache allowance.

Files of a checkpoint may be symlinks into the Hugging Face cache's ``<repo>/blobs`` (``snapshots/<rev>/f ->
../../blobs/<hash>``). When ``blobs`` itself was a symlink, every file of the directory it pointed at passed as a
"cache blob": a side file linked there was copied into the output of ``align`` / ``merge``. The allowance now holds
only for blobs lying directly in a real ``blobs`` directory of the repo the snapshot really is in (a symlinked
``blobs`` is never followed, whatever the chain of directories leading to it); everything else is refused with a
CheckpointError naming the file and its target before any work. The genuine cache layout keeps working, also
reached through a symlinked cache root or a symlink to the snapshot.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest
from cli_runner import run_cli
from hf_tiny import make

from modeconn.checkpoints import open_checkpoint
from modeconn.errors import CheckpointError
from modeconn.io import check_in_checkpoint
from modeconn.io.lazy import LazyCheckpoint
from modeconn.io.hf import side_files
from modeconn.recipes.hf_stream import align_hf_checkpoints, merge_hf_checkpoints

io_mod = importlib.import_module("modeconn.io.safe")
stream_mod = importlib.import_module("modeconn.recipes.hf_stream")

SECRET = '{"private": "do not copy me"}'
SIDE = "special_tokens_map.json"  # a side file copied to outputs (not a tokenizer vocabulary)


def _boom(*args, **kwargs):
    raise AssertionError("heavy work started before the symlinked blobs directory was refused")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("blobs")
    for seed, name in ((0, "a"), (1, "b")):
        make("gpt_neox", seed).save_pretrained(root / name)
    return root / "a", root / "b"


@pytest.fixture
def secret_dir(tmp_path) -> Path:
    d = tmp_path / "home" / ".ssh"
    d.mkdir(parents=True)
    (d / "id_rsa").write_text(SECRET)
    return d


def snapshot(src: Path, repo: Path, blobs_target: Path | None = None, linked: tuple[str, ...] = ()) -> Path:
    """``src`` as a cache entry ``repo/snapshots/0123abc``: files named in ``linked`` (or all when ``blobs_target``
    is None) are blobs of ``repo/blobs``; with ``blobs_target``, ``repo/blobs`` is a symlink to it and the other files
    are regular files of the snapshot."""
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    if blobs_target is None:
        (repo / "blobs").mkdir()
    else:
        (repo / "blobs").symlink_to(blobs_target, target_is_directory=True)
    for i, f in enumerate(sorted(src.iterdir())):
        if blobs_target is None or f.name in linked:
            if blobs_target is None:
                shutil.copyfile(f, repo / "blobs" / f"blob{i:03d}")
            (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i:03d}")
        else:
            shutil.copyfile(f, snap / f.name)
    return snap


def leaky(b: Path, repo: Path, secret_dir: Path, side: str = SIDE) -> Path:
    """The attack: a snapshot of ``b`` whose ``special_tokens_map.json`` (``side``) ``-> ../../blobs/id_rsa`` and
    ``blobs -> ~/.ssh``."""
    snap = snapshot(b, repo, secret_dir)
    (snap / side).symlink_to(Path("..") / ".." / "blobs" / "id_rsa")
    return snap


def assert_refused(fn, link: Path, target: Path) -> None:
    with pytest.raises(CheckpointError) as err:
        fn()
    msg = str(err.value)
    assert str(link) in msg and str(target.resolve()) in msg and "blobs" in msg, msg


@pytest.mark.parametrize("side", [SIDE, "tokenizer.json"])
def test_side_file_through_a_symlinked_blobs_directory_is_refused_before_any_work(pair, secret_dir, tmp_path,
                                                                                 monkeypatch, side):
    a, b = pair
    snap = leaky(b, tmp_path / "hub" / "models--x--b", secret_dir, side)
    link, target = snap / side, secret_dir / "id_rsa"
    monkeypatch.setattr(stream_mod, "weight_matching", _boom)
    assert_refused(lambda: side_files(snap), link, target)
    assert_refused(lambda: check_in_checkpoint(link, snap), link, target)
    assert_refused(lambda: align_hf_checkpoints(a, snap, tmp_path / "o"), link, target)
    assert_refused(lambda: merge_hf_checkpoints([snap, a], tmp_path / "o"), link, target)
    for command in ("align", "merge"):
        res = run_cli(command, a, snap, "--out", tmp_path / "o", ok=False)
        assert res.exit_code == 2 and side in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_config_and_weights_through_a_symlinked_blobs_directory_are_refused(pair, tmp_path, name):
    """The directory ``blobs`` points at holds a complete checkpoint (someone else's): still not this one's files."""
    a, b = pair
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for i, f in enumerate(sorted(b.iterdir())):
        shutil.copyfile(f, elsewhere / f"blob{i:03d}")
    snap = snapshot(b, tmp_path / "hub" / "models--x--b", elsewhere, linked=(name,))
    read = (lambda: open_checkpoint(snap)) if name == "config.json" else (lambda: LazyCheckpoint(snap))
    assert_refused(read, snap / name, (snap / name).resolve())
    res = run_cli("align", a, snap, "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and name in res.output and "Traceback" not in res.output, res.output


def test_symlinked_snapshots_or_repo_leading_to_a_symlinked_blobs_is_refused(pair, secret_dir, tmp_path):
    """The chain judged on real paths: a ``snapshots`` (or repo) symlink that leads to a repo whose ``blobs`` is a
    symlink gets no allowance either."""
    _, b = pair
    real = leaky(b, tmp_path / "real" / "models--x--b", secret_dir)
    repo = tmp_path / "hub" / "models--x--b"
    repo.mkdir(parents=True)
    (repo / "snapshots").symlink_to(real.parent, target_is_directory=True)
    (tmp_path / "hub" / "models--x--c").symlink_to(real.parent.parent, target_is_directory=True)
    for snap in (repo / "snapshots" / "0123abc", tmp_path / "hub" / "models--x--c" / "snapshots" / "0123abc"):
        assert_refused(lambda: side_files(snap), snap / SIDE, secret_dir / "id_rsa")


def test_a_blob_inside_a_directory_symlinked_from_within_blobs_is_refused(pair, secret_dir, tmp_path):
    _, b = pair
    snap = snapshot(b, tmp_path / "hub" / "models--x--b")
    (snap.parent.parent / "blobs" / "sub").symlink_to(secret_dir, target_is_directory=True)
    (snap / SIDE).symlink_to(Path("..") / ".." / "blobs" / "sub" / "id_rsa")
    with pytest.raises(CheckpointError, match=SIDE):
        side_files(snap)


# ----------------------------------------------------------------------------------------- still allowed
def test_the_genuine_cache_layout_works_also_through_symlinks_to_the_cache_or_the_snapshot(pair, tmp_path):
    a, b = pair
    shutil.copytree(b, tmp_path / "b-side")
    (tmp_path / "b-side" / SIDE).write_text('{"bos_token": "<s>"}')
    snap_a = snapshot(a, tmp_path / "disk" / "hub" / "models--x--a")
    snapshot(tmp_path / "b-side", tmp_path / "disk" / "hub" / "models--x--b")
    (tmp_path / "cache").symlink_to(tmp_path / "disk", target_is_directory=True)  # ~/.cache/huggingface on a disk
    snap_b = tmp_path / "cache" / "hub" / "models--x--b" / "snapshots" / "0123abc"
    assert all(p.is_symlink() for p in snap_b.iterdir())
    align_hf_checkpoints(snap_a, snap_b, tmp_path / "o", restarts=1, max_iter=1)
    assert (tmp_path / "o" / SIDE).read_text() == '{"bos_token": "<s>"}'
    (tmp_path / "my-model").symlink_to(snap_b, target_is_directory=True)  # a symlink to the snapshot
    assert side_files(tmp_path / "my-model")[SIDE].read_text() == '{"bos_token": "<s>"}'


# --------------------------------------------------------------------------------------------- negative control
def test_negative_control_with_the_old_allowance_the_private_file_is_copied(pair, secret_dir, tmp_path, monkeypatch):
    """With the allowance as it was (``blobs`` resolved wherever it points), the private file ends up in the output."""
    monkeypatch.setattr(io_mod, "_cache_blobs", lambda snap: (snap.parent.parent / "blobs").resolve()
                        if snap.parent.name == "snapshots" else None)
    a, b = pair
    snap = leaky(b, tmp_path / "hub" / "models--x--b", secret_dir)
    align_hf_checkpoints(a, snap, tmp_path / "o", restarts=1, max_iter=1)
    assert (tmp_path / "o" / SIDE).read_text() == SECRET  # leaked
