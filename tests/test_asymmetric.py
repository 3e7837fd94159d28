"""W-asymmetric layers (METHODS.md §1): W_eff = F + D ⊙ W with a fixed, seeded F and D."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

import modeconn as mc
from modeconn.errors import CheckpointError, ConfigError, StateDictMismatchError
from modeconn.io import load_checkpoint, load_state_dict, read_config, save_checkpoint, save_state_dict
from modeconn.models import (
    AsymConv2d,
    AsymLinear,
    AsymmetricConfig,
    build_model,
    fixed_structure_digest,
    fixed_structure_keys,
    fixed_structure_mismatches,
    model_config,
)
from modeconn.models.asymmetric import DEFAULT_DENSITY, layer_seed
from modeconn.symmetry.trace import _fx_trace

# (architecture, tiny kwargs, input shape)
ARCHS = [
    ("mlp", {"depth": 2, "width": 16}, (1, 6, 6)),
    ("mlp", {"depth": 2, "width": 16, "norm": "layernorm"}, (1, 6, 6)),
    ("resnet20", {"width": 0.25}, (1, 8, 8)),
    ("cnn", {"channels": (4, 8), "hidden": (16,)}, (1, 8, 8)),
    ("vgg", {"layout": [4, "M", 8, "M"], "batchnorm": True, "classifier_widths": (12,)}, (3, 8, 8)),
]
ARCH_IDS = [f"{a}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for a, kw, _ in ARCHS]
ONE_PER_ARCH = [0, 2, 3, 4]  # mlp, resnet20 (batchnorm), cnn, vgg (batchnorm): tracing costs ~1 s per resnet
ASYM = {"sigma_f": 1.0, "mask_seed": 7}


def _build(arch, kw, in_shape, seed=0, asym=ASYM):
    return build_model(arch, in_shape=in_shape, num_classes=5, seed=seed, asymmetric=asym, **kw)


def _asym_modules(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (AsymLinear, AsymConv2d))]


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _mlp(seed=0, asym=ASYM, **kw):
    opts = {"depth": 2, "width": 16, **kw}
    return build_model("mlp", in_shape=(1, 6, 6), num_classes=5, seed=seed, asymmetric=asym, **opts)


# ------------------------------------------------------------------------------------------- layers


def test_linear_effective_weight_formula():
    layer = AsymLinear(10, 6, sigma_f=0.7, num_fixed=3, mask_seed=1, key="l")
    f, d, w = layer.fixed_offsets, layer.fixed_mask, layer.weight
    assert f.shape == d.shape == w.shape == (6, 10)
    assert torch.equal(layer.effective_weight(), f + d * w)
    x = torch.randn(4, 10)
    torch.testing.assert_close(layer(x), x @ (f + d * w).T + layer.bias, rtol=0, atol=0)
    # D is 0/1, F lives exactly on the masked entries, W is 0 there
    assert set(d.unique().tolist()) == {0.0, 1.0}
    assert torch.all(f[d == 1] == 0) and torch.all(f[d == 0] != 0)
    assert torch.all(w[d == 0] == 0) and torch.all(w[d == 1] != 0)
    # the effective weight at masked entries is F, elsewhere W
    assert torch.equal(layer.effective_weight()[d == 0], f[d == 0])
    assert torch.equal(layer.effective_weight()[d == 1], w[d == 1])


def test_conv_effective_weight_formula_and_rows():
    conv = AsymConv2d(3, 5, 3, padding=1, sigma_f=2.0, num_fixed=4, mask_seed=0, key="c")
    assert conv.fixed_mask.shape == conv.weight.shape == (5, 3, 3, 3)
    x = torch.randn(2, 3, 6, 6)
    w_eff = conv.fixed_offsets + conv.fixed_mask * conv.weight
    torch.testing.assert_close(conv(x), F.conv2d(x, w_eff, conv.bias, padding=1), rtol=0, atol=0)
    # rows are output channels, over in_channels·kh·kw = 27 entries
    assert torch.equal((conv.fixed_mask == 0).reshape(5, -1).sum(1), torch.full((5,), 4))


@pytest.mark.parametrize("num_fixed", [0, 1, 5, 9])
def test_exactly_num_fixed_masked_entries_per_row(num_fixed):
    layer = AsymLinear(10, 7, num_fixed=num_fixed, key="x")
    assert layer.num_fixed == num_fixed
    assert torch.equal((layer.fixed_mask == 0).sum(1), torch.full((7,), num_fixed))
    # rows get different masks (random subsets), unless every row masks nothing / all but one
    if 0 < num_fixed < 9:
        assert len({tuple(r.tolist()) for r in layer.fixed_mask}) > 1


def test_density_semantics_and_default():
    # density: round(density · fan_in), capped at fan_in - 1
    assert AsymLinear(40, 3, density=0.25).num_fixed == 10
    assert AsymLinear(9, 3, density=0.1).num_fixed == 1  # round(0.9)
    assert AsymLinear(2, 3, density=0.9).num_fixed == 1  # round(1.8) = 2 capped at fan_in - 1
    assert AsymLinear(1, 3, density=0.5).num_fixed == 0
    conv = AsymConv2d(4, 6, 3, density=0.25)
    assert conv.num_fixed == 9 and torch.equal((conv.fixed_mask == 0).reshape(6, -1).sum(1), torch.full((6,), 9))
    # neither given → DEFAULT_DENSITY, and the default is written into the architecture config
    assert AsymLinear(64, 3).num_fixed == round(DEFAULT_DENSITY * 64)
    m = _mlp(asym={"mask_seed": 1})
    cfg = model_config(m)["kwargs"]["asymmetric"]
    assert cfg == {"sigma_f": 1.0, "num_fixed": None, "density": DEFAULT_DENSITY, "mask_seed": 1, "layers": "all"}
    # per layer: blocks.0.linear has fan-in 36 (4.5 rounds half up to 5), the others 16
    counts = {n: mod.num_fixed for n, mod in _asym_modules(m)}
    assert counts == {"blocks.0.linear": 5, "blocks.1.linear": 2, "head": 2}


def test_num_fixed_applies_to_every_layer():
    m = _mlp(asym={"num_fixed": 3, "sigma_f": 0.5})
    for name, mod in _asym_modules(m):
        assert mod.num_fixed == 3
        assert torch.equal((mod.fixed_mask == 0).sum(1), torch.full((mod.out_features,), 3)), name


def test_sigma_f_zero_gives_sparse_network():
    m = _mlp(asym={"sigma_f": 0.0, "num_fixed": 4})
    for name, mod in _asym_modules(m):
        d, w_eff = mod.fixed_mask, mod.effective_weight()
        assert torch.equal(mod.fixed_offsets, torch.zeros_like(d)), name
        assert _bytes(w_eff[d == 0]) == _bytes(torch.zeros(int((d == 0).sum()))), name  # +0.0 exactly
        assert torch.equal(w_eff, d * mod.weight)
    # same mask seed: σ_F only scales F, D is shared across a σ_F sweep
    m1 = _mlp(asym={"sigma_f": 1.0, "num_fixed": 4})
    m2 = _mlp(asym={"sigma_f": 2.0, "num_fixed": 4})
    for (_, a), (_, b), (_, c) in zip(_asym_modules(m), _asym_modules(m1), _asym_modules(m2), strict=False):
        assert torch.equal(a.fixed_mask, b.fixed_mask) and torch.equal(b.fixed_mask, c.fixed_mask)
        torch.testing.assert_close(c.fixed_offsets, 2 * b.fixed_offsets, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------- training


def _train_steps(model, opt, steps=3):
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(16, 1, 6, 6, generator=g)
        y = torch.randint(0, 5, (16,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def test_masked_gradients_are_exactly_zero():
    m = _mlp()
    x = torch.randn(8, 1, 6, 6)
    F.cross_entropy(m(x), torch.arange(8) % 5).backward()
    for name, mod in _asym_modules(m):
        grad = mod.weight.grad
        assert grad is not None and torch.all(grad[mod.fixed_mask == 0] == 0), name
        assert grad[mod.fixed_mask == 1].abs().sum() > 0, name
        assert mod.fixed_offsets.grad is None and not mod.fixed_offsets.requires_grad


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True),
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
        lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
    ],
    ids=["sgd-momentum-wd", "sgd-nesterov-wd", "adamw", "adam-l2"],
)
@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_masked_entries_never_change_in_training(make_opt, arch):
    if arch == "mlp":
        m = _mlp()
    else:
        m = build_model("cnn", in_shape=(1, 6, 6), num_classes=5, seed=0, channels=(4,), hidden=(8,), asymmetric=ASYM)
    before = {n: (mod.weight.detach().clone(), _bytes(mod.fixed_offsets), _bytes(mod.fixed_mask)) for n, mod in _asym_modules(m)}
    _train_steps(m, make_opt(m.parameters()))
    for name, mod in _asym_modules(m):
        w0, f0, d0 = before[name]
        masked = mod.fixed_mask == 0
        assert _bytes(mod.weight.detach()[masked]) == _bytes(w0[masked]), name  # bytes: still +0.0
        assert not torch.equal(mod.weight.detach()[~masked], w0[~masked]), name  # the rest trained
        assert _bytes(mod.fixed_offsets) == f0 and _bytes(mod.fixed_mask) == d0, name
    # buffers are not parameters: an optimiser never sees F or D
    assert not any(n.endswith(("fixed_offsets", "fixed_mask")) for n, _ in m.named_parameters())


# ------------------------------------------------------------------------------------- determinism


def test_layer_seed_is_stable():
    # pinned: sha256-derived, independent of the process (PYTHONHASHSEED) and of torch
    assert layer_seed(0, "head") == layer_seed(0, "head")
    assert layer_seed(0, "head") != layer_seed(1, "head") != layer_seed(0, "blocks.0.linear")
    assert 0 <= layer_seed(123, "x") < 2**63


_CHILD = """
import json, torch
from modeconn.models import build_model, fixed_structure_digest, fixed_structure_keys
m = build_model("mlp", in_shape=(1, 6, 6), num_classes=5, seed=99, depth=2, width=16,
                asymmetric={"sigma_f": 1.0, "mask_seed": 7})
