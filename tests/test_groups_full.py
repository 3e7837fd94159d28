"""The full transformer symmetry group in the IR (METHODS.md §0, §3) and weight matching for it.

A tiny hand-written decoder (token embedding → blocks of multi-head attention with partial rotary
embeddings on q/k, a ReLU MLP in one block and a SwiGLU MLP in the other, residual stream, parameter-free
RMSNorm, unembedding) with a hand-written :class:`SymmetrySpec`: a global residual rotation (valid because
the RMSNorm has no weight), head permutations, per-head QK transforms (restricted to RoPE-commuting scaled
rotations on the rotary dims, free on the rest), per-head OV transforms, FFN permutations and scalings.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import modeconn as mc
from modeconn.errors import SpecError
from modeconn.symmetry import AxisBinding as AB
from modeconn.symmetry import Space, SymmetrySpec
from modeconn.symmetry.groups import GROUPS, get_group

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, D, H, HD, ROT, FFN, GLU, T = 40, 16, 3, 6, 4, 10, 8, 7


# ------------------------------------------------------------------------------------------ tiny transformer
def _rope(x: torch.Tensor, rot: int) -> torch.Tensor:
    """GPT-NeoX partial rotary embedding on the first ``rot`` dims of each head, rotate_half pairing."""
    t = x.shape[-2]
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    xr, xp = x[..., :rot], x[..., rot:]
    half = torch.cat([-xr[..., rot // 2:], xr[..., : rot // 2]], -1)
    return torch.cat([xr * cos + half * sin, xp], -1)


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Block(nn.Module):
    def __init__(self, glu: bool, fused: bool):
        super().__init__()
        self.glu, self.fused = glu, fused
        if fused:  # GPT-NeoX layout: rows per head [q_h | k_h | v_h]
            self.qkv = nn.Linear(D, 3 * H * HD)
        else:
            self.q, self.k, self.v = nn.Linear(D, H * HD), nn.Linear(D, H * HD), nn.Linear(D, H * HD)
        self.o = nn.Linear(H * HD, D)
        if glu:
            self.gate, self.up, self.down = nn.Linear(D, GLU), nn.Linear(D, GLU), nn.Linear(GLU, D)
        else:
            self.fc1, self.fc2 = nn.Linear(D, FFN), nn.Linear(FFN, D)

    def forward(self, x, norm: bool):
        b, t, _ = x.shape
        h = _rms(x) if norm else x
        if self.fused:
            q, k, v = self.qkv(h).view(b, t, H, 3 * HD).transpose(1, 2).chunk(3, dim=-1)
        else:
            q, k, v = (m(h).view(b, t, H, HD).transpose(1, 2) for m in (self.q, self.k, self.v))
        q, k = _rope(q, ROT), _rope(k, ROT)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, H * HD))
        h = _rms(x) if norm else x
        if self.glu:
            return x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x + self.fc2(F.relu(self.fc1(h)))


class TinyLM(nn.Module):
    def __init__(self, seed: int = 0, norm: bool = True, fused: bool = False):
        super().__init__()
        torch.manual_seed(seed)
        self.norm = norm
        self.embed = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList([Block(glu=False, fused=fused), Block(glu=True, fused=fused)])
        self.unembed = nn.Linear(D, VOCAB)
        with torch.no_grad():  # non-trivial biases everywhere
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    m.bias.normal_(0, 0.3)

    def forward(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, self.norm)
        return self.unembed(_rms(x) if self.norm else x)


def tiny_spec(
    model: TinyLM,
    residual: str = "orthogonal",
    qk: str = "head_invertible",
    ov: str = "head_invertible",
    scaling: bool = True,
    rotary: bool = True,
    heads: bool = True,
    drop: tuple[str, str] | None = None,
) -> SymmetrySpec:
    """The hand-written spec; ``drop=(tensor, space)`` removes that binding (negative controls)."""
    qk_params = {"dim": HD, "rotary_dims": ROT if rotary else 0, "rotary_pairing": "half"}
    spaces = [Space("R", D, residual)]
    tensors: dict[str, tuple[AB, ...]] = {"embed.weight": (AB(1, "R", "out"),), "unembed.weight": (AB(1, "R", "in"),),
                                          "unembed.bias": ()}
    for i, blk in enumerate(model.blocks):
        p, hs, qs, vs, fs, ss = f"blocks.{i}.", f"L{i}.heads", f"L{i}.qk", f"L{i}.ov", f"L{i}.ffn", f"L{i}.scale"
        parent = hs if heads else None
        if heads:
            spaces.append(Space(hs, H))
        spaces += [Space(qs, H, qk, parent=parent, params=qk_params), Space(vs, H, ov, parent=parent, params={"dim": HD})]
        hp = (AB(0, hs, "out", HD),) if heads else ()
        if blk.fused:
            qkv = ((AB(0, hs, "out", 3 * HD),) if heads else ()) + (
                AB(0, qs, "out", HD, 0, stride=3 * HD), AB(0, qs, "in", HD, HD, stride=3 * HD),
                AB(0, vs, "out", HD, 2 * HD, stride=3 * HD))
            tensors[p + "qkv.weight"] = qkv + (AB(1, "R", "in"),)
            tensors[p + "qkv.bias"] = qkv
        else:
            tensors[p + "q.weight"] = hp + (AB(0, qs, "out", HD), AB(1, "R", "in"))
            tensors[p + "q.bias"] = hp + (AB(0, qs, "out", HD),)
            tensors[p + "k.weight"] = hp + (AB(0, qs, "in", HD), AB(1, "R", "in"))
            tensors[p + "k.bias"] = hp + (AB(0, qs, "in", HD),)
            tensors[p + "v.weight"] = hp + (AB(0, vs, "out", HD), AB(1, "R", "in"))
            tensors[p + "v.bias"] = hp + (AB(0, vs, "out", HD),)
        tensors[p + "o.weight"] = (AB(0, "R", "out"),) + ((AB(1, hs, "in", HD),) if heads else ()) + (AB(1, vs, "in", HD),)
        tensors[p + "o.bias"] = (AB(0, "R", "out"),)
        n = GLU if blk.glu else FFN
        spaces.append(Space(fs, n))
        sc = (lambda *b: b) if scaling else (lambda *b: ())
        if scaling:
            spaces.append(Space(ss, n, "scaling", parent=fs))
        if blk.glu:
            tensors[p + "gate.weight"] = (AB(0, fs, "out"), AB(1, "R", "in"))
            tensors[p + "gate.bias"] = (AB(0, fs, "out"),)
            tensors[p + "up.weight"] = (AB(0, fs, "out"), *sc(AB(0, ss, "out")), AB(1, "R", "in"))
            tensors[p + "up.bias"] = (AB(0, fs, "out"), *sc(AB(0, ss, "out")))
            tensors[p + "down.weight"] = (AB(0, "R", "out"), AB(1, fs, "in"), *sc(AB(1, ss, "in")))
            tensors[p + "down.bias"] = (AB(0, "R", "out"),)
        else:
            tensors[p + "fc1.weight"] = (AB(0, fs, "out"), *sc(AB(0, ss, "out")), AB(1, "R", "in"))
            tensors[p + "fc1.bias"] = (AB(0, fs, "out"), *sc(AB(0, ss, "out")))
            tensors[p + "fc2.weight"] = (AB(0, "R", "out"), AB(1, fs, "in"), *sc(AB(1, ss, "in")))
            tensors[p + "fc2.bias"] = (AB(0, "R", "out"),)
    if drop is not None:
        key, space = drop
        tensors[key] = tuple(b for b in tensors[key] if b.space != space)
    return SymmetrySpec({s.name: s for s in spaces}, tensors)


TOKENS = torch.randint(0, VOCAB, (4, T), generator=torch.Generator().manual_seed(0))


def logits(model, sd, x=TOKENS):
    m = copy.deepcopy(model)
    m.load_state_dict({k: v.float() for k, v in sd.items()})
    with torch.no_grad():
        return m.eval()(x)


def _max_diff(sd1, sd2):
    return max(float((sd1[k].float() - sd2[k].float()).abs().max()) for k in sd1)


# ------------------------------------------------------------------------------------------ group laws
GROUP_CASES = [
    ("permutation", {}, 7),
    ("orthogonal", {}, 6),
    ("invertible", {}, 6),
    ("scaling", {}, 7),
    ("head_orthogonal", {"dim": 6}, 3),
    ("head_orthogonal", {"dim": 6, "rotary_dims": 4, "rotary_pairing": "interleaved"}, 3),
    ("head_invertible", {"dim": 6}, 3),
    ("head_invertible", {"dim": 6, "rotary_dims": 4}, 3),
    ("head_invertible", {"dim": 4, "rotary_dims": 4, "rotary_pairing": "interleaved"}, 2),
]


def _block(name, params):
    return params.get("dim", 1) if name.startswith("head") else 2


@pytest.mark.parametrize("name,params,n", GROUP_CASES, ids=[f"{c[0]}{c[1]}" for c in GROUP_CASES])
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_group_laws(name, params, n, seed):
    grp = get_group(name, **params)
    gen = torch.Generator().manual_seed(seed)
    g, h, k = (grp.random(n, gen) for _ in range(3))
    e = grp.identity(n)
    for x in (g, h, k, e):
        grp.check(x, n, "S")
    assert grp.equal(grp.compose(g, grp.inverse(g)), e) and grp.equal(grp.compose(grp.inverse(g), g), e)
    assert grp.equal(grp.compose(g, e), g) and grp.equal(grp.compose(e, g), g)
    assert grp.equal(grp.compose(grp.compose(g, h), k), grp.compose(g, grp.compose(h, k)))
    assert grp.equal(grp.random(n, torch.Generator().manual_seed(seed)), g), "same seed, same element"
    grp.check(grp.compose(g, h), n, "S")
    grp.check(grp.inverse(g), n, "S")
    # action: act(act(t, h), g) = act(t, g∘h) on both sides; writer/reader pairs cancel (M^{-T} on readers)
    block = _block(name, params)
    w_out = torch.randn(n * block, 5, generator=gen)  # rows write the space
    w_in = torch.randn(3, n * block, generator=gen)  # columns read it
    for side, t, axis in (("out", w_out, 0), ("in", w_in, 1)):
        lhs = grp.act(grp.act(t, axis, h, side, block), axis, g, side, block)
        rhs = grp.act(t, axis, grp.compose(g, h), side, block)
        torch.testing.assert_close(lhs, rhs, atol=1e-4, rtol=1e-4)
    prod = grp.act(w_in, 1, g, "in", block) @ grp.act(w_out, 0, g, "out", block)
    torch.testing.assert_close(prod, w_in @ w_out, atol=1e-4, rtol=1e-4)


def test_registry_and_bad_elements_name_the_space():
    assert {"permutation", "orthogonal", "invertible", "scaling", "head_orthogonal", "head_invertible"} <= set(GROUPS.names())
    with pytest.raises(SpecError, match="shape"):
        get_group("orthogonal").check(torch.eye(3), 4, "R")
    with pytest.raises(SpecError, match="'R'.*not orthogonal"):
        get_group("orthogonal").check(2 * torch.eye(3), 3, "R")
    sing = torch.eye(3)
    sing[2, 2] = 0
    with pytest.raises(SpecError, match="'R'.*singular"):
        get_group("invertible").check(sing, 3, "R")
    with pytest.raises(SpecError, match="'F'.*non-positive scale .* unit 1"):
        get_group("scaling").check(torch.tensor([1.0, -2.0, 3.0]), 3, "F")
    with pytest.raises(SpecError, match="'F'.*NaN"):
        get_group("scaling").check(torch.tensor([1.0, float("nan"), 3.0]), 3, "F")
    hi = get_group("head_invertible", dim=4, rotary_dims=2)
    bad = hi.identity(2)
    bad[1, 0, 2] = 0.5  # couples a rotary dim with a pass-through dim
    with pytest.raises(SpecError, match="'QK'.*head 1.*rotary"):
        hi.check(bad, 2, "QK")
    with pytest.raises(SpecError, match="'QK'.*singular.*head 0"):
        hi.check(torch.zeros(2, 4, 4), 2, "QK")
    with pytest.raises(SpecError, match="float32/float64"):
        hi.check(hi.identity(2).half(), 2, "QK")
    with pytest.raises(SpecError, match="rotary_dims"):
        get_group("head_invertible", dim=4, rotary_dims=3)
    with pytest.raises(SpecError, match="bad parameters"):
        get_group("head_invertible")


# ------------------------------------------------------------------------------------------ the full group
@pytest.mark.parametrize("fused", [False, True], ids=["separate-qkv", "fused-qkv"])
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_full_group_preserves_logits(fused, seed):
    model = TinyLM(fused=fused)
    spec = tiny_spec(model)
    spec.validate(model)
    sd = model.state_dict()
    before = {k: v.clone() for k, v in sd.items()}
    g = spec.random_element(seed=seed)
    sd_g = spec.apply(sd, g)
    torch.testing.assert_close(logits(model, sd_g), logits(model, sd), atol=1e-4, rtol=1e-4)
    assert all(torch.equal(sd[k], before[k]) for k in sd), "apply mutated its input"
    assert _max_diff(sd_g, sd) > 0.1
    # group laws at the spec level, including the semidirect product of heads ⋉ per-head transforms
    h = spec.random_element(seed=seed + 1)
    lhs, rhs = spec.apply(spec.apply(sd, h), g), spec.apply(sd, spec.compose(g, h))
    assert _max_diff(lhs, rhs) < 1e-4
    assert _max_diff(spec.apply(sd_g, spec.inverse(g)), sd) < 1e-4
    assert spec.equal(spec.compose(g, spec.inverse(g)), spec.identity())
    assert spec.equal(spec.compose(spec.inverse(g), g), spec.identity())
    assert not spec.equal(g, h)


@pytest.mark.parametrize(
    "drop",
    [("blocks.0.k.weight", "L0.qk"), ("blocks.1.o.weight", "L1.ov"), ("blocks.0.fc2.weight", "L0.scale"),
     ("unembed.weight", "R")],
    ids=["k-rows-without-QK", "o-cols-without-OV", "fc2-without-scale", "unembed-without-residual"],
)
def test_negative_control_missing_binding_breaks_logits(drop):
    model = TinyLM()
    full, broken = tiny_spec(model), tiny_spec(model, drop=drop)
    sd = model.state_dict()
    g = full.random_element(seed=3)
    ref = logits(model, sd)
    torch.testing.assert_close(logits(model, full.apply(sd, g)), ref, atol=1e-4, rtol=1e-4)
    assert (logits(model, broken.apply(sd, g)) - ref).abs().max() > 1e-2


def test_negative_control_rope_needs_the_rotary_restriction():
    """An unrestricted GL(d) QK transform does not commute with RoPE: logits change."""
    model = TinyLM()
    spec = tiny_spec(model, rotary=False)
    sd = model.state_dict()
    assert (logits(model, spec.apply(sd, spec.random_element(seed=0))) - logits(model, sd)).abs().max() > 1e-2


def test_spec_validation_of_parents_and_children():
    model = TinyLM()
    spec = tiny_spec(model)
    assert spec.children["L0.heads"] == ("L0.qk", "L0.ov") and spec.spaces["L0.qk"].params == (
        ("dim", HD), ("rotary_dims", ROT), ("rotary_pairing", "half"))
    assert "parent=L0.heads" in spec.summary()
    # a child binding outside its parent's bindings
    with pytest.raises(SpecError, match="'blocks.0.o.weight' axis 1.*not inside a binding of its parent 'L0.heads'"):
        tiny_spec(model, drop=("blocks.0.o.weight", "L0.heads"))
    spaces = dict(spec.spaces)
    with pytest.raises(SpecError, match="'L0.qk'.*block = dim"):
        SymmetrySpec(spaces, dict(spec.tensors, **{"blocks.0.q.bias": (AB(0, "L0.heads", "out", HD), AB(0, "L0.qk", "out", 2, 0, True))}))
    bad = dict(spaces, **{"L0.qk": Space("L0.qk", H, "invertible", parent="L0.heads")})
    with pytest.raises(SpecError, match="cannot be the child"):
        SymmetrySpec(bad, spec.tensors)
    bad = dict(spaces, **{"L0.qk": Space("L0.qk", H, "head_invertible", parent="L0.ov", params={"dim": HD})})
    with pytest.raises(SpecError, match="parent 'L0.ov' must be a permutation"):
        SymmetrySpec(bad, spec.tensors)
    bad = dict(spaces, **{"L0.qk": Space("L0.qk", H, "head_invertible", parent="L0.heads")})
    with pytest.raises(SpecError, match="'L0.qk'.*bad parameters"):
        SymmetrySpec(bad, spec.tensors)
    with pytest.raises(SpecError, match="bound twice"):
        SymmetrySpec({"P": Space("P", 2), "Q": Space("Q", 2)},
                     {"w": (AB(0, "P", "out", 2, 0, stride=3), AB(0, "Q", "out", 1, 1, stride=3))})
    g = spec.random_element(seed=0)
    g["L1.ov"] = -g["L1.ov"][:, :1]
    with pytest.raises(SpecError, match="'L1.ov'.*shape"):
        spec.apply(model.state_dict(), g)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_storage_computes_in_fp32_and_casts_once(dtype):
    model = TinyLM()
    spec = tiny_spec(model)
    sd = {k: v.to(dtype) for k, v in model.state_dict().items()}
    g = spec.random_element(seed=1)
    out = spec.apply(sd, g)
    ref = spec.apply({k: v.float() for k, v in sd.items()}, g)
    for k in sd:
        assert out[k].dtype == dtype
        assert torch.equal(out[k], ref[k].to(dtype)), k  # fp32 compute, one cast at the end
    tol = 0.05 if dtype == torch.bfloat16 else 1e-2
    torch.testing.assert_close(logits(model, out), logits(model, sd), atol=tol, rtol=tol)


# ------------------------------------------------------------------------------------------ weight matching
def _aligned_error(spec, res, sd_b, sd_a):
    return _max_diff(spec.apply(sd_b, res.element), sd_a)


def test_weight_matching_recovers_isometric_plants():
    """Residual rotation, head permutations with per-head rotations (RoPE-restricted on QK), FFN permutations:
    WM on (θ, g·θ) returns g^{-1}."""
    model = TinyLM(seed=1)
    spec = tiny_spec(model, qk="head_orthogonal", ov="head_orthogonal", scaling=False)
    sd = model.state_dict()
    for seed in range(3):
        g = spec.random_element(seed=seed)
        sd_b = spec.apply(sd, g)
        res = mc.weight_matching(spec, sd, sd_b, seed=seed)
        assert res.stats["isometric"]
        assert _aligned_error(spec, res, sd_b, sd) < 1e-4
        assert spec.equal(spec.compose(res.element, g), spec.identity())
        assert res.objective >= res.stats["upper_bound"] * (1 - 1e-5)
        torch.testing.assert_close(logits(model, res.apply(sd_b)), logits(model, sd), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "fused,kw",
    [(False, {"residual": "invertible"}), (True, {"residual": "invertible"}), (True, {"residual": "scaling", "heads": False})],
    ids=["separate-qkv", "fused-qkv", "fused-no-head-perm-residual-scaling"],
)
def test_weight_matching_recovers_gl_and_scaling_plants(fused, kw):
    """Residual GL or scaling (no normalisation), per-head GL QK (RoPE-restricted) and OV with or without head
    permutations, FFN permutation + scaling: the matched model equals θ (and the element is g^{-1})."""
    model = TinyLM(seed=2, norm=False, fused=fused)
    spec = tiny_spec(model, **kw)
    spec.validate(model)
    sd = model.state_dict()
    g = spec.random_element(seed=5)
    sd_b = spec.apply(sd, g)
    torch.testing.assert_close(logits(model, sd_b), logits(model, sd), atol=1e-4, rtol=1e-4)
    res = mc.weight_matching(spec, sd, sd_b, seed=0)
    assert not res.stats["isometric"]
    assert _aligned_error(spec, res, sd_b, sd) < 1e-3
    assert spec.equal(spec.compose(res.element, g), spec.identity())
    assert res.objective >= res.stats["upper_bound"] * (1 - 1e-6)


def test_weight_matching_independent_models_reports_consistently():
    """Two unrelated transformers: every sweep lowers the distance, and the reported objective is
    J̃ = Σ⟨A, gB⟩ − ½(‖gB‖² − ‖B‖²) of the returned element; it beats the identity."""
    a, b = TinyLM(seed=3), TinyLM(seed=4)
    spec = tiny_spec(a, residual="orthogonal")
    sa, sb = a.state_dict(), b.state_dict()
    res = mc.weight_matching(spec, sa, sb, restarts=2, seed=0)
    for hist in res.history:
        assert all(y >= x - 1e-6 * abs(x) for x, y in itertools.pairwise(hist)), hist
    keys = [k for k, v in spec.tensors.items() if v]

    def jt(el):
        gb = spec.apply(sb, el)
        return sum(float((sa[k].double() * gb[k].double()).sum() - (gb[k].double() ** 2).sum() / 2
                         + (sb[k].double() ** 2).sum() / 2) for k in keys)

    assert res.objective == pytest.approx(jt(res.element), rel=1e-5)
    assert res.objective > jt(spec.identity())
    assert res.objective <= res.stats["upper_bound"]
    spec.check_element(res.element)


def test_solvers_closed_forms():
    """Procrustes maximises ⟨M, K⟩ over O(d); the Sylvester solution zeroes the planted surrogate; the rotary
    solvers return RoPE-commuting matrices."""
    from modeconn.match import solvers

    gen = torch.Generator().manual_seed(0)
    k = torch.randn(5, 5, generator=gen, dtype=torch.float64)
    m = solvers.procrustes(k)
    best = float((m * k).sum())
    assert best == pytest.approx(float(torch.linalg.svdvals(k).sum()))
    for _ in range(20):
        q = get_group("orthogonal").random(5, gen).double()
        assert float((q * k).sum()) <= best + 1e-9
    grp = get_group("head_invertible", dim=6, rotary_dims=4)
    mstar = grp.random(2, gen).double()
    x_out = torch.randn(2, 6, 9, generator=gen, dtype=torch.float64)
    y_out = torch.linalg.solve(mstar, x_out)  # X = M* Y
    x_in = torch.randn(2, 6, 8, generator=gen, dtype=torch.float64)
    y_in = mstar.transpose(-1, -2) @ x_in  # X = M*^{-T} Y
    stt = solvers.Stats(x_out @ y_out.mT, x_in @ y_in.mT, x_in @ x_in.mT, y_out @ y_out.mT, y_in @ y_in.mT)
    sol, c = solvers.solve(grp, stt)
    torch.testing.assert_close(sol, mstar, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, solvers.cost(grp, sol, stt))
    assert float(c.sum() + (x_out**2).sum() + (x_in**2).sum()) == pytest.approx(0, abs=1e-6)  # D = 0
    # never worse than the best rotation (the isometric candidate), on unrelated data too
    rot = get_group("head_orthogonal", dim=6, rotary_dims=4, rotary_pairing="interleaved")
    rnd = solvers.Stats(*(torch.randn(2, 6, 6, generator=gen, dtype=torch.float64) for _ in range(2)),
                        *(z @ z.mT for z in (torch.randn(3, 2, 6, 6, generator=gen, dtype=torch.float64))))
    grp_i = get_group("head_invertible", dim=6, rotary_dims=4, rotary_pairing="interleaved")
    r, cr = solvers.solve(rot, rnd)
    rot.check(r.float(), 2, "QK")
    m, cm = solvers.solve(grp_i, rnd)
    grp_i.check(m.float(), 2, "QK")
    assert (cm <= solvers.cost(grp_i, r, rnd) + 1e-9).all()
    # 1-D scale: the minimiser of q_o s² − 2 k_o s + q_i/s² − 2 k_i/s
    qo, ko, qi, ki = (torch.tensor(v, dtype=torch.float64) for v in ([2.0, 1.0], [1.0, -1.0], [3.0, 1.0], [0.5, -2.0]))
    s = solvers.best_scale(torch.ones(2, dtype=torch.float64), qo, ko, qi, ki)
    grid = torch.logspace(-3, 3, 20001, dtype=torch.float64)[:, None]
    f = qo * grid**2 - 2 * ko * grid + qi / grid**2 - 2 * ki / grid
    torch.testing.assert_close(s, grid[f.argmin(0), 0], rtol=2e-3, atol=0)
