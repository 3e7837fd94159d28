"""``modeconn list``: every registry printed from the registries themselves (the sections of the docs' registry
reference), one method's settings with their defaults, and a did-you-mean for a mistyped kind or method."""

from __future__ import annotations

import pytest
from cli_runner import run_cli


def _registries():
    from modeconn.checkpoints import CHECKPOINT_KINDS
    from modeconn.data.datasets import DATASETS
    from modeconn.experiments import EXPERIMENTS
    from modeconn.match.methods import ALIGNMENT_METHODS
    from modeconn.models import MODELS
    from modeconn.path.merge_rules import MERGE_RULES
    from modeconn.path.methods import PATH_METHODS
    from modeconn.symmetry.hf.registry import ADAPTERS

    return {"methods": ALIGNMENT_METHODS, "rules": MERGE_RULES, "path-methods": PATH_METHODS, "families": ADAPTERS,
            "kinds": CHECKPOINT_KINDS, "experiments": EXPERIMENTS, "datasets": DATASETS, "models": MODELS}


@pytest.mark.parametrize("kind", list(_registries()))
def test_each_kind_lists_every_entry_within_80_columns(kind):
    out = run_cli("list", kind).output
    missing = [name for name in _registries()[kind] if name not in out]
    assert missing == []
    assert max(map(len, out.splitlines())) <= 80


def test_settings_of_a_path_method_show_the_o_settings_with_defaults():
    from modeconn.path.llpf import LLPFConfig

    out = run_cli("list", "settings", "llpf").output
    assert [name for name in LLPFConfig.model_fields if f"setting: {name}" not in out] == []
    assert "ticks" in out and "default: 500" in out and "default: 0.01" in out  # LLPFConfig's ticks and step


def test_settings_of_an_alignment_method():
    out = run_cli("list", "settings", "weight").output
    assert "restarts" in out and "restart_rtol" in out and "WeightMatchingConfig" in out


@pytest.mark.parametrize("args,message", [(["rulez"], "Did you mean 'rules'?"),
                                          (["settings", "lpf"], "Did you mean 'llpf'?"),
                                          (["settings", "wieght"], "Did you mean 'weight'?"),
                                          (["settings"], "takes a method name"),
                                          (["rules", "linear"], "takes no name")])
def test_a_mistyped_kind_or_name_is_refused_with_a_hint(args, message):
    res = run_cli("list", *args, ok=False)
    assert res.exit_code == 2 and message in " ".join(res.output.split())
