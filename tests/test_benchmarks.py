"""Smoke tests of benchmark scripts at a tiny ``--scale`` (issue #38): they run end to end and record what they
claim. Never timed assertions — the numbers are the benchmark's, not the test's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.slow
def test_bench_7b_at_a_tiny_scale_recovers_the_planted_permutation(tmp_path):
    """The 7B benchmark's pipeline on a 2-layer pair of Llama-2-7B's head count: the aligned merge recovers the
    planted permutation exactly, the unaligned one does not (negative control: the same check on the plain merge's
    output is what `recovered` would give an unaligned merge), and every output was deleted."""
    out = tmp_path / "bench_7b.json"
    _run("bench_7b.py", "--scale", "0.02", "--layers", "2", "--tmp", str(tmp_path / "work"), "--json", str(out),
         "--keep-cache", "--disk-gib", "0.02", "--shard-bytes", "300000", cwd=tmp_path)
    res = json.loads(out.read_text())
    assert res["model"]["num_attention_heads"] == 32 and res["model"]["num_hidden_layers"] == 2
    assert res["model"]["shards"] > 1
    assert res["weight"]["recovered"]["min_fraction"] == 1.0
    assert res["targets_met"]["planted_recovered_exactly"]
    assert res["weight"]["peak_rss_bytes"] > 0 and res["disk"]["write_bytes_per_s"] > 0
    assert "modeconn" in res["plain"]
    if shutil.which("mergekit-yaml", path=str(Path(sys.executable).parent)):
        assert "mergekit" in res["plain"] and "none_over_mergekit" in res
    assert list((tmp_path / "work").iterdir()) == []  # the pair and every output removed


@pytest.mark.slow
def test_recovered_is_low_for_an_unaligned_merge(tmp_path):
    """Negative control of :func:`_pairs.recovered`: the unaligned average of the planted pair is not recovered."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _pairs import llama_config, recovered, write_pair
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    write_pair(tmp_path, llama_config(0.02, 1), shard_bytes=10**9)
    from modeconn.stream import stream_merge

    stream_merge(None, [tmp_path / "a", tmp_path / "b"], tmp_path / "plain")
    assert recovered(tmp_path / "plain", tmp_path / "a")["min_fraction"] < 0.5
    assert recovered(tmp_path / "a", tmp_path / "a")["min_fraction"] == 1.0
