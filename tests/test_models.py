"""Architectures: shapes, fx-traceability, seeded rebuilds from config, kwargs validation."""

from __future__ import annotations

import json

import pytest
import torch
import torch.fx
from torch import nn

from modeconn.errors import ConfigError
from modeconn.models import (
    ACTIVATIONS,
    HF_IMAGE_MODELS,
    MODELS,
    NORM_KINDS,
    TOKEN_MODELS,
    build_model,
    make_activation,
    make_norm,
    model_config,
)

SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]


# (architecture, tiny options) — every option that changes the module structure appears at least once
CASES = [
    ("mlp", {"depth": 2, "width": 16}),
    ("mlp", {"depth": 0}),
    ("mlp", {"depth": 2, "width": 16, "norm": "batchnorm", "activation": "gelu"}),
    ("mlp", {"depth": 1, "width": 16, "norm": "layernorm", "activation": "leaky_relu", "bias": False}),
    ("mlp", {"depth": 1, "width": 16, "activation": "tanh"}),
    ("mlp", {"depth": 1, "width": 16, "activation": "silu"}),
    ("vgg", {"width": 0.125, "classifier_widths": (16, 16)}),
    ("vgg", {"layout": "vgg11", "width": 0.0625, "batchnorm": True, "classifier_widths": (16,)}),
    ("vgg", {"layout": [4, "M", 8, "M", 8], "classifier_widths": ()}),
    ("resnet20", {"width": 0.25}),
    ("resnet20", {"width": 0.25, "norm": "layernorm"}),
    ("resnet20", {"width": 0.25, "norm": "none"}),
    ("cnn", {"channels": (4, 8), "hidden": (16,)}),
    ("cnn", {"channels": (4, 8, 8), "hidden": (16, 16)}),
]


def _ids(case):
    arch, opts, in_shape = case
    return "x".join(map(str, in_shape)) + "-" + arch + "-" + "-".join(f"{k}={v}" for k, v in opts.items())


# every option case on one input shape (rotating), and every architecture's first case on all shapes
_FIRST = {arch: opts for arch, opts in reversed(CASES)}
MATRIX = [(arch, opts, SHAPES[i % len(SHAPES)]) for i, (arch, opts) in enumerate(CASES)]
MATRIX += [(arch, opts, shape) for arch, opts in _FIRST.items() for shape in SHAPES if (arch, opts, shape) not in MATRIX]


@pytest.mark.parametrize("case", MATRIX, ids=[_ids(c) for c in MATRIX])
def test_forward_trace_and_rebuild(case):
    arch, opts, in_shape = case
    model = build_model(arch, in_shape=in_shape, num_classes=7, seed=3, **opts)
    x = torch.randn(5, *in_shape, generator=torch.Generator().manual_seed(0))
    model.eval()
    out = model(x)
    assert out.shape == (5, 7) and out.dtype == torch.float32
    assert torch.isfinite(out).all()

    traced = torch.fx.symbolic_trace(model)
    torch.testing.assert_close(traced(x), out, rtol=0, atol=0)

    # the config survives JSON and rebuilds the same architecture with the same seed → identical weights
    cfg = json.loads(json.dumps(model_config(model)))
    assert cfg["architecture"] == arch
    rebuilt = build_model(cfg["architecture"], seed=3, **cfg["kwargs"])
    sd_a, sd_b = model.state_dict(), rebuilt.state_dict()
    assert list(sd_a) == list(sd_b)
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_b[k]), k
    assert model_config(rebuilt) == cfg


def test_training_mode_forward_with_batchnorm():
    model = build_model("resnet20", in_shape=(1, 8, 8), num_classes=3, width=0.25, seed=0)
    out = model.train()(torch.randn(4, 1, 8, 8))
    assert out.shape == (4, 3)


def test_seed_does_not_disturb_global_rng_and_differs_between_seeds():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = build_model("mlp", in_shape=(1, 8, 8), num_classes=3, depth=1, width=8, seed=0)
    assert torch.equal(torch.rand(3), expected)
    b = build_model("mlp", in_shape=(1, 8, 8), num_classes=3, depth=1, width=8, seed=1)
    assert not torch.equal(a.blocks[0].linear.weight, b.blocks[0].linear.weight)


def test_config_records_defaults_and_is_a_copy():
    model = build_model("resnet20", in_shape=(3, 32, 32), num_classes=10)
    cfg = model_config(model)
    assert cfg == {
        "architecture": "resnet20",
        "kwargs": {"in_shape": [3, 32, 32], "num_classes": 10, "width": 1.0, "norm": "batchnorm"},
    }
    cfg["kwargs"]["width"] = 5
    assert model_config(model)["kwargs"]["width"] == 1.0


def test_model_config_requires_build_model():
    with pytest.raises(ConfigError, match="build_model"):
        model_config(nn.Linear(2, 2))


def test_registered_architectures():
    assert {"mlp", "vgg", "resnet20", "cnn"} <= set(MODELS.names())


def test_vgg_keeps_spatial_structure_before_flatten():
    # 8×8 allows two pools (8→4→2); 28×28 three (→3×3); 32×32 four (→2×2): the 5th vgg11 pool is skipped
    for in_shape, side, pools in [((1, 8, 8), 2, 2), ((1, 28, 28), 3, 3), ((3, 32, 32), 2, 4)]:
        model = build_model("vgg", in_shape=in_shape, num_classes=10, layout="vgg11", width=0.0625)
        last_channels = [m for m in model.features.modules() if isinstance(m, nn.Conv2d)][-1].out_channels
        assert model.classifier[0].linear.in_features == last_channels * side * side
        assert sum(isinstance(m, nn.MaxPool2d) for m in model.features) == pools


