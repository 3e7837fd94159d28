"""MobileNetV2 and CCT: building, kwargs validation, and the traced symmetry specs (depthwise convs, per-head
attention spaces, positional embedding, parameters/matmuls in the tracer). The generic property tests
(function preservation, group laws, planted recovery) run on both through ``tests/archs.py``."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.fx
import torch.nn.functional as F
from archs import make
from torch import nn

import modeconn as mc
from modeconn.errors import ConfigError, SpecError, UnsupportedOperationError
from modeconn.models import build_model, fixed_structure_keys, model_config

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_CCT = {"dim": 8, "depth": 2, "num_heads": 2, "conv_layers": 2, "conv_channels": 6}


def _logits(model, sd, x):
    m = copy.deepcopy(model)
    m.load_state_dict(sd)
    with torch.no_grad():
        return m.eval()(x)


# ------------------------------------------------------------------------------------------- building


@pytest.mark.parametrize("arch", ["mobilenetv2", "cct"])
@pytest.mark.parametrize("in_shape", [(1, 28, 28), (3, 32, 32)])
def test_default_build_forward_trace_rebuild(arch, in_shape):
    model = build_model(arch, in_shape=in_shape, num_classes=10, seed=1).eval()
    x = torch.randn(3, *in_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(x)
        assert out.shape == (3, 10) and torch.isfinite(out).all()
        assert out.std(0).mean() > 1e-3, "untrained eval-mode logits should depend on the input"
        torch.testing.assert_close(torch.fx.symbolic_trace(model)(x), out, rtol=0, atol=0)
    cfg = json.loads(json.dumps(model_config(model)))
    rebuilt = build_model(cfg["architecture"], seed=1, **cfg["kwargs"])
    assert all(torch.equal(v, rebuilt.state_dict()[k]) for k, v in model.state_dict().items())


def test_structure():
    mnet = build_model("mobilenetv2", in_shape=(1, 28, 28), num_classes=10)
    dw = [m for m in mnet.modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert len(dw) == 7 and all(m.groups == m.in_channels == m.out_channels for m in dw)
    assert isinstance(mnet.blocks[0].expand, nn.Identity) and mnet.blocks[0].residual  # t=1, 16 → 16
    assert [b.residual for b in mnet.blocks] == [True, False, True, False, True, False, True]
    cct = build_model("cct", in_shape=(1, 28, 28), num_classes=10)
    assert cct.pos_embedding.shape == (1, 7 * 7, 64)  # 28 → 14 → 7
    attn = cct.blocks[0].attn
    assert (attn.num_heads, attn.head_dim) == (4, 16)
    assert [n for n, _ in attn.named_children()] == ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.mark.parametrize(
    "arch, kwargs, needles",
    [
        ("cct", {"dim": 10, "num_heads": 4}, ["dim=10", "num_heads=4"]),
        ("cct", {"heads": 2}, ["'heads'", "did you mean 'num_heads'"]),
        ("cct", {"depth": 0}, ["depth"]),
        ("cct", {"mlp_ratio": -1.0}, ["mlp_ratio"]),
        ("mobilenetv2", {"stages": [[4, 8, 1, 3]]}, ["stages"]),
        ("mobilenetv2", {"stages": []}, ["stages"]),
        ("mobilenetv2", {"width": 0}, ["width"]),
        ("mobilenetv2", {"norm": "groupnorm"}, ["norm"]),
        ("mobilenetv2", {"stem": 8}, ["'stem'", "stem_channels"]),
    ],
)
def test_bad_kwargs_name_the_key(arch, kwargs, needles):
    with pytest.raises(ConfigError) as err:
        build_model(arch, in_shape=(1, 8, 8), num_classes=3, **kwargs)
    for needle in needles:
        assert needle in str(err.value)


@pytest.mark.parametrize("arch, kwargs", [("mobilenetv2", {"width": 0.25}), ("cct", TINY_CCT)])
def test_asymmetric_variant(arch, kwargs):
    """Every conv/Linear (depthwise, q/k/v/o included) is W-asymmetric; permutations stop being symmetries."""
    m = build_model(arch, in_shape=(1, 8, 8), num_classes=5, seed=0, asymmetric={"mask_seed": 3}, **kwargs).eval()
    assert [n for n, mod in m.named_modules() if type(mod) in (nn.Linear, nn.Conv2d)] == []
    for mod in m.modules():
        if hasattr(mod, "fixed_mask"):  # masked entries of W are +0.0 (the kaiming re-init of MobileNetV2 too)
            w = mod.weight[mod.fixed_mask == 0]
            assert torch.equal(w, torch.zeros_like(w)) and not torch.signbit(w).any()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    spec = mc.symmetry_spec(m, x)
    assert spec.spaces and all(spec.tensors[k] == () for k in fixed_structure_keys(m))
    sd = m.state_dict()
    assert (_logits(m, spec.apply(sd, spec.random_element(seed=0)), x) - _logits(m, sd, x)).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["mobilenetv2", "cct"])
def test_repair_along_an_aligned_path(arch):
    """Every REPAIR point of the traced spec can fold its correction (a bias or a norm affine to fold into)."""
    a, x = make(arch, seed=0)
    b, _ = make(arch, seed=1)
    spec = mc.symmetry_spec(a, x)
    sb = mc.weight_matching(spec, a.state_dict(), b.state_dict(), restarts=1).apply(b.state_dict())
    gen = torch.Generator().manual_seed(0)
    loader = [(torch.randn(16, *x.shape[1:], generator=gen), torch.randint(0, 5, (16,), generator=gen)) for _ in range(2)]
    curve = mc.evaluate_path(a, a.state_dict(), sb, loader, lambdas=3, bn="repair", bn_loader=[t for t, _ in loader], spec=spec)
    assert np.isfinite(curve.metrics["eval"]["loss"]).all()


# ------------------------------------------------------------------------------------------ MobileNetV2


def test_depthwise_conv_binds_one_space_in_and_out():
    model, x = make("mobilenetv2")
    spec = mc.symmetry_spec(model, x)
    for i, block in enumerate(model.blocks):
        (b,) = spec.tensors[f"blocks.{i}.depthwise.conv.weight"]
        assert (b.axis, b.side, b.block, b.offset) == (0, "out", 1, 0)
        # the depthwise conv reads the space its input lives in (the expand conv's output, or the stem's
        # when expand is the identity) and writes the same space into the projection
        writer = "stem.conv.weight" if isinstance(block.expand, nn.Identity) else f"blocks.{i}.expand.conv.weight"
        assert b.space in {w.space for w in spec.tensors[writer] if w.side == "out" and w.axis == 0}
        assert {r.space for r in spec.tensors[f"blocks.{i}.project.conv.weight"] if r.side == "in"} == {b.space}
        for k in ("weight", "bias", "running_mean", "running_var"):
            assert [w.space for w in spec.tensors[f"blocks.{i}.depthwise.norm.{k}"]] == [b.space]
    assert model.blocks[0].residual and not model.blocks[1].residual and model.blocks[2].residual
    # stem (= block 0's depthwise/projection, a residual) + 2 expanded spaces + stage 2 (blocks 1, 2) + last conv
    assert len(spec.spaces) == 1 + 2 + 1 + 1


# ------------------------------------------------------------------------------------------------ CCT


def _head_bindings(spec, key, side):
    return sorted((b.offset, b.space) for b in spec.tensors[key] if b.side == side)


def test_cct_per_head_spaces():
    model, x = make("cct")
    spec = mc.symmetry_spec(model, x)
    heads, hd = 2, 4
    residual = spec.tensors["pos_embedding"][0].space
    for i in range(2):
        a = f"blocks.{i}.attn"
        q = _head_bindings(spec, f"{a}.q_proj.weight", "out")
        assert [off for off, _ in q] == [0, hd] and len({s for _, s in q}) == heads
        assert all(spec.spaces[s].size == hd for _, s in q)
        assert all(b.partial for b in spec.tensors[f"{a}.q_proj.weight"] if b.side == "out")
        for key in (f"{a}.q_proj.bias", f"{a}.k_proj.weight", f"{a}.k_proj.bias"):
            assert _head_bindings(spec, key, "out") == q, key  # q and k share one space per head
        v = _head_bindings(spec, f"{a}.v_proj.weight", "out")
        assert _head_bindings(spec, f"{a}.o_proj.weight", "in") == v  # v and o share another per head
        assert {s for _, s in v}.isdisjoint(s for _, s in q)
        for key in (f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight", f"blocks.{i}.mlp.fc1.weight"):
            assert [b.space for b in spec.tensors[key] if b.side == "in"] == [residual], key
        assert [b.space for b in spec.tensors[f"{a}.o_proj.weight"] if b.side == "out"] == [residual]
        # q/k heads are read by no Linear: activation probes fall back to the projections' outputs
        for off, s in q:
            assert {(p.module, p.where, p.dim, p.offset) for p in spec.probes[s]} == {
                (f"{a}.q_proj", "output", 2, off), (f"{a}.k_proj", "output", 2, off)}
    # tokenizer hidden conv + residual stream + per block (2 heads × (qk, vo) + MLP hidden) + pooling score
    assert len(spec.spaces) == 1 + 1 + 2 * (2 * heads + 1) + 1


def test_cct_positional_embedding_and_layernorms_are_permuted():
    model, x = make("cct")
    spec = mc.symmetry_spec(model, x)
    (b,) = spec.tensors["pos_embedding"]
    assert (b.axis, b.side) == (2, "out")
    for k in ("norm.weight", "norm.bias", "blocks.0.norm1.weight", "blocks.1.norm2.bias"):
        assert [r.space for r in spec.tensors[k]] == [b.space], k
    for k in ("pool.score.weight", "head.weight"):  # sequence pooling keeps the token features' space
        assert [r.space for r in spec.tensors[k] if r.side == "in"] == [b.space], k
    # the pooling score is a hidden Linear(D, 1): a trivial (size-1) space, like any width-1 hidden layer
    (score,) = spec.tensors["pool.score.bias"]
    assert spec.spaces[score.space].size == 1 and spec.tensors["head.bias"] == ()
    g = spec.random_element(seed=3)
    sd = model.state_dict()
    moved = spec.apply(sd, g)
    assert torch.equal(moved["pos_embedding"], sd["pos_embedding"][..., g[b.space]])


def _permute_rows(sd, key, perm):
    sd[f"{key}.weight"] = sd[f"{key}.weight"][perm]
    sd[f"{key}.bias"] = sd[f"{key}.bias"][perm]


def test_cct_head_permutations_negative_control():
    """Permuting q's and k's features jointly within a head is a symmetry; permuting q alone is not. (Permuting
    whole heads, q/k/v rows and o columns together, is one too, but not modelled yet: a head-permutation group.)"""
    model, x = make("cct")
    sd = model.state_dict()
    ref = _logits(model, sd, x)
    a = "blocks.0.attn"
    within = torch.tensor([2, 0, 3, 1, 4, 5, 6, 7])  # head 0 permuted, head 1 left alone
    joint, alone = dict(sd), dict(sd)
    for key in ("q_proj", "k_proj"):
        _permute_rows(joint, f"{a}.{key}", within)
    _permute_rows(alone, f"{a}.q_proj", within)
    torch.testing.assert_close(_logits(model, joint, x), ref, atol=1e-5, rtol=1e-5)
    assert (_logits(model, alone, x) - ref).abs().max() > 1e-3
    across = torch.tensor([4, 1, 2, 3, 0, 5, 6, 7])  # swaps a feature of head 0 with one of head 1: not a symmetry
    mixed = dict(sd)
    for key in ("q_proj", "k_proj"):
        _permute_rows(mixed, f"{a}.{key}", across)
    assert (_logits(model, mixed, x) - ref).abs().max() > 1e-3
    swap = torch.tensor([4, 5, 6, 7, 0, 1, 2, 3])  # whole heads swapped everywhere: a symmetry outside the spec
    heads = dict(sd)
    for key in ("q_proj", "k_proj", "v_proj"):
        _permute_rows(heads, f"{a}.{key}", swap)
    heads[f"{a}.o_proj.weight"] = sd[f"{a}.o_proj.weight"][:, swap]
    torch.testing.assert_close(_logits(model, heads, x), ref, atol=1e-5, rtol=1e-5)


def test_default_cct_random_element_preserves_logits():
    model = build_model("cct", in_shape=(1, 28, 28), num_classes=10, seed=0).eval()
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    spec = mc.symmetry_spec(model, x)
    assert len(spec.spaces) == 1 + 1 + 2 * (2 * 4 + 1) + 1
    sd = model.state_dict()
    torch.testing.assert_close(_logits(model, spec.apply(sd, spec.random_element(seed=0)), x), _logits(model, sd, x),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, n_spaces",
    [
        ({"dim": 8, "num_heads": 1}, 1 + 1 + 2 * (2 + 1) + 1),  # one head: q/k and v/o spaces span all features
        ({"dim": 12, "num_heads": 3, "depth": 1, "conv_layers": 1}, 1 + (2 * 3 + 1) + 1),  # no hidden tokenizer conv
        # head width 1: per-head permutations are trivial, but permuting the heads of q, k, v (and o's columns)
        # jointly is a symmetry, found by the batched-matmul rule: one space per block over all heads
        ({"dim": 4, "num_heads": 4}, 1 + 1 + 2 * (1 + 1) + 1),
    ],
)
def test_cct_head_configurations(kwargs, n_spaces):
    model = build_model("cct", in_shape=(1, 8, 8), num_classes=3, seed=0, **kwargs).eval()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    spec = mc.symmetry_spec(model, x)
    assert len(spec.spaces) == n_spaces
    sd = model.state_dict()
    torch.testing.assert_close(_logits(model, spec.apply(sd, spec.random_element(seed=2)), x), _logits(model, sd, x),
                               atol=1e-5, rtol=1e-5)


def test_cct_activation_matching_recovers_planted():
    model, x = make("cct")
    spec = mc.symmetry_spec(model, x)
    other = copy.deepcopy(model)
    other.load_state_dict(spec.apply(model.state_dict(), spec.random_element(seed=5)))
    loader = [torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    res = mc.activation_matching(spec, model, other, loader)
    torch.testing.assert_close(_logits(model, res.apply(other.state_dict()), x), _logits(model, model.state_dict(), x),
                               atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------- tracer rules, negatives


class _Tokens(nn.Module):
    """inp → (+ parameter / matmul with a parameter / …) → out, on (N, T, D) tokens; ``mode`` picks the op."""

    def __init__(self, mode: str, d: int = 6, t: int = 5):
        super().__init__()
        self.mode = mode
        self.inp, self.out, self.k = nn.Linear(3, d), nn.Linear(d, 2), nn.Linear(3, d // 2)
        self.p, self.mix = nn.Parameter(torch.randn(t, d)), nn.Parameter(torch.randn(d, d))
        self.per_token = nn.Parameter(torch.randn(t, 1))
        self.register_buffer("const", torch.randn(d), persistent=False)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        if self.mode == "add":  # bound to the hidden space; per-token offsets need no binding
            h = (h + self.p) * self.per_token
        elif self.mode == "add+reduce":  # p also read by a reduction: it cannot be permuted, so neither can h (an
            # error by default since #18 — a live space frozen without a report; on_unsupported="freeze" accepts it)
            h = h + self.p + self.p.sum()
        elif self.mode == "matmul-param":  # contracts the permuted dim with a matrix that moves along (its columns)
            h = h @ self.mix.transpose(0, 1)
        elif self.mode == "non-persistent":  # a buffer outside the state dict cannot move with h
            h = h * self.const
        elif self.mode == "shared-k":  # q in 2 heads, one k for all heads (multi-query): both heads join k's space
            q, k = h.unflatten(-1, (2, 3)).transpose(1, 2), self.k(x).unflatten(-1, (1, 3)).transpose(1, 2)
            h = h + (q @ k.transpose(-2, -1)).sum()
        elif self.mode == "split-conflict":  # the same space cut into 2 groups of 3 and 3 groups of 2
            h = h + h.unflatten(-1, (2, 3)).sum() + h.unflatten(-1, (3, 2)).sum()
        elif self.mode == "mean-over-heads":  # averaging the heads joins their spaces (one permutation for both)
            m = h.unflatten(-1, (2, 3)).mean(2)
            h = torch.cat([m, m], -1)
        elif self.mode == "tile":  # repeat along the permuted dim: no rule
            h = h.unflatten(-1, (2, 3)).mean(2).repeat(1, 1, 2)
        return self.out(h)


@pytest.mark.parametrize(
    "mode, error, hidden_bound",
    [
        ("add", None, True),
        ("add+reduce", "also read where it cannot move", False),  # #18: a silent freeze is an error unless asked
        ("non-persistent", None, False),
        ("matmul-param", None, True),  # the matrix's columns bound to the hidden space
        ("shared-k", None, True),
        ("split-conflict", "already split into groups of another width", False),
        ("mean-over-heads", None, True),
        ("tile", "no symmetry rule", False),
    ],
)
def test_parameter_and_matmul_rules(mode, error, hidden_bound):
    torch.manual_seed(0)
    model = _Tokens(mode).eval()
    x = torch.randn(4, 5, 3)
    if error is not None:
        with pytest.raises(UnsupportedOperationError, match=error):
            mc.symmetry_spec(model, x)
    spec = mc.symmetry_spec(model, x, on_unsupported="freeze" if error else "error")
    assert bool(spec.spaces) == hidden_bound
    assert (spec.tensors["p"] != ()) == (hidden_bound and mode == "add")
    assert spec.tensors["per_token"] == ()
    assert [b.axis for b in spec.tensors["mix"]] == ([1] if mode == "matmul-param" else [])
    if spec.spaces:
        sd = model.state_dict()
        torch.testing.assert_close(_logits(model, spec.apply(sd, spec.random_element(seed=1)), x), model(x).detach(),
                                   atol=1e-5, rtol=1e-5)


def test_a_matmul_rule_that_binds_the_other_axis_of_the_parameter_is_caught(monkeypatch):
    from dataclasses import replace

    from modeconn.symmetry.trace.ops import attention

    real = attention.matmul_parameter
    monkeypatch.setattr(attention, "matmul_parameter", lambda tr, node, x, p: real(tr, node, x, replace(p, order=(0, 1))))
    with pytest.raises(SpecError, match="changes its function"):
        mc.symmetry_spec(_Tokens("matmul-param").eval(), torch.randn(4, 5, 3))


def test_unknown_ops_still_raise():
    class Roll(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 2)

        def forward(self, x):
            return self.b(torch.roll(F.gelu(self.a(x)), 1, dims=-1))

    with pytest.raises(UnsupportedOperationError, match="roll"):
        mc.symmetry_spec(Roll(), torch.randn(3, 4))
    assert mc.symmetry_spec(Roll(), torch.randn(3, 4), on_unsupported="freeze").spaces == {}
