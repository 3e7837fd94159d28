"""Trust round 3, class 11: no option is silently ignored, and options that make sense for every kind are accepted.

Every option of ``align``, ``merge``, ``barrier``, ``path`` and ``check`` (read from the typer commands themselves,
so a new option joins the enumeration) is given a non-default value on every path: checkpoint kind (modeconn,
Hugging Face, modeconn language model) × method. Each must either apply — the run succeeds, and where the output
records the setting, it records the value given — or be refused (exit 2) by an error naming the option. Which of the
two is expected is the table :data:`SCENARIOS` (``applies``); the check of this class is :func:`applied_or_named`.
``--restarts`` applies to weight matching of every kind; ``--shard`` is refused by weight matching and by Hugging
Face streaming. The negative control puts back the old behaviour (options outside a path's own checks ignored) and
shows ``--shard`` on streaming weight matching exit 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
import torch
import typer

from modeconn.cli import app
from modeconn.io import save_checkpoint
from modeconn.models import build_model
from modeconn.recipes import align as align_recipe
from modeconn.recipes.align import ALIGN_SCOPES
from modeconn.recipes.merge import MERGE_SCOPES

from cli_runner import run_cli
from hf_tiny import make

VALUES = {  # a value other than the default, for every option enumerated (flags: None)
    "seed": "3", "restarts": "2", "max_iter": "3", "device": "cpu", "groups": "full", "shard": None,
    "download": None, "dataset": "digits", "data": "SHARED", "limit_train": "100", "steps": "2", "lr": "0.02",
    "lambda_schedule": "fixed", "lambda_value": "0.3", "parameterization": "matrix_exp", "batch_size": "4",
    "bn": "interpolate", "dtype": "float16", "normalize": None, "budget": "5", "continuity_tol": "0.1",
    "resume": None, "max_batches": "2", "eval_limit": "100", "lambdas": "3", "sub_points": "2",
    "split": "test", "text_field": "body", "context_length": "8", "label_field": "y", "eval_tasks": "no_such_task",
    "include_path": ".",
}
RECORDED = {
    "align": {"seed", "restarts", "max_iter", "steps", "lr", "lambda_schedule", "lambda_value", "parameterization",
              "batch_size", "shard"},
    "merge": {"seed", "restarts", "max_iter", "bn", "dtype"},
}
"""Per command, the options whose applied value its JSON records (under the option's name; ``dtype`` as
``out_dtype``)."""
RECORD_KEYS = {"dtype": "out_dtype"}
USER_DATA = {"split", "text_field", "label_field", "context_length"}
"""Options of the user's own data: their scope is the data (the CLI's ``user_data`` refuses them, by name, without a
``--dataset`` path; an image folder refuses the text ones), not the recipe's scope table."""
UNIVERSAL = {
    "align": {"a", "b", "out", "method", "option", "overwrite", "seed"},
    "merge": {"models", "out", "config", "weights", "rule", "base", "param", "align_method", "option", "overwrite",
              "seed"},
    "barrier": {"a", "b", "method", "option", "out", "overwrite", "lambdas", "eval_limit", "seed"},
    "path": {"a", "b", "method", "option", "out", "overwrite", "sub_points", "eval_limit", "seed"},
    "check": {"a", "b", "out", "overwrite"},
}
"""Parameters that apply to every path of the command (inputs, outputs, the method itself; ``--seed`` seeds every
random choice of a run, and a run that makes none gives its one result for any seed)."""

