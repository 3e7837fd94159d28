"""A group is one module: its weight-matching solver and learned parameterisation are hooks on the group; tied
tensors (aliases) and fused permutation gathers are the IR's own (issue #15, items 4 and 5)."""

from __future__ import annotations

import pytest
import torch

import modeconn as mc
from modeconn.errors import SpecError
from modeconn.match import solvers
from modeconn.match.parametrize import make_transform
from modeconn.symmetry import AxisBinding as AB
from modeconn.symmetry import Space, SymmetrySpec
from modeconn.symmetry.groups import ASSIGNMENT, GROUPS, Group, GroupTransform, InvertibleGroup, Solver, get_group
from modeconn.symmetry.groups.base import GroupRegistry
from modeconn.symmetry.groups.learning import get_parameterization
from modeconn.symmetry.groups.solving import Stats, best_scale, general_cost, trace

pytestmark = pytest.mark.usefixtures("one_thread")

PARAMS = {"head_orthogonal": {"dim": 4, "rotary_dims": 2}, "head_invertible": {"dim": 4, "rotary_dims": 2},
          "block_permutation": {"dim": 4}}


# ------------------------------------------------------------------------------------------ registry
@pytest.mark.parametrize("name", GROUPS.names())
def test_every_group_declares_its_solver_and_parameterisation(name):
    cls = GROUPS.get(name)
    assert "solver" in dir(cls) and "transform" in dir(cls)  # declared (None allowed), never inherited from Group
    group = get_group(name, **PARAMS.get(name, {}))
    if group.exact and group.unitwise:  # a permutation per unit (experts' hidden units): one LAP per unit, not learned
        m, c = solvers.solve(group, _stats(3, group.dim))
        assert cls.transform is None and torch.equal(m.sum(-1), torch.ones(3, group.dim, dtype=m.dtype))
        assert torch.equal(group.matrices(group.from_matrices(m)), m)
        return
    if group.exact:  # permutations: linear assignment, not learned
        assert cls.solver is ASSIGNMENT and cls.transform is None
        assert solvers.is_assignment(group)
        with pytest.raises(SpecError, match="linear assignment"):
            solvers.solve(group, _stats(1, 1))
        with pytest.raises(SpecError, match="no continuous parameterisation"):
            make_transform(group, group.identity(3))
        return
    assert isinstance(cls.solver, Solver) and issubclass(cls.transform, GroupTransform)
    # the solver runs on statistics of the group's block size; the transform starts exactly at an element
    n = 3
    d = 1 if name == "scaling" else (group.dim if group.unitwise else n)
    m, c = solvers.solve(group, _stats(n if group.unitwise else 1, d))
    assert m.shape[-2:] == (d, d) and torch.isfinite(c).all()
    torch.testing.assert_close(c, solvers.cost(group, m, _stats(n if group.unitwise else 1, d)))
    e = group.random(n, torch.Generator().manual_seed(0))
    t = make_transform(group, e, "cayley")
    assert isinstance(t, cls.transform) and torch.equal(t(), e)


def _stats(batch: int, d: int, seed: int = 0) -> Stats:
    gen = torch.Generator().manual_seed(seed)
    x = [torch.randn(batch, d, 5, generator=gen, dtype=torch.float64) for _ in range(4)]
    return Stats(x[0] @ x[1].mT, x[2] @ x[3].mT, x[2] @ x[2].mT, x[1] @ x[1].mT, x[3] @ x[3].mT)


def test_registering_a_group_without_its_hooks_is_an_error():
    reg = GroupRegistry("group")

    class NoHooks(InvertibleGroup):
        name = "no_hooks"

    bare = type("Bare", (Group,), {"name": "bare"})
    with pytest.raises(SpecError, match=r"bare.*does not declare \['solver', 'transform'\]"):
        reg.register("bare")(bare)
    with pytest.raises(SpecError, match="registered as 'other'"):
        reg.register("other")(NoHooks)  # inherits the hooks, but its name differs
    assert reg.names() == []


