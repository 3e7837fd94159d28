"""Trust round 3, class 1 — remote code.

A checkpoint whose ``config.json`` has a ``model_type`` transformers does not implement and an ``auto_map`` made
transformers ask "Do you wish to run the custom code? [y/N]" in the middle of ``align`` / ``merge``; answering ``y``
imported the checkpoint's Python file. Now a model type transformers does not implement is refused (ConfigError naming
``config.json``, the model type and ``auto_map``) before transformers reads the file, every transformers call passes
``trust_remote_code=False`` (an AST scan of ``src/`` checks each one) and nothing resolves a class named in a file
except among transformers' own classes for the model type (``architectures``, an absorbed checkpoint's
``original_model_type``). The tests run the commands and the API loaders in fresh processes with ``y`` on stdin and
check that the planted file is never imported.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hf_tiny import make

import modeconn
import modeconn as mc
from modeconn.symmetry.absorb import ABSORBED_KEY, save_absorbed

SRC = Path(modeconn.__file__).parent
AUTO_MAP = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel", "AutoModelForCausalLM": "evil.EvilModel"}
EVIL_PY = '''from pathlib import Path
Path({marker!r}).write_text("imported")  # the payload: runs when the file is imported
from transformers import PretrainedConfig, PreTrainedModel


class EvilConfig(PretrainedConfig):
    model_type = "evilnet"


class EvilModel(PreTrainedModel):
    config_class = EvilConfig
'''


def plant(src: Path, dst: Path, marker: Path, edit) -> Path:
    """A copy of checkpoint ``src`` with ``evil.py`` (writes ``marker`` when imported) and ``config.json`` edited."""
    shutil.copytree(src, dst)
    (dst / "evil.py").write_text(EVIL_PY.format(marker=str(marker)))
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def unknown_type(cfg):  # the case
    cfg.update(model_type="evilnet", auto_map=AUTO_MAP, architectures=["EvilModel"])


def known_type(cfg):  # a stock model type, but a custom class named
    cfg.update(auto_map=AUTO_MAP, architectures=["EvilModel"])


def absorbed_unknown_type(cfg):
    cfg[ABSORBED_KEY]["original_model_type"] = "evilnet"
    cfg.update(auto_map=AUTO_MAP)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote")
    marker = root / "IMPORTED"
    make("gpt_neox", 0).save_pretrained(root / "stock")
    save_absorbed(mc.absorb_normalization(make("llama", 0)), root / "absorbed")
    return {"root": root, "marker": marker, "stock": root / "stock",
            "unknown": plant(root / "stock", root / "unknown", marker, unknown_type),
            "known": plant(root / "stock", root / "known", marker, known_type),
            "absorbed": plant(root / "absorbed", root / "evil-absorbed", marker, absorbed_unknown_type)}


def run_python(code: str, root: Path, *args: str) -> subprocess.CompletedProcess:
    """``code`` (or ``-m modeconn ARGS``) in a fresh interpreter, ``y`` on stdin, transformers' module cache in
    ``root``."""
    env = {**os.environ, "HF_MODULES_CACHE": str(root / "hf_modules"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "modeconn", *args] if not code else [sys.executable, "-c", code]
    return subprocess.run(cmd, input="y\n", capture_output=True, text=True, env=env, timeout=600, cwd=root)


API_CALLS = '''
import json, sys, traceback
from pathlib import Path
from modeconn.checkpoints import open_checkpoint
from modeconn.recipes.hf_stream import align_hf_checkpoints, align_hf_full_group, merge_hf_checkpoints
from modeconn.stream import hf_checkpoint_spec
from modeconn.symmetry.hf.directory import hf_config
from modeconn.symmetry.absorb import load_absorbed
from modeconn.symmetry.absorb_stream import stream_absorb
from modeconn.match.memory import Shape

stock, evil, absorbed, out = (Path(p) for p in sys.argv[1:5])
calls = {
    "hf_config": lambda: hf_config(evil),
    "hf_checkpoint_spec": lambda: hf_checkpoint_spec(evil),
    "open_checkpoint().load": lambda: open_checkpoint(evil).load(),
    "align_hf_checkpoints": lambda: align_hf_checkpoints(stock, evil, out / "align"),
    "merge_hf_checkpoints": lambda: merge_hf_checkpoints([stock, evil], out / "merge"),
    "stream_absorb": lambda: stream_absorb(evil, out / "absorb"),
    "align_hf_full_group": lambda: align_hf_full_group(stock, evil, out / "full"),
    "load_absorbed": lambda: load_absorbed(absorbed),
    "hf_checkpoint_spec(absorbed)": lambda: hf_checkpoint_spec(absorbed),
    "open_checkpoint(absorbed).load": lambda: open_checkpoint(absorbed).load(),
    "memory Shape.from_config": lambda: Shape.from_config(json.loads((evil / "config.json").read_text())),
}
result = {}
for name, call in calls.items():
    try:
        call()
        result[name] = ["returned", ""]
    except Exception as err:
        result[name] = [type(err).__name__, str(err)]
print("RESULT " + json.dumps(result))
'''


def api_results(dirs, evil: str) -> dict[str, list[str]]:
    res = run_python(API_CALLS.replace("sys.argv[1:5]", repr([str(dirs["stock"]), str(dirs[evil]),
                                                             str(dirs["absorbed"]), str(dirs["root"] / f"out-{evil}")])),
                     dirs["root"])
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, res.stdout + res.stderr
    return json.loads(line[0].removeprefix("RESULT "))


def assert_refused(result: dict[str, list[str]], names: list[str], field: str, file: Path) -> None:
    for name in names:
        kind, msg = result[name]
        assert kind == "ConfigError" and str(file) in msg and field in msg, (name, kind, msg)


def test_api_loaders_refuse_custom_code_and_never_import_it(dirs):
    result = api_results(dirs, "unknown")
    evil_calls = [n for n in result if "absorbed" not in n and n != "load_absorbed"]
    assert_refused(result, [n for n in evil_calls if n != "memory Shape.from_config"], "auto_map",
                   dirs["unknown"] / "config.json")
    assert result["memory Shape.from_config"][0] == "ConfigError" and "evilnet" in result["memory Shape.from_config"][1]
    assert_refused(result, ["load_absorbed", "hf_checkpoint_spec(absorbed)", "open_checkpoint(absorbed).load"],
                   "auto_map", dirs["absorbed"] / "config.json")
    assert_refused(result, ["load_absorbed"], "original_model_type", dirs["absorbed"] / "config.json")
    assert not dirs["marker"].exists(), "the checkpoint's Python file was imported"


def test_a_custom_class_under_a_stock_model_type_is_refused_by_architectures(dirs):
    result = api_results(dirs, "known")
    assert result.pop("hf_config")[0] == "returned"  # transformers' own GPTNeoXConfig (auto_map ignored, never run)
    assert {kind for kind, _ in result.values()} == {"ConfigError"}, result
    assert_refused(result, ["hf_checkpoint_spec", "open_checkpoint().load", "stream_absorb"], "architectures",
                   dirs["known"] / "config.json")
    assert not dirs["marker"].exists(), "the checkpoint's Python file was imported"


@pytest.mark.parametrize("command", ["align", "merge"])
def test_commands_refuse_custom_code_with_y_on_stdin(dirs, command):
    res = run_python("", dirs["root"], command, str(dirs["stock"]), str(dirs["unknown"]), "--out",
                     str(dirs["root"] / f"cli-{command}"))
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "auto_map" in out and "config.json" in out, out
    assert "Traceback" not in out and "[y/N]" not in out, out
    assert not dirs["marker"].exists(), "the checkpoint's Python file was imported"
    assert not (dirs["root"] / f"cli-{command}").exists()


# ------------------------------------------------------------------------------------------ class-wide guard
LOADERS = {"from_pretrained", "from_config"}


def transformers_calls(tree: ast.AST) -> list[tuple[ast.Call, str]]:
    """Every call of a transformers loader in ``tree``: ``X.from_pretrained(…)``, ``Auto*.from_config(…)``,
    ``Auto*.for_model(…)``, ``pipeline(…)``; with the callee's source."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, name = node.func, ast.unparse(node.func)
        attr = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        if attr == "from_pretrained" or attr == "pipeline" or (
                attr in ("from_config", "for_model") and "Auto" in receiver):
            found.append((node, name))
    return found