SCENARIOS = {
    # (command, kind, method): (arguments after the two inputs, options that apply)
    ("align", "modeconn", "weight"): ([], {"seed", "restarts", "max_iter", "device"}),
    ("align", "modeconn", "activation"): (["--method", "activation"], {"dataset", "data", "download", "limit_train"}),
    ("align", "modeconn", "learned"): (["--method", "learned", "--steps", "2", "--limit-train", "64"],
                                       {"dataset", "data", "download", "seed", "lr", "lambda_schedule",
                                        "lambda_value"}),
    ("align", "lm", "dual"): (["--method", "dual", "--steps", "1", "--batch-size", "4", "--limit-train", "16",
                               "--data", "TEXT"],
                              {"dataset", "download", "seed", "lr", "lambda_schedule", "lambda_value", "parameterization",
                               "shard", "restarts", "max_iter", "device"}),
    ("align", "huggingface", "weight"): (["--max-iter", "2"], {"seed", "restarts", "groups", "device"}),
    ("merge", "modeconn", "weight"): ([], {"bn", "dataset", "data", "limit_train", "seed", "restarts", "max_iter",
                                           "device"}),
    ("merge", "modeconn", "none"): (["--align", "none"], {"bn", "dataset", "data", "limit_train"}),
    ("merge", "huggingface", "weight"): (["--max-iter", "2"], {"seed", "restarts", "dtype", "device"}),
    ("merge", "huggingface", "none"): (["--align", "none"], {"dtype", "device"}),
    ("barrier", "modeconn", "weight"): (["--method", "weight", "--lambdas", "2", "--eval-limit", "50"],
                                        {"dataset", "data", "download", "limit_train", "seed"}),
    ("barrier", "huggingface", "naive"): (["--dataset", "austen", "--method", "naive", "--lambdas", "2",
                                           "--eval-limit", "8", "--limit-train", "16"], {"data", "download"}),
    ("path", "modeconn", "linear"): (["--method", "linear", "--eval-limit", "50", "--sub-points", "1"],
                                     {"budget", "dataset", "data", "download", "limit_train", "continuity_tol"}),
    ("path", "huggingface", "linear"): (["--dataset", "austen", "--method", "linear", "--eval-limit", "8",
                                         "--limit-train", "16", "--sub-points", "1"],
                                        {"budget", "data", "download", "continuity_tol"}),
    ("check", "modeconn", "-"): (["--eval-limit", "200", "--max-batches", "1"],
                                 {"dataset", "data", "download", "limit_train", "seed", "device"}),
}
LM_VALUES = {"limit_train": "16", "dataset": "austen"}


def command_options(command: str) -> dict[str, click.Parameter]:
    """The command's parameters as typer declares them: name → click parameter."""
    group = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params}


def flag_of(param: click.Parameter, value) -> list[str]:
    """The command-line words giving ``param`` a non-default value."""
    if param.is_flag:
        return [param.secondary_opts[0] if param.default is True else param.opts[0]]
    return [param.opts[0], value]


def _records(out: Path) -> list:
    return [json.loads(p.read_text()) for p in out.rglob("*.json") if p.name != ".modeconn-output.json"]


def _find(record, key: str) -> list:
    """Every value stored under ``key`` anywhere in a JSON record."""
    if isinstance(record, dict):
        return [v for k, v in record.items() if k == key] + [x for v in record.values() for x in _find(v, key)]
    if isinstance(record, list):
        return [x for v in record for x in _find(v, key)]
    return []


def _as_recorded(value):
    if value is None:
        return True
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def applied_or_named(res, command: str, param: click.Parameter, applies: bool, out: Path) -> None:
    """The check of this class: an option that applies ran (exit 0, or 3 for an incomplete path) and, where the
    output records it, records the value given; any other option was refused (exit 2) with an error naming it."""
    name, shown = param.name, " ".join(map(str, flag_of(param, VALUES.get(param.name))))
    if not applies:
        assert res.exit_code == 2, f"{shown} was silently accepted:\n{res.output}"
        assert any(o in res.output for o in (*param.opts, *param.secondary_opts)), f"{shown}: {res.output}"
        return
    assert res.exit_code in (0, 3), f"{shown} should apply here:\n{res.output}"
    if name in RECORDED.get(command, ()):
        found = [v for r in _records(out) for v in _find(r, RECORD_KEYS.get(name, name))]
        assert _as_recorded(VALUES[name]) in found, f"{shown} not recorded as given: {found}"
    if name == "groups":
        assert (out / "a").is_dir() and (out / "b").is_dir()  # --groups full writes both absorbed endpoints


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def inputs(tmp_path_factory, shared_data):
    """modeconn MLPs, Hugging Face Llamas (for align / merge), Qwen2 causal LMs with a tokenizer (for barrier / path)
    and gpt-neox-tiny language-model checkpoints with a small text directory (for dual matching)."""
    from modeconn.data import train_tokenizer
    from hf_tiny import randomize
    import transformers as T

    root = tmp_path_factory.mktemp("scope")
    kinds = {}
    kinds["modeconn"] = [save_checkpoint(root / f"mc{s}", build_model("mlp", in_shape=(1, 8, 8), num_classes=10,
                                                                       depth=1, width=8, seed=s),
                                         config={"dataset": "digits"}) for s in (0, 1)]
    for s in (0, 1):
        make("llama", s).save_pretrained(root / f"hf{s}")
    kinds["huggingface"] = [root / "hf0", root / "hf1"]
    words = ["the", "sister", "said", "Elinor", "and", "Marianne", "walked", "to", "Barton", "cottage"]
    gen = torch.Generator().manual_seed(0)
    text = ".\n".join(" ".join(words[i] for i in torch.randint(0, len(words), (12,), generator=gen).tolist())
                      for _ in range(300)) + ".\n"
    (root / "text").mkdir()
    (root / "text" / "austen.txt").write_text(text)
    tok = train_tokenizer(text, 300)
    cfg = T.Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        num_hidden_layers=1, vocab_size=320, max_position_embeddings=64, pad_token_id=0)
    for s in (0, 1):
        randomize(T.Qwen2ForCausalLM(cfg), s).save_pretrained(root / f"qw{s}")
        (root / f"qw{s}" / "tokenizer.json").write_text(tok.to_str())
    kinds["causal"] = [root / "qw0", root / "qw1"]
    dataset = {"dataset": "austen", "dataset_options": {"vocab_size": 300, "context_length": 32, "verify": False}}
    kinds["lm"] = [save_checkpoint(root / f"lm{s}", build_model("gpt-neox-tiny", in_shape=(32,), num_classes=300,
                                                                 hidden_size=32, num_hidden_layers=1,
                                                                 num_attention_heads=2, intermediate_size=64, seed=s),
                                   config=dataset) for s in (0, 1)]
    return kinds, root / "text", shared_data