# ------------------------------------------------------------------------------------------ no solver: an error
class _NoSolverGL(InvertibleGroup):
    """GL(n) without a weight-matching solver (a non-isometric group a user forgot to give one)."""

    name = "gl_without_solver"
    solver = None
    transform = None


def _mlp(seed: int, hidden: int = 6):
    gen = torch.Generator().manual_seed(seed)
    return {"fc1.weight": torch.randn(hidden, 4, generator=gen), "fc1.bias": torch.randn(hidden, generator=gen),
            "fc2.weight": torch.randn(3, hidden, generator=gen), "fc2.bias": torch.randn(3, generator=gen)}


def _mlp_spec(group: str) -> SymmetrySpec:
    return SymmetrySpec({"H": Space("H", 6, group)},
                        {"fc1.weight": (AB(0, "H"),), "fc1.bias": (AB(0, "H"),), "fc2.weight": (AB(1, "H", "in"),),
                         "fc2.bias": ()})


def test_a_non_isometric_group_without_a_solver_is_an_error_not_gl(monkeypatch):
    monkeypatch.setitem(GROUPS._items, _NoSolverGL.name, _NoSolverGL)
    sd_a, sd_b = _mlp(0), _mlp(1)
    # positive control: the same space with the registered invertible group is matched
    res = mc.weight_matching(_mlp_spec("invertible"), sd_a, sd_b, restarts=1)
    assert res.element["H"].shape == (6, 6)
    spec = _mlp_spec(_NoSolverGL.name)
    with pytest.raises(SpecError, match=r"group 'gl_without_solver' of space 'H' has no weight-matching solver: non-isometric"):
        mc.weight_matching(spec, sd_a, sd_b, restarts=1)
    with pytest.raises(SpecError, match="gl_without_solver"):
        solvers.solve(spec.group_of("H"), _stats(1, 6))
    with pytest.raises(SpecError, match="no continuous parameterisation"):
        make_transform(spec.group_of("H"), torch.eye(6))


# ------------------------------------------------------------------------------------------ a new group: one file
class _UniformScalingSolver(Solver):
    """``M = c·I``: the best positive ``c`` on the exact 1-D restriction of ``D`` (writers ``c``, readers ``1/c``)."""

    def solve(self, group, st):
        c = best_scale(torch.ones(st.k_out.shape[:-2], dtype=torch.float64), trace(st.yy_out), trace(st.k_out),
                       trace(st.yy_in), trace(st.k_in))
        eye = torch.eye(st.k_out.shape[-1], dtype=torch.float64)
        m = c[..., None, None] * eye
        return m, general_cost(m, st)


class _UniformScalingTransform(GroupTransform):
    def __init__(self, group, element, parameterization):
        super().__init__(group, element.shape[0], parameterization)
        self.register_buffer("base", element.detach().clone())
        self.log_scale = torch.nn.Parameter(torch.zeros((), dtype=element.dtype))

    def forward(self):
        return self.base * torch.exp(self.log_scale)


class _UniformScaling(InvertibleGroup):
    """``c·I`` with ``c > 0`` on a whole space (elements stored as matrices): everything weight matching and learned
    matching need comes from its two hooks — no change to ``match/``."""

    name = "uniform_scaling_test"
    solver = _UniformScalingSolver()
    transform = _UniformScalingTransform

    def random(self, n, generator):
        return float(torch.empty(()).uniform_(0.5, 2.0, generator=generator)) * torch.eye(n)


