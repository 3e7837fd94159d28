"""Width fusion (modeconn.path.width.merge_widths, `modeconn fuse`): A at width m planted inside a wider B (extra
units with zero outgoing weights, permuted) is recovered exactly; a random selection (the broken variant) is not."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import modeconn as mc
from modeconn.cli import app
from modeconn.errors import ConfigError
from modeconn.io import load_checkpoint, save_checkpoint
from modeconn.models import build_model
from modeconn.path.width import merge_widths
from modeconn.symmetry import SymmetrySpec
from modeconn.symmetry.select import check_selectable, select_units

SHAPE = (1, 8, 8)
CASES = {"mlp": ("mlp", {"width": 6, "depth": 2, "activation": "tanh"}, {"width": 11, "depth": 2, "activation": "tanh"}),
         "cnn": ("cnn", {"channels": (4, 6), "hidden": (8,)}, {"channels": (7, 9), "hidden": (12,)}),
         "resnet20": ("resnet20", {"width": 0.25, "norm": "none"}, {"width": 0.5, "norm": "none"})}


def _inputs(n: int = 96) -> list[tuple[torch.Tensor]]:
    x = torch.randn(n, *SHAPE, generator=torch.Generator().manual_seed(5))
    return [(x[i:i + 32],) for i in range(0, n, 32)]


def _plant(model_a, model_b, gen: torch.Generator) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """B's weights with A's units at random positions of every space; B's extra units keep their random incoming
    weights but get zero outgoing weights, so B computes A's function. Returns (B, positions per space)."""
    x = _inputs()[0][0][:2]
    spec_a, spec_b = mc.symmetry_spec(model_a, x), mc.symmetry_spec(model_b, x)
    pos = {s: torch.randperm(sp.size, generator=gen)[:spec_a.spaces[s].size] for s, sp in spec_b.spaces.items()}
    sd_a, planted = model_a.state_dict(), {}
    for key, t in model_b.state_dict().items():
        t = t.clone()
        index = [torch.arange(n) for n in t.shape]
        for b in spec_b.tensors[key]:
            units = b.indices(spec_b.spaces[b.space].size).reshape(-1, b.block)
            if b.side == "in":
                keep = torch.zeros(t.shape[b.axis], dtype=torch.bool)
                keep[units[pos[b.space]].reshape(-1)] = True
                t = t * keep.reshape([-1 if i == b.axis else 1 for i in range(t.dim())])
            index[b.axis] = units[pos[b.space]].reshape(-1)
        t[torch.meshgrid(*index, indexing="ij")] = sd_a[key]
        planted[key] = t
    model_b.load_state_dict(planted)
    return model_b, pos


def _pair(name: str):
    arch, kw_a, kw_b = CASES[name]
    a = build_model(arch, in_shape=SHAPE, num_classes=10, seed=0, **kw_a).eval()
    b = build_model(arch, in_shape=SHAPE, num_classes=10, seed=1, **kw_b).eval()
    return a, b


@pytest.mark.parametrize("name", CASES)
def test_planted_narrow_model_is_recovered_exactly(name):
    a, b = _pair(name)
    b, pos = _plant(a, b, torch.Generator().manual_seed(0))
    x = torch.cat([t[0] for t in _inputs()])
    with torch.no_grad():
        assert torch.allclose(b(x), a(x), atol=1e-5)  # the planting keeps A's function
    fused, alignment = merge_widths(a, b, _inputs())
    # every unit pairs with its planted copy (a unit dead on the data may pair with another dead unit instead)
    assert sum(int((alignment.select_b[s] != p).sum()) for s, p in pos.items()) <= 4
    assert type(fused) is type(a) and fused.modeconn_config == a.modeconn_config
    with torch.no_grad():
        assert torch.allclose(fused(x), a(x), atol=1e-5)
    # broken variant: B reduced by a random selection instead of the matched one
    spec_b = mc.symmetry_spec(b, x[:2])
    g = torch.Generator().manual_seed(1)
    random = {s: torch.randperm(spec_b.spaces[s].size, generator=g)[:len(p)] for s, p in pos.items()}
    broken = mc.merge([a.state_dict(), select_units(spec_b, b.state_dict(), random)])
    a.load_state_dict(broken)
    with torch.no_grad():
        assert not torch.allclose(a(x), fused(x), atol=1e-3)


def test_selection_of_every_unit_is_the_permutation():
    a, _ = _pair("resnet20")
    spec = mc.symmetry_spec(a, _inputs()[0][0][:2])
    g = spec.random_element(seed=3)
    got, want = select_units(spec, a.state_dict(), g), spec.apply(a.state_dict(), g)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_widths_that_cannot_change_are_named():
    a, b = _pair("mlp")
    wider = build_model("mlp", in_shape=SHAPE, num_classes=10, width=20, depth=2, activation="tanh", seed=0)
    with pytest.raises(ConfigError, match="P_blocks.0.linear.*at most 6"):
        merge_widths(a, b, _inputs(), target=wider)
    other = build_model("mlp", in_shape=SHAPE, num_classes=7, width=6, depth=2, activation="tanh", seed=0)
    with pytest.raises(ConfigError, match="head.weight"):
        merge_widths(a, b, _inputs(), target=other)
    spec = SymmetrySpec.from_axes({"S": 4}, {"w": ("S",)}, group="scaling")
    with pytest.raises(ConfigError, match="'S'.*cannot change width"):
        check_selectable(spec, ["S"])
    with pytest.raises(ConfigError, match="repeats"):
        select_units(SymmetrySpec.from_axes({"S": 4}, {"w": ("S",)}), {"w": torch.ones(4)},
                     {"S": torch.tensor([0, 0])})


def test_cli_fuse_writes_a_checkpoint_of_the_narrow_width(tmp_path):
    a, b = _pair("mlp")
    for name, m in (("a", a), ("b", b)):
        save_checkpoint(tmp_path / name, m, config={"dataset": "digits"})
    res = CliRunner().invoke(app, ["fuse", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "f"),
                                   "--batches", "2"])
    assert res.exit_code == 0, res.output
    assert "test accuracy" in res.output
    fused, cfg = load_checkpoint(tmp_path / "f")
    assert cfg["kwargs"]["width"] == 6 and fused.head.weight.shape == (10, 6)
    res = CliRunner().invoke(app, ["fuse", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "g"),
                                   "--width", "9"])
    assert res.exit_code != 0 and "at most 6" in res.output


def test_cli_fuse_refuses_a_timm_directory_with_the_reason_before_any_weights(tmp_path):
    import json

    (tmp_path / "timm").mkdir()
    (tmp_path / "timm" / "config.json").write_text(json.dumps(
        {"architecture": "resnet18d", "num_classes": 10, "pretrained_cfg": {"input_size": [3, 32, 32]}}))
    res = CliRunner().invoke(app, ["fuse", str(tmp_path / "timm"), str(tmp_path / "timm"), "--out", str(tmp_path / "f")])
    assert res.exit_code == 2 and "fuse reads modeconn, huggingface checkpoints" in res.output, res.output
    assert not (tmp_path / "f").exists()