def unguarded(tree: ast.AST) -> list[str]:
    """The loader calls of ``tree`` that do not pass ``trust_remote_code=False`` (``for_model``: never allowed — it
    resolves a model type without the check of ``config_check.config_class``)."""
    bad = []
    for call, name in transformers_calls(tree):
        ok = any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False
                 for k in call.keywords)
        if name.endswith("for_model") or not ok:
            bad.append(f"line {call.lineno}: {ast.unparse(call)}")
    return bad


def test_every_transformers_loader_call_in_src_passes_trust_remote_code_false():
    problems, n = [], 0
    for file in sorted(SRC.rglob("*.py")):
        tree = ast.parse(file.read_text(), str(file))
        n += len(transformers_calls(tree))
        problems += [f"{file.relative_to(SRC)} {p}" for p in unguarded(tree)]
    assert not problems, "\n".join(problems)
    assert n >= 6, n  # the scan finds the calls (stream, config_check, checkpoints, experiments)


def test_nothing_resolves_a_transformers_name_read_from_a_file_outside_config_check():
    """``getattr(transformers, <a name>)`` resolves whatever a file names: only ``config_check.model_class`` may,
    and only among transformers' own classes for the model type."""
    hits = []
    for file in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" and node.args \
                    and ast.unparse(node.args[0]) in ("transformers", "T"):
                hits.append(str(file.relative_to(SRC)))
    assert hits == [str(Path("symmetry/hf/config_check.py"))], hits


def test_nothing_in_src_reads_stdin():
    """No prompt anywhere: no ``input()``, no ``sys.stdin``."""
    hits = []
    for file in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "input") or \
                    (isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.stdin"):
                hits.append(f"{file.relative_to(SRC)}:{node.lineno}")
    assert not hits, hits


def test_negative_control_the_guard_flags_a_call_without_the_flag():
    tree = ast.parse("import transformers\n"
                     "transformers.AutoConfig.from_pretrained(p, local_files_only=True)\n"
                     "transformers.AutoModel.from_config(c, trust_remote_code=True)\n"
                     "transformers.AutoConfig.for_model('x')\n"
                     "transformers.pipeline('text-generation', model=p)\n"
                     "transformers.AutoModel.from_pretrained(p, trust_remote_code=False)\n")
    assert len(unguarded(tree)) == 4 and len(transformers_calls(tree)) == 5


def test_negative_control_transformers_imports_the_planted_file_when_asked(dirs, tmp_path):
    """Without ``trust_remote_code=False`` and the model-type check, transformers' own loader asks on stdin and, given
    ``y``, imports ``evil.py``: the tests above would see the marker."""
    marker = tmp_path / "IMPORTED"
    evil = plant(dirs["stock"], tmp_path / "evil", marker, unknown_type)
    res = run_python(f"import transformers; transformers.AutoConfig.from_pretrained({str(evil)!r})", tmp_path)
    assert marker.exists(), res.stdout + res.stderr
