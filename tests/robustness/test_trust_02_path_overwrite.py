"""Trust class 2 (issue #14) — ``path --overwrite`` destroyed the old run first.

``modeconn path`` used to remove the old ``path/`` before the search and write its results in place, so a kill
or a full disk left an old results.json describing points that no longer existed, and two concurrent runs
could mix their files. Now ``out`` is written through the shared atomic output directory (a uniquely named
temporary sibling, swapped in at the end), and an LLPF search runs in its own modeconn-owned, locked work
directory next to ``out`` (``.<name>.modeconn-work``). A kill at any moment leaves either the previous ``out``
(byte for byte) or the new one, plus at most a resumable search; ``--resume`` continues it, ``--overwrite``
discards it, nothing else touches it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path as FsPath

import pytest
from trust_helpers import FAST_LLPF, digits, quick_run, results, save_pair, snapshot, trained_pair

from modeconn.errors import CheckpointError, ConfigError
from modeconn.recipes import path as paths_mod
from modeconn.recipes.path import work_dir_for
from modeconn.io import load_checkpoint
from modeconn.path import Path, llpf_m2m
from modeconn.path.pathobj import MANIFEST


def assert_previous_whole(out: FsPath, before: dict[str, bytes]) -> None:
    """The check of this class: the previous result is still at ``out``, byte for byte, and its results.json
    describes the path next to it."""
    assert out.is_dir(), f"{out} is gone: the previous result was lost"
    assert snapshot(out) == before, f"{out} was modified by the interrupted run"
    assert len(Path.load(out / "path")) == results(out)["summary"]["points"], "results.json and path/ disagree"


def assert_whole(out: FsPath) -> None:
    """``out`` holds one whole run: results.json describes the path that is next to it."""
    res, path = results(out), Path.load(out / "path")
    assert len(path) == res["summary"]["points"] and path.method.startswith(res["method"]), (res["method"], path.method)


def _interrupt_at(tick):
    def progress(i, total):
        if i == tick:
            raise KeyboardInterrupt
    return progress


def _siblings(out: FsPath) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def test_overwrite_killed_mid_search_keeps_the_old_result_and_a_resumable_search(tmp_path):
    out = tmp_path / "out"
    quick_run(out, "linear", {"n": 5})
    before = snapshot(out)
    with pytest.raises(KeyboardInterrupt):
        quick_run(out, "llpf", overwrite=True, progress=_interrupt_at(3))
    assert_previous_whole(out, before)
    assert _siblings(out) == [work_dir_for(out).name]  # the temporary is gone, the search is kept
    with pytest.raises(ConfigError, match=r"--resume \(resume=True\) to continue it, or --overwrite"):
        quick_run(out, "llpf")
    res = quick_run(out, "llpf", resume=True)  # inherits the interrupted run's permission to replace out
    assert res["method"] == "llpf" and _siblings(out) == []
    assert_whole(out)


def test_a_full_disk_while_writing_the_results_keeps_the_old_result_and_the_finished_search(tmp_path, monkeypatch):
    out = tmp_path / "out"
    quick_run(out, "linear", {"n": 5})
    before = snapshot(out)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(paths_mod, "plot_path_losses", disk_full)
    with pytest.raises(OSError, match="No space left"):
        quick_run(out, "llpf", overwrite=True)
    assert_previous_whole(out, before)
    monkeypatch.undo()
    res = quick_run(out, "llpf", resume=True)  # the finished search is loaded, not run again
    assert res["summary"]["grad_evals"] > 0 and not work_dir_for(out).exists()
    assert_whole(out)


def test_overwrite_replaces_an_interrupted_search_and_resume_needs_one(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        quick_run(out, "llpf", progress=_interrupt_at(3))
    assert not out.exists() and work_dir_for(out).is_dir()
    res = quick_run(out, "llpf", {**FAST_LLPF, "lr": 0.02}, overwrite=True)  # other settings: a fresh search
    assert res["path_info"]["settings"]["lr"] == 0.02 and not work_dir_for(out).exists()
    assert_whole(out)
    with pytest.raises(ConfigError, match="no interrupted search"):
        quick_run(out, "llpf", resume=True)
    with pytest.raises(ConfigError, match="does not checkpoint"):
        quick_run(out, "bezier", {"steps": 2}, resume=True)


def test_foreign_directories_are_never_replaced(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not written by modeconn"):
        quick_run(mine, "linear", {"n": 5}, overwrite=True)
    assert (mine / "notes.txt").read_text() == "keep me"
    out = tmp_path / "out"
    work_dir_for(out).mkdir()
    (work_dir_for(out) / "data.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="not written by modeconn"):
        quick_run(out, "llpf", overwrite=True)
    assert (work_dir_for(out) / "data.bin").read_bytes() == b"x"


def test_a_search_in_use_by_another_process_is_refused(tmp_path):
    import fcntl  # POSIX: where the search's lock exists

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        quick_run(out, "llpf", progress=_interrupt_at(3))
    fd = os.open(work_dir_for(out) / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running search holds
    try:
        for flags in ({"resume": True}, {"overwrite": True}):
            with pytest.raises(ConfigError, match="in use by another modeconn process"):
                quick_run(out, "llpf", **flags)
        assert work_dir_for(out).is_dir()
    finally:
        os.close(fd)


def test_two_concurrent_runs_into_one_out_never_mix(tmp_path):
    out = tmp_path / "out"
    both_writing = threading.Barrier(2, timeout=120)
    errors: list[BaseException] = []

    def run(method, options):
        state = {"waited": False}

        def progress(i, total):
            if not state["waited"]:  # both runs hold their temporary directories at the same time
                state["waited"] = True
                both_writing.wait()

        try:
            quick_run(out, method, options, overwrite=True, progress=progress)
        except BaseException as err:  # noqa: BLE001 - a thread's error is reported by the test below
            errors.append(err)

    threads = [threading.Thread(target=run, args=("linear", {"n": 7})),
               threading.Thread(target=run, args=("bezier", {"steps": 3, "n_points": 5}))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert_whole(out)
    assert _siblings(out) == []


_KILLED_SEARCH = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from modeconn.data import load_dataset
    from modeconn.recipes.path import run_path
    from modeconn.io import load_checkpoint

    a, b, out, ready, options = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), json.loads(sys.argv[5])
    ma, _ = load_checkpoint(a)
    mb, _ = load_checkpoint(b)

    def progress(i, total):
        if i == 5:  # two checkpoints are on disk
            ready.touch()
            time.sleep(120)  # SIGKILLed here, in the middle of the search

    run_path(out, "llpf", ma, mb, load_dataset("digits"), options, eval_limit=200, sub_points=1, bn_batches=1,
             overwrite=True, log=lambda s: None, progress=progress)
    """
)


