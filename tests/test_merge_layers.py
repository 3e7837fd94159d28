"""Layer positions, gradients and slice plans of merge recipes (modeconn.path.merge_layers), against mergekit's own
reading of a setting where it is installed."""

from __future__ import annotations

import random

import pytest
import torch

from modeconn.errors import ConfigError
from modeconn.path.merge_layers import (OutputSlice, SliceSource, layer_positions, setting_at, stack_plan,
                                        tensor_settings)
from modeconn.path.merge_rules import RuleSettings

KEYS = ["model.embed_tokens.weight", *(f"model.layers.{i}.{m}.weight" for i in range(4)
                                      for m in ("self_attn.q_proj", "mlp.up_proj")), "model.norm.weight",
        "lm_head.weight"]


def test_positions_spread_over_the_layers_and_zero_outside():
    pos = layer_positions(KEYS)
    assert [pos[f"model.layers.{i}.mlp.up_proj.weight"] for i in range(4)] == [0.0, 1 / 3, 2 / 3, 1.0]
    assert pos["model.embed_tokens.weight"] == pos["model.norm.weight"] == pos["lm_head.weight"] == 0.0


def test_setting_at_equals_mergekits_evaluate_setting():
    """Random gradients (numbers, flags, numeric strings), filter lists and positions: the same value as mergekit."""
    config = pytest.importorskip("mergekit.config")
    rng = random.Random(0)
    for _ in range(300):
        kind = rng.choice(["num", "flag", "str"])
        n = rng.randint(1, 6)
        values = [rng.choice([round(rng.uniform(-2, 2), 3), rng.randint(-3, 3)]) if kind == "num" else
                  rng.choice([True, False]) if kind == "flag" else rng.choice(["0.5", "1e-3", "2"]) for _ in range(n)]
        setting = values if rng.random() < 0.5 else [{"filter": "mlp", "value": values}, {"value": values[0]}]
        key, t = rng.choice(KEYS), rng.choice([0.0, 1.0, rng.random()])
        cond = [config.ConditionalParameter(**e) for e in setting] if isinstance(setting[0], dict) else setting
        validate = float if kind != "flag" else bool
        theirs = config.evaluate_setting(key, cond, t, validate=validate)
        ours = setting_at(setting, key, t)
        assert validate(ours) == theirs, (setting, key, t)


def test_a_stack_renumbers_layers_and_takes_head_and_tail_from_the_end_slices():
    slices = [OutputSlice((SliceSource(0, (0, 3)),)), OutputSlice((SliceSource(1, (1, 4)),))]
    plan = {p.key: p for p in stack_plan(slices, KEYS)}
    assert plan["model.layers.4.mlp.up_proj.weight"].inputs == ((1, "model.layers.2.mlp.up_proj.weight"),)
    assert plan["model.layers.2.mlp.up_proj.weight"].t == 1.0 and plan["model.layers.3.mlp.up_proj.weight"].t == 0.0
    assert plan["model.embed_tokens.weight"].inputs == ((0, "model.embed_tokens.weight"),)
    assert plan["lm_head.weight"].inputs == ((1, "lm_head.weight"),) and plan["lm_head.weight"].slice == 1
    assert len(plan) == 1 + 6 * 2 + 2  # embeddings; 6 layers of 2 tensors; final norm, head


def test_tensor_settings_follow_mergekits_precedence():
    """A source's own value, then its slice's, then the recipe's; filters read at the source's input name."""
    sl = OutputSlice((SliceSource(0, (0, 2), {"weight": [{"filter": "layers.2.", "value": 9.0}]}),
                      SliceSource(1, (2, 4))), {"t": [0.0, 1.0]})
    p = next(p for p in stack_plan([sl], KEYS) if p.key == "model.layers.0.mlp.up_proj.weight")
    shared, own = tensor_settings(p, sl, {"weight": 0.5, "t": 0.3})
    assert shared == {"t": 0.0, "weight": 0.5}
    assert own[0]["weight"] == 0.5 and own[1]["weight"] == 0.5  # source 0 reads layer 0: its filter misses
    q = next(p for p in stack_plan([OutputSlice((SliceSource(0, (2, 4), sl.sources[0].params),))], KEYS)
             if p.key == "model.layers.0.mlp.up_proj.weight")
    assert tensor_settings(q, OutputSlice((SliceSource(0, (2, 4), sl.sources[0].params),)), {})[1][0]["weight"] == 9.0


def test_in_memory_merges_evaluate_gradients_and_refuse_them_without_layers():
    """`modeconn.merge` / `weighted_average` place a gradient by the tensor names; without a layer stack it is
    refused naming the parameter."""
    from modeconn.path.interpolate import weighted_average

    sds = [{k: torch.full((2,), float(i)) for k in KEYS} for i in range(2)]
    settings = RuleSettings(params={"weight": [0.0, 1.0]}, normalize=False)
    out = weighted_average(sds, [0.5, 0.5], settings=settings)
    assert out["model.layers.0.mlp.up_proj.weight"].tolist() == [0.0, 0.0]  # weight 0 on both models
    assert out["model.layers.3.mlp.up_proj.weight"].tolist() == [1.0, 1.0]  # weight 1 on both: 1 · 0 + 1 · 1
    with pytest.raises(ConfigError, match="parameters.weight: a gradient"):
        weighted_average([{"fc.weight": torch.ones(2)}] * 2, settings=settings)
