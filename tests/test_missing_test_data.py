"""The test session stops at once, naming the directory and how to fix it, when ``$MODECONN_DATA`` does not hold the
shared data sets (a clone outside the README's layout), instead of failing every test that reads them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import modeconn

# pytest's usage-error status, conftest.MISSING_DATA_EXIT (not imported: tests/robustness has a conftest module too)
MISSING_DATA_EXIT = pytest.ExitCode.USAGE_ERROR

PAYLOAD = "from pathlib import Path\n\n\ndef test_runs():\n    Path('ran').write_text('yes')\n"


def _pytest_with_data(tmp_path: Path, data: Path) -> subprocess.CompletedProcess:
    """pytest in a subprocess, with this suite's conftest.py, on one test that leaves a file ``ran`` behind."""
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "test_payload.py").write_text(PAYLOAD)
    src = str(Path(modeconn.__file__).resolve().parents[1])
    env = {**os.environ, "MODECONN_DATA": str(data),
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_payload.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("where", ["empty", "absent"])
def test_a_data_directory_without_the_datasets_stops_the_session_at_once(tmp_path, where):
    data = tmp_path / "data"
    if where == "empty":
        data.mkdir()
    (tmp_path / "run").mkdir()
    run = _pytest_with_data(tmp_path / "run", data)
    out = " ".join((run.stdout + run.stderr).split())
    assert run.returncode == MISSING_DATA_EXIT, out
    assert not (tmp_path / "run" / "ran").exists()  # stopped before any test
    found = "missing mnist, fashion-mnist, austen, minilm" if where == "empty" else "no such directory"
    assert f"{data.resolve()} ($MODECONN_DATA): {found}" in out
    assert "austen/ (austen.txt[.gz])" in out and "minilm/" in out
    assert "clone the repository beside shared/" in out and "MODECONN_DATA=/path/to/shared/data" in out


def test_the_shared_data_directory_lets_the_session_run(tmp_path, shared_data):
    run = _pytest_with_data(tmp_path, shared_data)
    assert run.returncode == 0 and (tmp_path / "ran").read_text() == "yes", run.stdout + run.stderr
