"""Score terms of in-memory weight matching updated by low rank when a neighbouring permutation moves a few units
(:mod:`modeconn.match.score_terms`) equal the terms recomputed from scratch — on MLP, conv, inverted-residual and
attention specs (heads: several bindings on one axis) — and a full run with updates reaches the objective of one
without. Broken variants (a stale term; the other axes' gathers dropped) fail."""

from __future__ import annotations

import pytest
import torch
from archs import make

import modeconn as mc
from modeconn.match import score_terms as st
from modeconn.match.weight import scored_keys
from modeconn.symmetry import AxisBinding as AB
from modeconn.symmetry import Space, SymmetrySpec

pytestmark = pytest.mark.usefixtures("one_thread")
ARCHS = ["mlp", "resnet20-bn", "mobilenetv2", "cct", "three-axes"]


def _three_axes():
    """A hand-written spec whose tensor ``w`` has bindings on three axes (a term then reads two other axes), and
    ``u`` a block binding (two entries per unit)."""
    spec = SymmetrySpec({"A": Space("A", 16), "B": Space("B", 12), "C": Space("C", 10)},
                        {"w": (AB(0, "A"), AB(1, "B", "in"), AB(2, "C", "in")), "u": (AB(0, "B"), AB(1, "A", "in", block=2))})
    gen = torch.Generator().manual_seed(0)
    fa, fb = ({"w": torch.randn(16, 12, 10, generator=gen), "u": torch.randn(12, 32, generator=gen)} for _ in range(2))
    return spec, fa, fb


def _setup(arch: str):
    if arch == "three-axes":
        return _three_axes()
    a, x = make(arch, seed=0)
    b, _ = make(arch, seed=1)
    spec = mc.symmetry_spec(a, x)
    keys = scored_keys(spec, a.state_dict())
    fa = {k: a.state_dict()[k].float() for k in keys}
    fb = {k: b.state_dict()[k].float() for k in keys}
    return spec, fa, fb


def _moved(g: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``g`` with three of its units moved along a cycle (a new tensor)."""
    pick = torch.randperm(len(g), generator=gen)[:3]
    out = g.clone()
    out[pick] = g[pick.roll(1)]
    return out


def _cases(spec, fa):
    """(tensor, binding, moved space) for every term of a permutation space whose tensor has another binding on a
    permutation space of at least 4 units."""
    perm = {s for s in spec.spaces if spec.group_of(s).name == "permutation" and not spec.children[s]}
    for s in perm:
        for k, bd in spec.bindings_by_space[s]:
            if k not in fa:
                continue
            for other in spec.tensors[k]:
                if other is not bd and other.space in perm and spec.spaces[other.space].size >= 4:
                    yield k, bd, other.space


def _max_error(spec, fa, fb) -> tuple[float, int]:
    """Largest relative difference between an updated term and the recomputed one, and how many were updated."""
    gen = torch.Generator().manual_seed(0)
    worst, updated = 0.0, 0
    for k, bd, moved in _cases(spec, fa):
        n = spec.spaces[bd.space].size
        g0 = spec.random_element(gen)
        g1 = dict(g0) | {moved: _moved(g0[moved], gen)}
        a_mat = st.unit_matrix(fa[k], bd, n)
        terms = st.ScoreTerms(spec, fa, fb)
        terms.term(k, bd, a_mat, g0, n)
        got = terms.term(k, bd, a_mat, g1, n)
        updated += terms.updated
        fresh = st.ScoreTerms(spec, fa, fb).term(k, bd, a_mat, g1, n)
        worst = max(worst, float((got - fresh).abs().max()) / max(float(fresh.abs().max()), 1e-12))
    return worst, updated


@pytest.mark.parametrize("arch", ARCHS)
def test_low_rank_updates_equal_recomputed_terms(arch):
    spec, fa, fb = _setup(arch)
    worst, updated = _max_error(spec, fa, fb)
    assert updated > 0
    assert worst < 1e-5


def test_a_stale_term_is_caught(monkeypatch):
    spec, fa, fb = _setup("resnet20-bn")
    monkeypatch.setattr(st.ScoreTerms, "_updated", lambda self, k, bd, kept, new, n: kept.term)
    assert _max_error(spec, fa, fb)[0] > 1e-2


def test_dropping_the_other_axes_gathers_is_caught(monkeypatch):
    spec, fa, fb = _setup("three-axes")
    monkeypatch.setattr(st, "apply_gathers", lambda t, gathers: t)
    assert _max_error(spec, fa, fb)[0] > 1e-2


@pytest.mark.parametrize("arch", ["mlp", "resnet20-bn"])
def test_runs_with_and_without_updates_reach_the_same_objective(arch, monkeypatch):
    a, x = make(arch, seed=0)
    b, _ = make(arch, seed=1)
    spec = mc.symmetry_spec(a, x)
    with_updates = mc.weight_matching(spec, a.state_dict(), b.state_dict(), seed=0)
    monkeypatch.setattr(st, "MAX_UPDATES", 0)
    without = mc.weight_matching(spec, a.state_dict(), b.state_dict(), seed=0)
    assert with_updates.stats["terms_updated"] > 0 and without.stats["terms_updated"] == 0
    assert with_updates.objective == pytest.approx(without.objective, rel=1e-6)


@pytest.mark.parametrize("arch", ["mlp", "resnet20-bn", "mobilenetv2", "cct"])
def test_the_objective_read_off_kept_terms_is_the_objective(arch, monkeypatch):
    """The objective of a run is Σ⟨A_k, (g·B)_k⟩ computed directly; the broken variant reads each kept term at the
    transposed entries (``T[g(i), i]``)."""
    a, x = make(arch, seed=0)
    b, _ = make(arch, seed=1)
    spec, sa, sb = mc.symmetry_spec(a, x), a.state_dict(), b.state_dict()

    def direct(element) -> float:
        moved = spec.apply(sb, element)
        return sum(float(torch.vdot(sa[k].float().reshape(-1), moved[k].float().reshape(-1))) for k in scored_keys(spec, sa))

    res = mc.weight_matching(spec, sa, sb, seed=0)
    assert res.objective == pytest.approx(direct(res.element), rel=1e-6)
    monkeypatch.setattr(st, "assignment_score", lambda score, perm: float(score[perm, torch.arange(len(perm))].double().sum()))
    wrong = mc.weight_matching(spec, sa, sb, seed=0)
    assert abs(wrong.objective - direct(wrong.element)) > 1e-4 * abs(direct(wrong.element))