@pytest.mark.slow
def test_sigkill_during_an_overwriting_search_leaves_the_old_result_and_resume_finishes(tmp_path):
    a, b = save_pair(tmp_path)
    out = tmp_path / "out"
    quick_run(out, "linear", {"n": 5})
    before = snapshot(out)
    ready = tmp_path / "ready"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(FsPath(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_SEARCH, str(a), str(b), str(out), str(ready),
                             json.dumps(FAST_LLPF)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the search never reached tick 5"
            time.sleep(0.05)
    finally:
        proc.kill()  # SIGKILL: no cleanup handler runs
        proc.wait()
    assert proc.returncode == -9
    assert_previous_whole(out, before)
    assert work_dir_for(out).is_dir()
    ma, _ = load_checkpoint(a)
    mb, _ = load_checkpoint(b)
    res = paths_mod.run_path(out, "llpf", ma, mb, digits(), FAST_LLPF, eval_limit=200, sub_points=1, bn_batches=1,
                             resume=True, log=lambda s: None)
    assert res["method"] == "llpf" and _siblings(out) == []  # the killed process's temporary was swept too
    assert_whole(out)


def _search_before_the_fix(out: FsPath, progress) -> None:
    """The old ``run_path`` with --overwrite: remove the old path/ first, then search into it in place."""
    if (out / "path" / MANIFEST).exists():
        shutil.rmtree(out / "path")
    a, b = trained_pair()
    llpf_m2m(a, a.state_dict(), b.state_dict(), digits().train, FAST_LLPF, out_dir=out / "path", progress=progress)


def test_negative_control_the_old_in_place_overwrite_is_caught(tmp_path):
    out = tmp_path / "out"
    quick_run(out, "linear", {"n": 5})
    before = snapshot(out)
    with pytest.raises(KeyboardInterrupt):
        _search_before_the_fix(out, _interrupt_at(3))
    with pytest.raises(AssertionError, match="was modified"):
        assert_previous_whole(out, before)
    with pytest.raises(CheckpointError, match="not a path directory"):  # results.json describes points that are gone
        assert_whole(out)
