"""The import baseline of a streaming command: the command line and the streaming back-ends import nothing
they do not use — no torchvision, timm, mergekit, datasets or matplotlib until a command that needs one runs, and for a
table family's checkpoint none of transformers' model classes (the spec comes from tensor names and the config).

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


MODEL_CLASSES = ("transformers.modeling_utils", "torch._dynamo", "torch.distributed.tensor")
"""What transformers' model classes pull in (a family's modeling module is listed too: ``.modeling_<family>``; the auto
classes' name tables, ``transformers.models.auto.modeling_auto``, import no model class and are not)."""


def _heavy_after(code: str, cwd: Path, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of ``heavy`` in ``sys.modules`` after ``code`` runs in a fresh interpreter, and any family's
    transformers modeling module (``transformers.models.<family>.modeling_<family>``, not ``auto``'s name tables)."""
    probe = (f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m in {heavy!r} or "
             "m.startswith('transformers.models.') and '.modeling_' in m and not m.startswith('transformers.models.auto.'))))")
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


_SPEC_AND_MATCH = (
    "from modeconn.stream import hf_checkpoint_spec, stream_weight_matching\n"
    "spec = hf_checkpoint_spec('m0')\n"
    "stream_weight_matching(spec, 'm0', 'm1', restarts=1, max_iter=1)\n"
)


def _gpt_neox_pair(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=50,
               max_position_embeddings=32, bos_token_id=0, eos_token_id=0)
    for seed in (0, 1):
        torch.manual_seed(seed)
        transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**cfg)).save_pretrained(tmp_path / f"m{seed}")


def test_streaming_spec_of_a_table_family_imports_no_model_class(tmp_path):
    """The spec and streaming weight matching of two GPT-NeoX directories: no model class, no torch._dynamo, no
    torchvision (transformers' modeling code imports them), nothing of :data:`HEAVY`."""
    _gpt_neox_pair(tmp_path)
    assert _heavy_after(_SPEC_AND_MATCH, tmp_path, HEAVY + MODEL_CLASSES) == []


def test_probe_sees_the_model_class_route(tmp_path):
    """Negative control: the same run with the skeleton route switched off builds the model class, and the probe
    lists its modules."""
    _gpt_neox_pair(tmp_path)
    off = "import modeconn.symmetry.hf.skeleton as s\ns.SKELETON_FAMILIES = frozenset()\n"
    found = _heavy_after(off + _SPEC_AND_MATCH, tmp_path, HEAVY + MODEL_CLASSES)
    assert {"transformers.modeling_utils", "transformers.models.gpt_neox.modeling_gpt_neox"} <= set(found)


@pytest.mark.slow
def test_streaming_align_and_merge_run_import_nothing_heavy_of_modeconns_own(tmp_path):
    """``modeconn align`` and ``merge`` of two tiny GPT-NeoX directories, run in one fresh process: afterwards nothing
    of :data:`HEAVY`, no torchvision and no model class (a table family's spec needs none)."""
    _gpt_neox_pair(tmp_path)
    code = (
        "from modeconn.cli import app\n"
        "for argv in (['align', 'm0', 'm1', '--out', 'aligned'], ['merge', 'm0', 'm1', '--out', 'merged']):\n"
        "    try:\n"
        "        app(argv, prog_name='modeconn')\n"
        "    except SystemExit as e:\n"
        "        assert not e.code, (argv, e.code)\n"
    )
    heavy = _heavy_after(code, tmp_path, HEAVY + MODEL_CLASSES)
    assert (tmp_path / "aligned" / "config.json").exists() and (tmp_path / "merged" / "config.json").exists()
    assert heavy == []