def test_a_new_group_needs_only_its_own_definition(monkeypatch):
    GroupRegistry("group").register(_UniformScaling.name)(_UniformScaling)  # the hooks pass registration
    monkeypatch.setitem(GROUPS._items, _UniformScaling.name, _UniformScaling)
    spec = _mlp_spec(_UniformScaling.name)
    sd = _mlp(0)
    g = spec.random_element(seed=3)
    res = mc.weight_matching(spec, sd, spec.apply(sd, g), restarts=1)
    torch.testing.assert_close(res.element["H"] @ g["H"], torch.eye(6), atol=1e-4, rtol=0)
    t = make_transform(spec.group_of("H"), g["H"], get_parameterization("cayley"))
    assert torch.equal(t(), g["H"]) and [p.shape for p in t.parameters()] == [torch.Size([])]


# ------------------------------------------------------------------------------------------ aliases in the IR
def _tied_spec(**aliases) -> SymmetrySpec:
    tensors = {"emb.weight": (AB(1, "R", "out"),), "head.weight": (), "fc.weight": (AB(0, "R"),)}
    return SymmetrySpec({"R": Space("R", 4)}, tensors, aliases=aliases or {"head.weight": "emb.weight"})


def _tied_sd():
    w = torch.randn(7, 4, generator=torch.Generator().manual_seed(0))
    return {"emb.weight": w, "head.weight": w, "fc.weight": torch.randn(4, 4)}


def test_aliases_are_the_specs_own():
    spec = _tied_spec()
    sd = _tied_sd()
    spec.validate(sd)
    g = spec.random_element(seed=1)
    out = spec.apply(sd, g)
    assert out["head.weight"] is out["emb.weight"] and not torch.equal(out["emb.weight"], sd["emb.weight"])
    assert list(out) == list(sd)
    short = {k: v for k, v in sd.items() if k != "head.weight"}  # stored without the tied key
    spec.validate(short)
    assert "head.weight" not in spec.apply(short, g)
    assert spec.primary_of("head.weight") == "emb.weight" and spec.primary_of("fc.weight") == "fc.weight"
    assert spec.aliases_in(short) == {} and spec.aliases_in(sd) == {"head.weight": "emb.weight"}


def test_a_broken_alias_is_a_spec_error_naming_both_keys():
    sd = _tied_sd()
    with pytest.raises(SpecError, match=r"'head\.weight'.*'missing\.weight'"):
        _tied_spec(**{"head.weight": "missing.weight"})  # target missing
    with pytest.raises(SpecError, match=r"'head\.weight' \(alias of 'emb\.weight'\) is bound differently"):
        SymmetrySpec({"R": Space("R", 4)},
                     {"emb.weight": (AB(1, "R", "out"),), "head.weight": (AB(1, "R", "in"),), "fc.weight": (AB(0, "R"),)},
                     aliases={"head.weight": "emb.weight"})
    spec = _tied_spec()
    with pytest.raises(SpecError, match=r"'head\.weight' is tied to 'emb\.weight'.*differ"):
        spec.validate(sd | {"head.weight": sd["emb.weight"] + 1})  # untied values
    with pytest.raises(SpecError, match=r"'head\.weight'.*primary 'emb\.weight' is not"):
        spec.validate({k: v for k, v in sd.items() if k != "emb.weight"})


def test_fused_gathers_equal_binding_by_binding():
    """Several permutation bindings on one axis (a concatenation) and on two axes: one gather per axis equals
    acting binding by binding, exactly, in any dtype."""
    spec = SymmetrySpec({"A": Space("A", 3), "B": Space("B", 2), "C": Space("C", 5)},
                        {"w": (AB(0, "A", block=2, partial=True), AB(0, "B", offset=6, partial=True), AB(1, "C", "in")),
                         "v": (AB(0, "C"),)})
    g = spec.random_element(seed=4)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        t = (torch.arange(8 * 5).reshape(8, 5) * 3).to(dtype)
        ref = t
        for b in spec.tensors["w"]:
            ref = spec.apply_tensor("w", ref, g, skip=[x for x in spec.tensors["w"] if x is not b])
        assert torch.equal(spec.apply_tensor("w", t, g), ref)
        gathers = spec.permutation_gathers("w", t.shape, g)
        assert gathers is not None and sorted(gathers) == [0, 1]
