"""Class 15 — results written non-atomically.

A run killed while it writes must leave the previous results intact. Checkpoints, state-dict files, path
manifests and experiment result directories are assembled in a temporary sibling and renamed into place
(``os.replace``); on an error the temporary is removed and, when overwriting, the previous version is restored.
Simulated crashes (a writer that raises half-way, a failing final swap) and a real SIGKILL of a subprocess
half-way through overwriting a checkpoint all leave the previous version byte-identical and loadable.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from modeconn._util import outdir as outdir_mod
from modeconn.experiments.output import output_directory, write_json
from modeconn.io import load_checkpoint, load_state_dict, save_checkpoint, save_state_dict
from modeconn.models import build_model
from modeconn._util.atomic import atomic_write_text

io_mod = importlib.import_module("modeconn.io.checkpoint")
pathobj_mod = importlib.import_module("modeconn.path.pathobj")


def _model(seed: int):
    return build_model("mlp", in_shape=(1, 2, 2), num_classes=2, depth=1, width=3, seed=seed)


def snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())} if path.is_dir() else {path.name: path.read_bytes()}


def assert_previous_intact(path: Path, before: dict[str, bytes], *, clean: bool = True) -> None:
    """The check of this class: the previous version is still at ``path``, byte for byte (and, for an
    in-process failure, no temporary sibling is left behind)."""
    assert path.exists(), f"{path} is gone: the previous results were lost"
    assert snapshot(path) == before, f"{path} was modified by the interrupted write"
    if clean:
        assert sorted(p.name for p in path.parent.iterdir()) == [path.name], "temporary files left behind"


def _half_then(exc):
    real = io_mod.save_file

    def writer(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 2])  # the crash happens half-way through the file
        raise exc

    return writer


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()], ids=["oserror", "interrupt"])
def test_checkpoint_overwrite_interrupted_mid_write(tmp_path, monkeypatch, exc):
    target = save_checkpoint(tmp_path / "ckpt", _model(0), metrics={"acc": 0.5})
    before = snapshot(target)
    monkeypatch.setattr(io_mod, "save_file", _half_then(exc))
    with pytest.raises((OSError, KeyboardInterrupt, io_mod.CheckpointError)):
        save_checkpoint(target, _model(1), metrics={"acc": 0.9}, overwrite=True)
    assert_previous_intact(target, before)
    monkeypatch.undo()
    loaded, _ = load_checkpoint(target)
    assert all(torch.equal(v, _model(0).state_dict()[k]) for k, v in loaded.state_dict().items())


def test_state_dict_file_interrupted_mid_write(tmp_path, monkeypatch):
    target = save_state_dict(tmp_path / "w.safetensors", {"a": torch.ones(4)})
    before = snapshot(target)
    monkeypatch.setattr(io_mod, "save_file", _half_then(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        save_state_dict(target, {"a": torch.zeros(4)})
    assert_previous_intact(target, before)
    assert torch.equal(load_state_dict(target)["a"], torch.ones(4))


def test_path_manifest_interrupted_mid_write(tmp_path, monkeypatch):
    target = tmp_path / "manifest.json"
    atomic_write_text(target, '{"old": true}')
    before = snapshot(target)
    monkeypatch.setattr(pathobj_mod.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("I/O error")))
    with pytest.raises(OSError):
        atomic_write_text(target, '{"new": true, "partial": ' + "0" * 10000)
    assert_previous_intact(target, before)


def _previous_results(tmp_path) -> tuple[Path, dict[str, bytes]]:
    out = tmp_path / "run"
    with output_directory(out) as tmp:
        write_json(tmp / "results.json", {"barrier": 0.1})
        (tmp / "report.md").write_text("old report")
    return out, snapshot(out)


def test_results_directory_interrupted_mid_run(tmp_path):
    out, before = _previous_results(tmp_path)
    with pytest.raises(RuntimeError, match="killed"), output_directory(out, overwrite=True) as tmp:
        write_json(tmp / "results.json", {"barrier": 0.2})
        (tmp / "report.md").write_text("half a rep")
        raise RuntimeError("killed while writing the report")
    assert_previous_intact(out, before)


def _failing_replace(real):
    def replace(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError("rename failed (simulated)")
        return real(src, dst)

    return replace


def _failing_exchange(a, b):
    raise OSError("rename failed (simulated)")


def _failing_second_rename(real):
    def rename(src, dst):
        if ".modeconn-tmp-" in str(src):
            raise OSError("rename failed (simulated)")
        return real(src, dst)

    return rename


@pytest.mark.parametrize("swap", ["exchange", "two renames"])
def test_results_directory_swap_failure_restores_previous(tmp_path, monkeypatch, swap):
    out, before = _previous_results(tmp_path)
    if swap == "exchange":  # the atomic renameat2(RENAME_EXCHANGE) swap fails
        monkeypatch.setattr(outdir_mod, "exchange", _failing_exchange)
    else:  # no exchange on this file system: the fallback's second rename fails
        monkeypatch.setattr(outdir_mod, "exchange", lambda a, b: False)
        monkeypatch.setattr(outdir_mod.os, "rename", _failing_second_rename(os.rename))
    with pytest.raises(OSError, match="simulated"), output_directory(out, overwrite=True) as tmp:
        write_json(tmp / "results.json", {"barrier": 0.2})
    assert_previous_intact(out, before)


@contextlib.contextmanager
def _output_directory_before_the_fix(out, overwrite=False):  # the broken variant (no restore on a failed swap)
    out = Path(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def test_negative_control_swap_without_restore_is_caught(tmp_path, monkeypatch):
    out, before = _previous_results(tmp_path)
    monkeypatch.setattr(os, "replace", _failing_replace(os.replace))
    with pytest.raises(OSError), _output_directory_before_the_fix(out, overwrite=True) as tmp:
        write_json(tmp / "results.json", {"barrier": 0.2})
    with pytest.raises(AssertionError, match="is gone"):
        assert_previous_intact(out, before)


_KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import modeconn.io.checkpoint as mio
    from modeconn.models import build_model

    target, ready = Path(sys.argv[1]), Path(sys.argv[2])
    real = mio.save_file

    def slow(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 2])
        ready.touch()
        time.sleep(120)  # killed here, half-way through writing the new weights

    mio.save_file = slow
    model = build_model("mlp", in_shape=(1, 2, 2), num_classes=2, depth=1, width=3, seed=1)
    mio.save_checkpoint(target, model, metrics={"acc": 0.9}, overwrite=True)
    """
)