def _argv(inputs, scenario, name: str | None, out: Path) -> list:
    command, kind, _ = scenario
    kinds, text, shared = inputs
    pair = kinds["causal" if command in ("barrier", "path") and kind == "huggingface" else kind]
    base = [text if a == "TEXT" else a for a in SCENARIOS[scenario][0]]
    value = str(shared) if name == "data" else LM_VALUES.get(name) if kind == "lm" else None
    extra = flag_of(command_options(command)[name], value or VALUES[name]) if name is not None else []
    return [command, *pair, *base, *extra, "--out", out]


def _enumerated(scenario) -> list[str]:
    """The options a scenario gives a value to: every option of its command but the universal ones and those its
    base arguments already give."""
    command = scenario[0]
    given = {a.lstrip("-").replace("-", "_") for a in SCENARIOS[scenario][0] if str(a).startswith("--")}
    return sorted(n for n in command_options(command) if n not in UNIVERSAL[command] and n not in given)


CASES = [(s, n) for s in SCENARIOS for n in _enumerated(s)]


def test_every_option_of_every_command_is_classified():
    """A new option cannot slip past this test: each is universal, or has a value here and a scope in its recipe."""
    for command in UNIVERSAL:
        for name in command_options(command):
            if name in UNIVERSAL[command]:
                continue
            assert name in VALUES, f"{command} {name}: give it a test value and a scenario row"
            scopes = {"align": ALIGN_SCOPES, "merge": MERGE_SCOPES}.get(command)
            if scopes is not None and name not in USER_DATA:
                assert name in scopes, f"{command} {name}: not in the recipe's scope table"


@pytest.mark.parametrize("scenario, name", CASES, ids=[f"{'-'.join(s)}-{n}" for s, n in CASES])
def test_every_option_applies_or_is_refused_by_name(inputs, tmp_path, scenario, name):
    out = tmp_path / "out"
    res = run_cli(*_argv(inputs, scenario, name, out), ok=False)
    applied_or_named(res, scenario[0], command_options(scenario[0])[name], name in SCENARIOS[scenario][1], out)


def test_restarts_apply_to_weight_matching_of_every_kind(inputs, tmp_path):
    kinds = inputs[0]
    for kind in ("modeconn", "huggingface"):
        for command in ("align", "merge"):
            out = tmp_path / f"{command}-{kind}"
            run_cli(command, *kinds[kind], "--restarts", "3", "--max-iter", "4", "--out", out)
            assert 3 in [v for r in _records(out) for v in _find(r, "restarts")], command


def test_negative_control_without_the_scope_check_shard_is_ignored(inputs, tmp_path, monkeypatch):
    """Remove the check (the behaviour before the fix): ``--shard`` on streaming weight matching exits 0 and is
    ignored, and :func:`applied_or_named` reports it."""
    kinds = inputs[0]
    monkeypatch.setattr(align_recipe, "check_scope", lambda *a, **k: None)
    out = tmp_path / "o"
    res = run_cli("align", *kinds["huggingface"], "--max-iter", "2", "--shard", "--out", out, ok=False)
    with pytest.raises(AssertionError, match="silently accepted"):
        applied_or_named(res, "align", command_options("align")["shard"], False, out)