sd = m.state_dict()
print(json.dumps({"digest": fixed_structure_digest(m), "keys": fixed_structure_keys(m),
                  "w": sd["blocks.1.linear.weight"].flatten()[:8].tolist()}))
"""


@pytest.mark.slow
def test_same_mask_seed_identical_bytes_across_processes():
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", _CHILD], check=False, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    child = json.loads(out.stdout.strip().splitlines()[-1])
    here = _mlp(seed=0)  # another model seed: same F, D; different W
    assert child["keys"] == fixed_structure_keys(here)
    assert child["digest"] == fixed_structure_digest(here)
    assert child["w"] != here.state_dict()["blocks.1.linear.weight"].flatten()[:8].tolist()


def test_same_and_different_mask_seed_in_process():
    a, b = _mlp(seed=0), _mlp(seed=1)
    c = _mlp(seed=0, asym={**ASYM, "mask_seed": 8})
    keys = fixed_structure_keys(a)
    assert keys == [
        f"{n}.{b_}" for n in ("blocks.0.linear", "blocks.1.linear", "head") for b_ in ("fixed_offsets", "fixed_mask")
    ]
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    for k in keys:
        assert _bytes(sa[k]) == _bytes(sb[k]), k
        assert not torch.equal(sa[k], sc[k]), k
    assert not torch.equal(sa["head.weight"], sb["head.weight"])  # W follows the model seed
    assert fixed_structure_digest(a) == fixed_structure_digest(b) != fixed_structure_digest(c)
    # layers of one model get different structures (the key is the qualified name)
    deep = _mlp(depth=3)
    assert deep.blocks[1].linear.fixed_mask.shape == deep.blocks[2].linear.fixed_mask.shape
    assert not torch.equal(deep.blocks[1].linear.fixed_mask, deep.blocks[2].linear.fixed_mask)
    assert not torch.equal(deep.blocks[1].linear.fixed_offsets, deep.blocks[2].linear.fixed_offsets)
    # the global RNG is neither used nor disturbed by the fixed structure
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    _mlp(seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_digest_of_state_dict_needs_keys():
    m = _mlp()
    keys = fixed_structure_keys(m)
    assert fixed_structure_digest(m.state_dict(), keys) == fixed_structure_digest(m)
    with pytest.raises(ConfigError, match="keys"):
        fixed_structure_digest(m.state_dict())
    with pytest.raises(StateDictMismatchError, match="nope"):
        fixed_structure_digest(m.state_dict(), ["nope"])
    assert fixed_structure_keys(build_model("mlp", in_shape=(1, 4, 4), num_classes=3, depth=1, width=4)) == []


# -------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "asym, match",
    [
        ({"sigma_f": -0.5}, "sigma_f"),
        ({"sigma_f": float("inf")}, "sigma_f"),
        ({"num_fixed": 36}, "num_fixed=36 must be < the fan-in 36"),  # blocks.0.linear has fan-in 36
        ({"num_fixed": 16}, "num_fixed=16 must be < the fan-in 16"),  # fits the first layer, not the others
        ({"num_fixed": -1}, "num_fixed"),
        ({"num_fixed": 2, "density": 0.1}, "mutually exclusive"),
        ({"density": 1.0}, "density"),
        ({"density": -0.1}, "density"),
        ({"mask_seed": 1.5}, "mask_seed"),
        ({"layers": "first"}, "layers"),
        ({"sigmaf": 1.0}, "sigmaf"),
    ],
)
def test_bad_options_raise_config_error(asym, match):
    with pytest.raises(ConfigError, match=match):
        _mlp(asym=asym)


def test_layer_validation_standalone():
    with pytest.raises(ConfigError, match="sigma_f"):
        AsymLinear(4, 3, sigma_f=-1.0)
    with pytest.raises(ConfigError, match="num_fixed=4 must be < the fan-in 4"):
        AsymLinear(4, 3, num_fixed=4)
    with pytest.raises(ConfigError, match="num_fixed=27"):
        AsymConv2d(3, 2, 3, num_fixed=27)
    with pytest.raises(ConfigError, match="mutually exclusive"):
        AsymLinear(4, 3, num_fixed=1, density=0.5)
    with pytest.raises(ConfigError, match="density"):
        AsymLinear(4, 3, density=1.5)
    assert AsymmetricConfig().density == DEFAULT_DENSITY


# ------------------------------------------------------------------------------------ architectures


@pytest.mark.parametrize("case", ARCHS, ids=ARCH_IDS)
def test_architectures_forward_trace_rebuild(case):
    arch, kw, in_shape = case
    m = _build(arch, kw, in_shape, seed=3).eval()
    mods = _asym_modules(m)
    assert mods and all(mod.structure_key == name for name, mod in mods)
    # every Linear/Conv of the model is asymmetric with layers="all", the head included
    plain = [n for n, mod in m.named_modules() if type(mod) in (nn.Linear, nn.Conv2d)]
    assert plain == []
    x = torch.randn(4, *in_shape, generator=torch.Generator().manual_seed(0))
    out = m(x)
    assert out.shape == (4, 5) and torch.isfinite(out).all()
    torch.testing.assert_close(torch.fx.symbolic_trace(m)(x), out, rtol=0, atol=0)
    traced = _fx_trace(m, ())  # modeconn's tracer keeps each asymmetric layer one node, like nn.Linear/Conv2d
    assert {str(n.target) for n in traced.graph.nodes if n.op == "call_module"} >= {n for n, _ in mods}
    torch.testing.assert_close(traced(x), out, rtol=0, atol=0)
    # model_config round trip: same F, D bytes (and same W with the same seed)
    cfg = json.loads(json.dumps(model_config(m)))
    rebuilt = build_model(cfg["architecture"], seed=3, **cfg["kwargs"])
    sa, sb = m.state_dict(), rebuilt.state_dict()
    assert list(sa) == list(sb) and all(_bytes(sa[k]) == _bytes(sb[k]) for k in sa)
    assert model_config(rebuilt) == cfg
    assert fixed_structure_mismatches(m) == []


@pytest.mark.parametrize("case", [ARCHS[i] for i in ONE_PER_ARCH], ids=[ARCH_IDS[i] for i in ONE_PER_ARCH])
def test_layers_hidden_keeps_first_layer_and_head_standard(case):
    arch, kw, in_shape = case
    m = _build(arch, kw, in_shape, asym={**ASYM, "layers": "hidden"})
    standard = [n for n, mod in m.named_modules() if type(mod) in (nn.Linear, nn.Conv2d)]
    first = {"mlp": "blocks.0.linear", "resnet20": "stem.conv"}.get(arch, "features.0.conv")
    assert standard == [first, "head"]
    assert _asym_modules(m)
    x = torch.randn(2, *in_shape)
    assert m.eval()(x).shape == (2, 5)


def test_asymmetric_none_is_the_standard_model():
    a = build_model("mlp", in_shape=(1, 6, 6), num_classes=5, seed=0, depth=2, width=16)
    b = build_model("mlp", in_shape=(1, 6, 6), num_classes=5, seed=0, depth=2, width=16, asymmetric=None)
    assert "asymmetric" not in model_config(a)["kwargs"]
    assert all(type(mod) is not AsymLinear for mod in a.modules())
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_meta_device_build_has_shapes_only():
    with torch.device("meta"):
        m = _mlp()
    real = _mlp()
    assert {k: v.shape for k, v in m.state_dict().items()} == {k: v.shape for k, v in real.state_dict().items()}
    assert fixed_structure_keys(m) == fixed_structure_keys(real)


# ----------------------------------------------------------------------------------------- symmetry


@pytest.mark.parametrize("case", [ARCHS[i] for i in ONE_PER_ARCH], ids=[ARCH_IDS[i] for i in ONE_PER_ARCH])
def test_symmetry_spec_validates_and_leaves_fixed_buffers_unbound(case):
    arch, kw, in_shape = case
    m = _build(arch, kw, in_shape).eval()
    x = torch.randn(4, *in_shape)
    spec = mc.symmetry_spec(m, x)
    spec.validate(m)
    assert spec.spaces  # hidden units are still permutation spaces (of W), just no longer exact symmetries
    for k in fixed_structure_keys(m):
        assert spec.tensors[k] == (), k
    for name, _ in _asym_modules(m):
        assert spec.tensors[f"{name}.weight"], name


def _permuted_logits(model, x, seed=0):
    spec = mc.symmetry_spec(model, x)
    g = spec.random_element(generator=torch.Generator().manual_seed(seed))
    sd = model.state_dict()
    sd_g = spec.apply(sd, g)
    other = copy.deepcopy(model)
    other.load_state_dict(sd_g)
    for k in fixed_structure_keys(model):
        assert torch.equal(sd_g[k], sd[k]), k  # F and D stay put
    return model(x), other(x)


@pytest.mark.parametrize("arch_idx", [0, 3], ids=["mlp", "cnn"])
def test_permutation_is_no_longer_a_symmetry(arch_idx):
    arch, kw, in_shape = ARCHS[arch_idx]
    x = torch.randn(6, *in_shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        std = build_model(arch, in_shape=in_shape, num_classes=5, seed=0, **kw).eval()
        a, b = _permuted_logits(std, x)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # standard model: an exact symmetry
        asym = _build(arch, kw, in_shape).eval()
        a, b = _permuted_logits(asym, x)
        assert (a - b).abs().max() > 1e-3  # σ_F > 0: permuting W against fixed F, D changes the function


# --------------------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip_keeps_digest(tmp_path):
    m = _build(*ARCHS[4], seed=1)  # vgg with batchnorm: conv + linear layers, running statistics
    m.train()(torch.randn(4, 3, 8, 8))
    path = save_checkpoint(tmp_path / "ck", m)
    cfg = read_config(path)
    assert cfg["fixed_structure_digest"] == fixed_structure_digest(m)
    loaded, cfg2 = load_checkpoint(path)
    assert fixed_structure_digest(loaded) == cfg["fixed_structure_digest"] == cfg2["fixed_structure_digest"]
    sa, sb = m.state_dict(), loaded.state_dict()
    assert all(_bytes(sa[k]) == _bytes(sb[k]) for k in sa)
    x = torch.randn(3, 3, 8, 8)
    torch.testing.assert_close(loaded(x), m.eval()(x), rtol=0, atol=0)
    # a standard model records no digest
    std = save_checkpoint(tmp_path / "std", build_model("mlp", in_shape=(1, 4, 4), num_classes=3, depth=1, width=4))
    assert "fixed_structure_digest" not in read_config(std)


def test_tampered_fixed_offsets_are_refused(tmp_path):
    m = _mlp()
    path = save_checkpoint(tmp_path / "ck", m)
    weights = path / "model.safetensors"
    sd = load_state_dict(weights)
    masked = sd["blocks.1.linear.fixed_mask"] == 0
    sd["blocks.1.linear.fixed_offsets"][masked] += 1e-3
    save_state_dict(weights, sd, metadata={"modeconn_format_version": "1"})
    with pytest.raises(CheckpointError, match="fixed_structure_digest mismatch") as err:
        load_checkpoint(path)
    msg = str(err.value)
    assert str(weights) in msg and fixed_structure_digest(m) in msg
    assert fixed_structure_digest(sd, fixed_structure_keys(m)) in msg


def test_config_that_does_not_generate_the_buffers_is_refused(tmp_path):
    m = _mlp()
    path = save_checkpoint(tmp_path / "ck", m)
    cfg = json.loads((path / "config.json").read_text())
    cfg["kwargs"]["asymmetric"]["mask_seed"] = 8  # the digest still matches the file, the seed does not
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="regenerates") as err:
        load_checkpoint(path)
    assert "blocks.0.linear.fixed_offsets" in str(err.value)
    loaded, _ = load_checkpoint(path, verify_fixed_structure=False)  # the file's buffers are used
    assert fixed_structure_digest(loaded) == fixed_structure_digest(m)
    # a missing digest is refused too
    del cfg["fixed_structure_digest"]
    cfg["kwargs"]["asymmetric"]["mask_seed"] = 7
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="records no fixed_structure_digest"):
        load_checkpoint(path)


def test_digest_key_is_reserved(tmp_path):
    with pytest.raises(ConfigError, match="reserved"):
        save_checkpoint(tmp_path / "ck", _mlp(), config={"fixed_structure_digest": "x"})