def test_resnet20_structure():
    model = build_model("resnet20", in_shape=(3, 32, 32), num_classes=10)
    blocks = [m for m in model.modules() if m.__class__.__name__ == "BasicBlock"]
    assert len(blocks) == 9
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs) == 19  # + head = 20 weighted layers
    shortcuts = [b.shortcut for b in blocks if not isinstance(b.shortcut, nn.Identity)]
    assert len(shortcuts) == 2 and all(isinstance(s[0], nn.Conv2d) and s[0].kernel_size == (1, 1) for s in shortcuts)
    assert [m.num_features for m in model.modules() if isinstance(m, nn.BatchNorm2d)][:1] == [16]
    ln = build_model("resnet20", in_shape=(1, 28, 28), num_classes=10, norm="layernorm", width=0.5)
    norms = [m for m in ln.modules() if isinstance(m, nn.GroupNorm)]
    assert norms and all(m.num_groups == 1 for m in norms)
    assert norms[0].num_channels == 8


def test_mlp_norm_placement():
    model = build_model("mlp", in_shape=(1, 4, 4), num_classes=2, depth=2, width=8, norm="batchnorm")
    block = model.blocks[0]
    assert isinstance(block.linear, nn.Linear) and isinstance(block.norm, nn.BatchNorm1d)
    assert isinstance(block.act, nn.ReLU)
    assert len(model.blocks) == 2 and model.head.in_features == 8


def test_unknown_architecture_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        build_model("resnet21", in_shape=(1, 8, 8), num_classes=2)
    msg = str(err.value)
    assert "resnet21" in msg and "resnet20" in msg and "mlp" in msg and "vgg" in msg


def test_unknown_kwarg_named_with_valid_ones():
    with pytest.raises(ConfigError) as err:
        build_model("mlp", in_shape=(1, 8, 8), num_classes=2, widht=3)
    msg = str(err.value)
    assert "'widht'" in msg and "width" in msg and "depth" in msg and "did you mean 'width'" in msg


@pytest.mark.parametrize(
    "arch, kwargs, needle",
    [
        ("mlp", {"in_shape": (1, 8, 8), "num_classes": 2, "norm": "bn"}, "norm"),
        ("mlp", {"in_shape": (1, 8, 8), "num_classes": 2, "activation": "swish"}, "activation"),
        ("mlp", {"num_classes": 2}, "in_shape"),
        ("mlp", {"in_shape": (8, 8), "num_classes": 2}, "in_shape"),
        ("resnet20", {"in_shape": (1, 8, 8), "num_classes": 0}, "num_classes"),
        ("resnet20", {"in_shape": (1, 8, 8), "num_classes": 2, "width": -1}, "width"),
        ("vgg", {"in_shape": (1, 8, 8), "num_classes": 2, "layout": "vgg12"}, "vgg12"),
        ("vgg", {"in_shape": (1, 8, 8), "num_classes": 2, "layout": [8, "X"]}, "layout"),
        ("cnn", {"in_shape": (1, 8, 8), "num_classes": 2, "channels": ()}, "channels"),
    ],
)
def test_bad_kwarg_values(arch, kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        build_model(arch, **kwargs)


def test_helpers():
    assert isinstance(make_norm("none", 4, 1), nn.Identity)
    assert isinstance(make_norm("layernorm", 4, 2), nn.GroupNorm)
    assert isinstance(make_norm("layernorm", 4, 1), nn.LayerNorm)
    assert isinstance(make_norm("batchnorm", 4, 2), nn.BatchNorm2d)
    for name in ACTIVATIONS:
        assert isinstance(make_activation(name), nn.Module)
    assert set(NORM_KINDS) == {"none", "layernorm", "batchnorm"}
    with pytest.raises(ConfigError, match="relu"):
        make_activation("rleu")
    with pytest.raises(ConfigError, match="batchnorm"):
        make_norm("groupnorm", 4, 2)
    with pytest.raises(ConfigError, match="dims"):
        make_norm("none", 4, 3)


# ------------------------------------------------------------------ the asymmetric option (W-asymmetric layers)


@pytest.mark.parametrize("arch", sorted(set(MODELS.names()) - TOKEN_MODELS - HF_IMAGE_MODELS))
def test_every_architecture_takes_the_asymmetric_option(arch):
    from modeconn.models import validate_model_kwargs

    tiny = {"mlp": {"depth": 1, "width": 8}, "vgg": {"layout": [4, "M"], "classifier_widths": ()},
            "resnet20": {"width": 0.25}, "cnn": {"channels": (4,), "hidden": ()}}.get(arch, {})
    base = {"in_shape": (1, 8, 8), "num_classes": 3, **tiny}
    # left at None, the option is not recorded (configs written before it existed stay identical)
    assert "asymmetric" not in validate_model_kwargs(arch, base)
    resolved = validate_model_kwargs(arch, {**base, "asymmetric": {"num_fixed": 1, "mask_seed": 4}})
    assert resolved["asymmetric"] == {"sigma_f": 1.0, "num_fixed": 1, "density": None, "mask_seed": 4, "layers": "all"}
    model = build_model(arch, seed=0, **base, asymmetric={"num_fixed": 1, "mask_seed": 4})
    assert any(hasattr(m, "fixed_mask") for m in model.modules())
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 3)
    with pytest.raises(ConfigError, match="sigma_f"):
        build_model(arch, **base, asymmetric={"sigma_f": -1.0})
