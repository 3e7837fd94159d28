"""Class 4 — weight matching stuck in a local optimum on residual nets.

Plain coordinate descent from the identity (git-re-basin's Alg. 1) recovers a planted permutation of a residual
MLP with widths in the tens only sometimes: the residual stream couples every block, and a wrong stream
permutation is a fixed point of the per-space LAPs. modeconn's default starts from a greedy data-flow element and
runs restarts (identity, then random starts, each with a random space order), keeping the best objective.

The recovery rates are measured on 20 planted permutations, printed and recorded as a junit property.
"""

from __future__ import annotations

import pytest

import json

import torch
from rb_helpers import Arch, build, recovered, res_mlp

import modeconn as mc
from modeconn.match import weight as weight_mod

PLANTS = 20
VARIANTS = {
    "plain: identity start, 1 run": {"restarts": 1, "init": "identity"},
    "identity start + 3 restarts": {"restarts": 4, "init": "identity"},
    "greedy start, 1 run": {"restarts": 1},
    "default: greedy start + restarts": {},
}


@pytest.mark.slow
def test_default_recovers_planted_permutations_where_plain_descent_stalls(record_property):
    model = res_mlp(0, width=32, blocks=8, hidden=64)  # a 32-wide stream, 8 blocks with 64 hidden units
    spec = mc.symmetry_spec(model, torch.randn(2, 10))
    assert len(spec.spaces) == 1 + 8
    sd = model.state_dict()
    hits = dict.fromkeys(VARIANTS, 0)
    stuck = []
    for seed in range(PLANTS):
        g = spec.random_element(seed=seed)
        sd_b = spec.apply(sd, g)
        results = {name: mc.weight_matching(spec, sd, sd_b, seed=seed, **kw) for name, kw in VARIANTS.items()}
        for name, res in results.items():
            hits[name] += recovered(spec, res, g)
        plain, default = results["plain: identity start, 1 run"], results["default: greedy start + restarts"]
        if not recovered(spec, plain, g):
            stuck.append((plain.objective, default.objective, default.stats["upper_bound"], plain.history[0]))
    rates = {name: h / PLANTS for name, h in hits.items()}
    print("\nplanted-permutation recovery rates (residual MLP 32×8, hidden 64, 20 plants):")
    for name, r in rates.items():
        print(f"  {name:36s} {r:6.0%}")
    record_property("recovery_rates", json.dumps(rates))

    plain, default = rates["plain: identity start, 1 run"], rates["default: greedy start + restarts"]
    assert default >= plain
    assert default >= 0.95, rates
    # negative control: plain coordinate descent really stalls here, so a default that regressed to it would
    # fail the assertion above (0.95) — the test can fail
    assert plain < 0.95, f"the setup no longer exhibits local optima: {rates}"
    # ... and the stalls are genuine local optima: below the Cauchy–Schwarz bound, a fixed point of the sweeps
    for obj_plain, obj_default, bound, hist in stuck:
        assert obj_plain < obj_default * (1 - 1e-6) and obj_default >= bound * (1 - 1e-6)
        assert hist[-1] - hist[-2] <= 1e-9 * abs(hist[-2]) or len(hist) - 1 == 100


# A residual MLP with projection shortcuts and tiny widths, found by the fuzzer (test_fuzz_architectures): the
# greedy start used to include the second Linear of each block when matching the stream it writes, although that
# Linear also reads the block's not-yet-matched hidden space; the noise picked a wrong stream permutation and
# none of the restarts recovered (3 of 10 seeds failed with the default settings).
FUZZ_FIND = Arch(conv=False, residual=True, widths=(4, 2, 3), hidden=(9, 8, 3), norm="none", bias=True, activation="relu",
                 kernel=1, flatten_head=False, seed=1299)


def _old_greedy(self):  # the variant before the fix: every writer of a space, matched or not
    g = self.spec.identity()
    for s in self.spec.spaces:
        n = self.spec.spaces[s].size
        terms = [a_mat @ weight_mod.unit_matrix(self.spec.apply_tensor(k, self.b[k], g, skip=bd), bd, n).T
                 for k, bd, a_mat in self.terms[s] if bd.side == "out"]
        if terms:
            g[s] = weight_mod.solve_lap(sum(terms), s, self.timer)
    return g


def _fuzz_find_recovery(seeds=range(10)) -> float:
    model, x = build(FUZZ_FIND)
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    hits = 0
    for seed in seeds:
        g = spec.random_element(seed=seed)
        hits += recovered(spec, mc.weight_matching(spec, sd, spec.apply(sd, g), seed=seed), g)
    return hits / len(seeds)


def test_greedy_start_uses_only_writers_whose_inputs_are_matched():
    assert _fuzz_find_recovery() == 1.0


def test_negative_control_the_old_greedy_start_is_caught(monkeypatch):
    monkeypatch.setattr(weight_mod._Problem, "greedy", _old_greedy)
    assert _fuzz_find_recovery() < 1.0