@pytest.mark.slow
def test_sigkill_while_overwriting_a_checkpoint(tmp_path):
    target = save_checkpoint(tmp_path / "ckpt", _model(0), metrics={"acc": 0.5})
    before = snapshot(target)
    ready = tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(target), str(ready)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the writer never reached the middle of the write"
            time.sleep(0.05)
    finally:
        proc.kill()  # SIGKILL: no cleanup handler runs
        proc.wait()
    assert proc.returncode == -9
    assert_previous_intact(target, before, clean=False)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("ckpt", "ready")]
    assert all(name.startswith(".ckpt.") for name in leftovers), leftovers  # hidden temporaries only
    loaded, _ = load_checkpoint(target)
    assert all(torch.equal(v, _model(0).state_dict()[k]) for k, v in loaded.state_dict().items())


def test_cli_align_result_is_complete_or_absent(tmp_path, monkeypatch):
    import modeconn.io.checkpoint as mio
    from modeconn.cli import app

    a = save_checkpoint(tmp_path / "a", _model(0))
    b = save_checkpoint(tmp_path / "b", _model(1))
    ok = CliRunner().invoke(app, ["align", str(a), str(b), "--out", str(tmp_path / "fine"), "--method", "weight"])
    assert ok.exit_code == 0 and (tmp_path / "fine" / "alignment.json").is_file()
    real = mio.atomic_write_bytes

    def crash_on_alignment(path, data):
        if Path(path).name == "alignment.json":
            raise OSError("killed while writing alignment.json")
        return real(path, data)

    monkeypatch.setattr(mio, "atomic_write_bytes", crash_on_alignment)
    out = tmp_path / "aligned"
    CliRunner().invoke(app, ["align", str(a), str(b), "--out", str(out), "--method", "weight"])
    assert not out.exists(), "a checkpoint without its alignment.json is in place"
