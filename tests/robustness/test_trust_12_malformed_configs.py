"""Trust class 12 — malformed configs.

A Hugging Face ``config.json`` with a string layer count, ``n_head: 0`` or a negative size crashed the CLI with a
traceback (TypeError, ZeroDivisionError, torch's RuntimeError); ``"width": 1e12`` in a modeconn config raised
torch's raw RuntimeError; a huge layer count took 30–100 s to fail (transformers and modeconn builders spend about
a millisecond per layer even on the meta device). Each is now a ConfigError naming the file and the field, raised
before any model is built or memory allocated:

* HF configs (:mod:`modeconn.symmetry.hf.config_check`): size fields are ints ≥ 1 (bool is not an int), hidden
  size divisible by heads, heads by kv heads, an estimated parameter count bound, and a layer count the
  checkpoint's tensors can hold — all before the meta-device model is built;
* modeconn configs (:func:`modeconn.models.build_model`): every size argument ≤ ``MAX_SIZE``, bools refused for
  non-bool arguments, and parameters / tensors / submodules counted while the model is first built on the meta
  device (the general rule: an estimated parameter count bound, for every architecture);
* ``format_version`` newer than :data:`modeconn.io.FORMAT_VERSION` (or not an integer) is refused.
On the command line each is exit code 2 with the message, never a traceback.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
from contextlib import nullcontext
from pathlib import Path

import pytest
from cli_runner import run_cli
from hf_tiny import make

from modeconn.errors import ConfigError
from modeconn.io import FORMAT_VERSION, load_checkpoint, read_config, save_checkpoint
from modeconn.models import build_model
from modeconn.stream import hf_checkpoint_spec
from modeconn.symmetry.hf.directory import hf_config

config_check_mod = importlib.import_module("modeconn.symmetry.hf.config_check")
build_mod = importlib.import_module("modeconn.models._build")


def _flat(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _boom(*args, **kwargs):
    raise AssertionError("a model was built from a malformed config")


def assert_config_error_cli(res, file: Path, field: str) -> None:
    """The check of this class on the command line: exit 2, the file and the field named, no traceback."""
    assert res.exit_code == 2, (res.exit_code, repr(res.exception), res.output)
    assert _flat(str(file)) in _flat(res.output) and field in res.output, res.output
    assert "Traceback" not in res.output


# ------------------------------------------------------------------------------------------ Hugging Face configs
@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfcfg")
    out = {}
    for name in ("gpt_neox", "gpt2", "llama"):
        make(name).save_pretrained(root / name)
        out[name] = root / name
    return out


def malformed(src: Path, dst: Path, **fields) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **fields}))
    return dst


HF_CASES = {
    "string layer count": ("gpt_neox", "num_hidden_layers", "2"),
    "zero heads (gpt2 n_head)": ("gpt2", "n_head", 0),
    "negative hidden size": ("gpt_neox", "hidden_size", -32),
    "bool layer count": ("gpt_neox", "num_hidden_layers", True),
    "float intermediate size": ("gpt_neox", "intermediate_size", 64.0),
    "hidden not divisible by heads": ("gpt_neox", "hidden_size", 30),
    "heads not divisible by kv heads": ("llama", "num_key_value_heads", 3),
    "absurd hidden size (parameter bound)": ("gpt_neox", "hidden_size", 10**9),
    "huge layer count (more than the checkpoint holds)": ("gpt_neox", "num_hidden_layers", 100_000),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_malformed_hf_config_is_a_config_error_naming_file_and_field(hf_dirs, tmp_path, monkeypatch, case):
    family, field, value = HF_CASES[case]
    bad = malformed(hf_dirs[family], tmp_path / "bad", **{field: value})
    monkeypatch.setattr(config_check_mod, "build_meta_model", _boom)  # refused before any model is built
    with pytest.raises(ConfigError) as err:
        hf_checkpoint_spec(bad)
    assert str(bad / "config.json") in str(err.value) and field in str(err.value)
    res = run_cli("align", bad, bad, "--out", tmp_path / "o", "--restarts", "1", "--max-iter", "1", ok=False)
    assert_config_error_cli(res, bad / "config.json", field)
    assert not (tmp_path / "o").exists()


def test_valid_hf_configs_still_build(hf_dirs):
    for d in hf_dirs.values():
        assert hf_checkpoint_spec(d, config=hf_config(d)).spaces


# ----------------------------------------------------------------------------------------- modeconn configs
@pytest.fixture(scope="module")
def mlp_checkpoint(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("mccfg") / "c", build_model(
        "mlp", in_shape=(1, 2, 2), num_classes=2, depth=1, width=3, seed=0))


def edited(src: Path, dst: Path, kwargs=None, **top) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["kwargs"].update(kwargs or {})
    cfg.update(top)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


MC_CASES = {
    "width 1e12": ({"width": 1e12}, {}, "width"),
    "depth 10**6": ({"depth": 10**6}, {}, "depth"),
    "width 10**6 and depth 10**4 (parameter bound)": ({"width": 10**6, "depth": 10**4}, {}, "width"),
    "bool width": ({"width": True}, {}, "width"),
    "newer format_version": ({}, {"format_version": FORMAT_VERSION + 1}, "format_version"),
    "string format_version": ({}, {"format_version": "1"}, "format_version"),
}


@pytest.mark.parametrize("case", list(MC_CASES))
def test_malformed_modeconn_config_is_a_config_error_naming_file_and_field(mlp_checkpoint, tmp_path, case):
    kwargs, top, field = MC_CASES[case]
    bad = edited(mlp_checkpoint, tmp_path / "bad", kwargs, **top)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(bad)
    assert str(bad / "config.json") in str(err.value) and field in str(err.value), str(err.value)
    res = run_cli("align", bad, bad, "--out", tmp_path / "o", ok=False)
    assert_config_error_cli(res, bad / "config.json", field)
    assert not (tmp_path / "o").exists()


def test_format_version_newer_than_supported_is_refused_by_read_config(mlp_checkpoint, tmp_path):
    assert read_config(mlp_checkpoint)["format_version"] == FORMAT_VERSION
    bad = edited(mlp_checkpoint, tmp_path / "bad", format_version=FORMAT_VERSION + 1)
    with pytest.raises(ConfigError, match="newer than this modeconn supports"):
        read_config(bad)


def test_build_model_bounds_sizes_for_every_caller():
    for kwargs, field in (({"width": 2**30}, "width"), ({"depth": 10**6}, "depth"), ({"width": True}, "width")):
        with pytest.raises(ConfigError, match=field):
            build_model("mlp", in_shape=(1, 8, 8), num_classes=10, **kwargs)
    with pytest.raises(ConfigError, match="width"):  # a float multiplier: caught by the parameter count
        build_model("vgg", in_shape=(3, 32, 32), num_classes=10, width=1e6)


# --------------------------------------------------------------------------------------------- negative control
def test_negative_control_without_the_checks_malformed_configs_crash_or_build(hf_dirs, mlp_checkpoint, tmp_path,
                                                                            monkeypatch):
    """With the guards removed the same inputs give the raw errors of the issue (a traceback-worthy exception, not
    a ConfigError) or start building the huge model: the checks above are what turns them into clear errors."""
    monkeypatch.setattr(config_check_mod, "validate_hf_config", lambda cfg, file: None)
    negative = malformed(hf_dirs["gpt_neox"], tmp_path / "negative", hidden_size=-32)
    res = run_cli("align", negative, negative, "--out", tmp_path / "o", ok=False)
    with pytest.raises(AssertionError):  # only the build fallback is left: it names the file, not the field
        assert_config_error_cli(res, negative / "config.json", "hidden_size")

    real_build = config_check_mod.build_meta_model

    def unguarded(config, file):  # the build without its error translation, as before this class was closed
        import torch
        import transformers

        with torch.device("meta"):
            return getattr(transformers, config.architectures[0])(config)

    monkeypatch.setattr(config_check_mod, "build_meta_model", unguarded)
    bad = malformed(hf_dirs["gpt2"], tmp_path / "gpt2-bad", n_head=0)
    res = run_cli("align", bad, bad, "--out", tmp_path / "o", ok=False)
    assert isinstance(res.exception, ZeroDivisionError), (repr(res.exception), res.output)  # the crash
    with pytest.raises(AssertionError):
        assert_config_error_cli(res, bad / "config.json", "n_head")
    assert real_build is not unguarded

    monkeypatch.setattr(config_check_mod, "check_fits_checkpoint", lambda config, file, n: None)
    monkeypatch.setattr(config_check_mod, "build_meta_model", _boom)
    huge = malformed(hf_dirs["gpt_neox"], tmp_path / "huge", num_hidden_layers=100_000)
    with pytest.raises(AssertionError, match="a model was built"):  # would now build 100,000 layers (minutes)
        hf_checkpoint_spec(huge)

    monkeypatch.setattr(build_mod, "check_size_bounds", lambda what, kwargs: None)
    monkeypatch.setattr(build_mod, "parameter_budget", lambda what, kwargs: nullcontext())
    wide = edited(mlp_checkpoint, tmp_path / "wide", {"width": 1e12, "depth": 2})  # a 1e12 × 1e12 weight
    with pytest.raises(RuntimeError) as err:  # torch's raw error, as in the issue
        load_checkpoint(wide)
    assert not isinstance(err.value, ConfigError)
