"""Trust class 4: an output target that will be refused is refused before any heavy work.

Every command and recipe that writes a directory checks ``--out`` (exists and non-empty without ``--overwrite``,
not modeconn's, related to an input) before it reads weights or aligns anything. The check of this class arms
sentinels on the heavy steps — reading weights into memory, weight matching, streaming weight matching — and asserts
that the refusal comes first. The negative control removes the early checks (as before the fix) and shows that the
alignment then runs before the refusal.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import modeconn.recipes.merge_modeconn as merge_mod
import modeconn.io.checkpoint as io_mod
import modeconn.recipes.merge as merge_recipe_mod
import modeconn.recipes.hf_stream as stream_mod
from cli_runner import run_cli
from hf_tiny import make
from modeconn.errors import CheckpointError, ConfigError
from modeconn.recipes.merge_modeconn import run_merge
from modeconn.io import save_checkpoint
from modeconn.match.methods import ALIGNMENT_METHODS
from modeconn.models import build_model
from modeconn.recipes.hf_stream import align_hf_checkpoints, merge_hf_checkpoints


class HeavyWork(RuntimeError):
    pass


def _heavy(name):
    def sentinel(*args, **kwargs):
        raise HeavyWork(f"heavy work started before the --out check: {name}")

    return sentinel


@pytest.fixture
def armed(monkeypatch):
    """The check of this class: any heavy step raises HeavyWork."""
    for mod, attr in ((io_mod, "load_state_dict"), (stream_mod, "weight_matching")):
        monkeypatch.setattr(mod, attr, _heavy(f"{mod.__name__}.{attr}"))
    # merge and the barrier/demo comparisons run alignment methods through the registry (ALIGNMENT_METHODS)
    entry = ALIGNMENT_METHODS.get("weight")
    monkeypatch.setitem(ALIGNMENT_METHODS._items, "weight", dataclasses.replace(entry, fn=_heavy("weight matching")))
    return monkeypatch


@pytest.fixture
def ckpts(tmp_path):
    dirs = []
    for seed in (0, 1):
        model = build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=1, width=8, seed=seed)
        dirs.append(save_checkpoint(tmp_path / f"m{seed}", model, config={"dataset": "digits"}))
    return dirs


@pytest.fixture
def hf_ckpts(tmp_path):
    dirs = [tmp_path / "hf_a", tmp_path / "hf_b"]
    for seed, d in enumerate(dirs):
        make("llama", seed).save_pretrained(d)
    return dirs


@pytest.fixture
def taken(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "results.json").write_text("{}")
    return out


def _argvs(a: Path, b: Path, out: Path) -> dict[str, list]:
    return {
        "align weight": ["align", a, b, "--out", out],
        "align activation": ["align", a, b, "--method", "activation", "--out", out],
        "merge": ["merge", a, b, "--out", out],
        "barrier": ["barrier", a, b, "--out", out],
        "path": ["path", a, b, "--method", "linear", "--out", out],
    }


@pytest.mark.parametrize("command", ["align weight", "align activation", "merge", "barrier", "path"])
def test_cli_refuses_out_before_work(ckpts, taken, armed, command):
    res = run_cli(*_argvs(*ckpts, taken)[command], ok=False)
    assert res.exit_code == 2 and "not empty" in res.output, res.output
    assert not isinstance(res.exception, HeavyWork)


@pytest.mark.parametrize("command", ["align weight", "merge"])
def test_cli_refuses_out_before_streaming_work(hf_ckpts, taken, armed, command):
    res = run_cli(*_argvs(*hf_ckpts, taken)[command], ok=False)
    assert res.exit_code == 2 and "not empty" in res.output, res.output


def test_recipes_refuse_out_before_work(ckpts, hf_ckpts, taken, armed):
    with pytest.raises(CheckpointError, match="not empty"):
        run_merge(ckpts, taken)
    with pytest.raises(CheckpointError, match="not empty"):
        align_hf_checkpoints(*hf_ckpts, taken)
    with pytest.raises(CheckpointError, match="not empty"):
        merge_hf_checkpoints(hf_ckpts, taken)
    with pytest.raises(CheckpointError, match="not written by modeconn"):
        merge_hf_checkpoints(hf_ckpts, taken, overwrite=True)


def test_train_refuses_out_before_loading_data(taken, monkeypatch):
    import modeconn.data as data_mod

    monkeypatch.setattr(data_mod, "load_dataset", _heavy("load_dataset"))
    res = run_cli("train", "--out", taken, "--dataset", "digits", ok=False)
    assert res.exit_code == 2 and "not empty" in res.output, res.output


def test_negative_control_late_check_runs_the_alignment_first(ckpts, taken, armed):
    """Without the early checks (the behaviour before the fix) the alignment runs and only then is --out refused."""
    armed.setattr(merge_recipe_mod, "check_output_target", lambda out, **kw: out)
    armed.setattr(merge_mod, "check_output_target", lambda out, **kw: out)
    armed.setattr(io_mod, "load_state_dict", _real_load_state_dict)
    res = run_cli(*_argvs(*ckpts, taken)["merge"], ok=False)
    assert isinstance(res.exception, HeavyWork), res.output
    with pytest.raises(ConfigError):  # the target would still have been refused — after the work
        from modeconn._util.outdir import check_output_target

        check_output_target(taken)


_real_load_state_dict = io_mod.load_state_dict
