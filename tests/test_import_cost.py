"""The import baseline of a streaming command (issue #38): the command line and the streaming back-ends import nothing
they do not use — no torchvision, timm, mergekit, datasets or matplotlib until a command that needs one runs.

Each check runs in a fresh interpreter (this test process has imported everything already) and lists the heavy
packages found in ``sys.modules``; an eager import added back anywhere on these paths makes the list non-empty."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torchvision", "timm", "mergekit", "datasets", "matplotlib")
STREAMING_PATH = ("modeconn", "modeconn.cli", "modeconn.stream", "modeconn.recipes.align", "modeconn.recipes.merge",
                  "modeconn.recipes.hf_stream", "modeconn.checkpoints")
SRC = Path(__file__).resolve().parents[1] / "src"


def _heavy_after(code: str, cwd: Path) -> list[str]:
    """The packages of :data:`HEAVY` in ``sys.modules`` after ``code`` runs in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_streaming_command_path_imports_nothing_heavy(tmp_path):
    assert _heavy_after("\n".join(f"import {m}" for m in STREAMING_PATH), tmp_path) == []


def test_probe_sees_an_eager_import(tmp_path):
    """Negative control: the probe reports a heavy package that the code did import."""
    pytest.importorskip("matplotlib")
    assert _heavy_after("import modeconn.cli\nimport matplotlib", tmp_path) == ["matplotlib"]


@pytest.mark.slow
def test_streaming_align_and_merge_run_import_nothing_heavy_of_modeconns_own(tmp_path):
    """``modeconn align`` and ``merge`` of two tiny GPT-NeoX directories, run in one fresh process: afterwards no
    timm, mergekit, datasets or matplotlib. (torchvision is left out here: transformers' own ``modeling_utils``
    imports it whenever it is installed, and the streaming spec needs the model class on the meta device.)"""
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=50,
               max_position_embeddings=32, bos_token_id=0, eos_token_id=0)
    for seed in (0, 1):
        torch.manual_seed(seed)
        transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**cfg)).save_pretrained(tmp_path / f"m{seed}")
    code = (
        "from modeconn.cli import app\n"
        "for argv in (['align', 'm0', 'm1', '--out', 'aligned'], ['merge', 'm0', 'm1', '--out', 'merged']):\n"
        "    try:\n"
        "        app(argv, prog_name='modeconn')\n"
        "    except SystemExit as e:\n"
        "        assert not e.code, (argv, e.code)\n"
    )
    heavy = _heavy_after(code, tmp_path)
    assert (tmp_path / "aligned" / "config.json").exists() and (tmp_path / "merged" / "config.json").exists()
    assert [m for m in heavy if m != "torchvision"] == []
