"""Trust class 3: a kill at any moment of an ``--overwrite`` swap leaves a complete output at ``--out``.

The swap is one ``renameat2(RENAME_EXCHANGE)`` where Linux offers it; elsewhere (or on a file system without it) the
old output is renamed aside first, and a kill in the window between the two renames is repaired by the next run on
the same ``--out``. Temporaries of killed runs never accumulate. Kills are real: a child process ends with
``os._exit`` (no ``finally``, no cleanup — as SIGKILL) at the chosen moment. The check of this class is
:func:`complete_output_at` — ``out`` exists with exactly one run's files — plus :func:`no_leftovers`. The negative
control disables the repair and shows the previous output gone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from modeconn._util import outdir as outdir_mod
from modeconn.errors import ConfigError
from modeconn._util.outdir import MARKER, check_output_target, exchange, output_directory

_CHILD = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from modeconn._util import outdir

    out, moment = Path(sys.argv[1]), sys.argv[2]
    real_rename, real_rmtree = os.rename, outdir.shutil.rmtree
    if moment == "between renames":  # no exchange: die after moving the old output aside
        outdir.exchange = lambda a, b: False
        def rename(src, dst):
            real_rename(src, dst)
            if ".modeconn-old-" in str(dst):
                os._exit(9)
        outdir.os.rename = rename
    elif moment == "after exchange":  # die before the swapped-out old output is deleted
        outdir.shutil.rmtree = lambda *a, **k: os._exit(9)
    with outdir.output_directory(out, overwrite=True) as tmp:
        (tmp / "results.json").write_text(json.dumps({"run": "new"}))
        if moment == "mid-write":
            os._exit(9)
""")


def _run_child(out: Path, moment: str) -> int:
    return subprocess.run([sys.executable, "-c", _CHILD, str(out), moment], capture_output=True).returncode


def _first_run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    with output_directory(out) as tmp:
        (tmp / "results.json").write_text(json.dumps({"run": "old"}))
    return out


def complete_output_at(out: Path) -> str:
    """The check of this class: ``out`` is a modeconn output with one run's results; returns which run."""
    assert out.is_dir(), f"{out} is missing: the previous output was lost"
    assert (out / MARKER).is_file(), f"{out} has no ownership marker"
    return json.loads((out / "results.json").read_text())["run"]


def no_leftovers(out: Path) -> None:
    hidden = sorted(p.name for p in out.parent.iterdir() if p.name.startswith("."))
    assert hidden == [], f"hidden temporaries left: {hidden}"


def test_exchange_swaps_or_reports_it_is_unavailable(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    if exchange(a, b):  # Linux renameat2(RENAME_EXCHANGE): swapped in one step
        assert (b / "x").read_text() == "a" and not (a / "x").exists()
    else:  # unavailable on this system / file system: reported, nothing moved (the fallback is tested below)
        assert (a / "x").read_text() == "a" and not (b / "x").exists()


@pytest.mark.parametrize("moment", ["between renames", "after exchange", "mid-write"])
@pytest.mark.slow
def test_kill_during_overwrite_is_repaired_by_the_next_run(tmp_path, moment):
    out = _first_run(tmp_path)
    assert _run_child(out, moment) == 9
    # whatever the moment, the next run on the same --out finds a complete output and leaves no temporaries
    check_output_target(out, overwrite=True)
    expected = {"between renames": "old", "after exchange": "new", "mid-write": "old"}[moment]
    assert complete_output_at(out) == expected
    no_leftovers(out)
    with output_directory(out, overwrite=True) as tmp:
        (tmp / "results.json").write_text(json.dumps({"run": "third"}))
    assert complete_output_at(out) == "third"
    no_leftovers(out)


def test_repair_never_touches_foreign_or_live_siblings(tmp_path):
    out = _first_run(tmp_path)
    # a user's hidden folder that merely looks like ours, and a temporary of a live process (this one)
    foreign = tmp_path / f".run.modeconn-tmp-{outdir_mod._host()}-999999999-abc"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("not modeconn's")
    live = tmp_path / f".run.modeconn-tmp-{outdir_mod._host()}-{outdir_mod.os.getpid()}-xyz"
    live.mkdir()
    (live / MARKER).write_text(json.dumps({"tool": "modeconn"}))
    check_output_target(out, overwrite=True)
    assert (foreign / "mine.txt").exists() and live.exists()


def test_concurrent_runs_use_distinct_temporaries(tmp_path):
    """Two runs on one --out: distinct temporaries; the one finishing second (without --overwrite) is refused at its
    swap and the first one's output stands, complete."""
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="not empty"), output_directory(out) as t1:
        (t1 / "results.json").write_text(json.dumps({"run": "slow"}))
        with output_directory(out) as t2:
            assert t2 != t1 and t2.parent == t1.parent
            (t2 / "results.json").write_text(json.dumps({"run": "fast"}))
    assert complete_output_at(out) == "fast"
    no_leftovers(out)


@pytest.mark.slow
def test_negative_control_without_repair_the_output_is_lost(tmp_path, monkeypatch):
    out = _first_run(tmp_path)
    assert _run_child(out, "between renames") == 9
    monkeypatch.setattr(outdir_mod, "recover_interrupted", lambda out: None)
    check_output_target(out, overwrite=True)
    with pytest.raises(AssertionError, match="was lost"):
        complete_output_at(out)
