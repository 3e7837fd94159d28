"""Mixture-of-Experts families (Mixtral, Qwen2-MoE with its shared expert, Qwen3-MoE, OLMoE, GraniteMoE, and variants):
what every dense family passes — a spec covering every tensor, random elements keeping the logits, planted recovery,
absorption and the full group — plus the experts' own symmetry (experts with their router rows, hidden units per
expert) and its negative controls. Streaming equal to in memory and ``from_pretrained`` of aligned and merged outputs
run with the dense decoders in test_hf_families.py (``DECODERS``); here once through the CLI."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers as T
from cli_runner import run_cli
from hf_tiny import MOE_NAMES, digest, loaded, make, max_diff, outputs

import modeconn as mc
from modeconn.errors import SpecError
from modeconn.symmetry import hf
from modeconn.symmetry.spec import AxisBinding, Space, SymmetrySpec

pytestmark = pytest.mark.usefixtures("one_thread")
FULL = {"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible", "vo": "head_invertible"}


def _spec(name):
    model = make(name)
    return model, mc.symmetry_spec(model), hf.example_inputs(model)


def _experts(spec):
    return [s for s in spec.spaces if s.endswith(".experts")]


def _changes(model, spec, g, x) -> float:
    return max_diff(outputs(model, x), outputs(loaded(model, spec.apply(model.state_dict(), g)), x))


@pytest.mark.parametrize("name", MOE_NAMES)
def test_spec_covers_every_tensor_with_experts_and_their_hidden_units(name):
    model, spec, _ = _spec(name)
    spec.validate(model)
    assert set(spec.tensors) == set(model.state_dict())
    layers = [f for f in spec.structure.experts]
    assert len(_experts(spec)) == len(layers) == (1 if name == "qwen2_moe_dense_layer" else 2)
    for s in _experts(spec):
        child = s.removesuffix(".experts") + ".expert_ffn"
        assert spec.spaces[s].group == "permutation" and spec.spaces[s].size == 4
        assert spec.spaces[child].parent == s and dict(spec.spaces[child].params) == {"dim": 16}
        router = next(k for k, bs in spec.tensors.items() if any(b.space == s and b.axis == 0 for b in bs)
                      and k.endswith(("gate.weight", "router.weight")))
        assert any(b.space == "residual" and b.axis == 1 for b in spec.tensors[router])  # its columns read the stream
    if name.startswith("qwen2_moe"):  # the shared expert: a dense FFN
        assert any(s.endswith("shared_expert.ffn") for s in spec.spaces)
    if name == "qwen2_moe_dense_layer":
        assert "model.layers.1.mlp.ffn" in spec.spaces


@pytest.mark.parametrize("name", MOE_NAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_element_preserves_outputs(name, seed):
    model, spec, x = _spec(name)
    sd, before = model.state_dict(), digest(model)
    g = spec.random_element(seed=seed)
    moved = [s for s in spec.spaces if "expert" in s and not torch.equal(g[s], spec.identity()[s])]
    assert any(s.endswith(".experts") for s in moved) and all(s in moved for s in spec.spaces if "expert_ffn" in s)
    sd_g = spec.apply(sd, g)
    assert digest(model) == before, "apply mutated the model"
    assert max_diff(outputs(model, x), outputs(loaded(model, sd_g), x)) < 1e-4
    back = spec.apply(sd_g, spec.inverse(g))
    assert all(torch.equal(back[k], sd[k]) for k in sd)
    h = spec.random_element(seed=seed + 7)  # the semidirect product: (g∘h)·θ = g·(h·θ)
    composed = spec.apply(sd, spec.compose(g, h))
    assert all(torch.equal(composed[k], spec.apply(spec.apply(sd, h), g)[k]) for k in sd)
    for k, t in sd.items():
        assert torch.equal(spec.apply_tensor(k, t, g), SymmetrySpec.apply_tensor(spec, k, t, g))


@pytest.mark.parametrize("name", MOE_NAMES)
def test_weight_matching_recovers_a_planted_element(name):
    """The two-level solve: per expert pair the inner assignment of hidden units, then the outer one of experts."""
    model, spec, _ = _spec(name)
    sd = model.state_dict()
    g = spec.random_element(seed=7)
    res = mc.weight_matching(spec, sd, spec.apply(sd, g), restarts=2)
    assert spec.equal(res.element, spec.inverse(g))
    aligned = spec.apply(spec.apply(sd, g), res.element)
    assert all(torch.equal(aligned[k], sd[k]) for k in sd)


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "olmoe"])
def test_absorption_then_the_full_group_keeps_outputs(name):
    model = make(name)
    x = hf.example_inputs(model)
    absorbed = mc.absorb_normalization(model)
    assert max_diff(outputs(model, x), outputs(absorbed, x)) < 1e-4
    spec = hf.hf_symmetry_spec(absorbed, groups=FULL)
    assert spec.spaces["residual"].group == "orthogonal" and _experts(spec)
    g = spec.random_element(seed=2)
    assert max_diff(outputs(model, x), outputs(loaded(absorbed, spec.apply(absorbed.state_dict(), g)), x)) < 1e-4
    res = mc.weight_matching(spec, absorbed.state_dict(), spec.apply(absorbed.state_dict(), g), restarts=1)
    assert all(torch.equal(res.element[s], spec.inverse(g)[s]) for s in spec.spaces if "expert" in s)


# ----------------------------------------------------------------------------------------- negative controls
def _without(spec, drop):
    return dataclasses.replace(spec, tensors={k: tuple(b for b in bs if not drop(k, b)) for k, bs in spec.tensors.items()})


def _roll(spec, space):
    return spec.identity() | {space: torch.roll(torch.arange(spec.spaces[space].size), 1)}


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "granitemoe"])
def test_experts_must_move_with_their_router_rows(name):
    model, spec, x = _spec(name)
    experts = _experts(spec)[0]
    g = _roll(spec, experts)
    assert _changes(model, spec, g, x) < 1e-4
    router = [k for k, bs in spec.tensors.items() if any(b.space == experts for b in bs) and spec.shapes[k] == (4, 32)]
    assert len(router) == 1
    banks_only = _without(spec, lambda k, b: k in router and b.space == experts)  # experts moved, router rows not
    assert _changes(model, banks_only, g, x) > 1e-3
    child = experts.removesuffix(".experts") + ".expert_ffn"
    router_only = _without(spec, lambda k, b: k not in router and b.space in (experts, child))
    assert _changes(model, router_only, g, x) > 1e-3
    with pytest.raises(SpecError, match="needs its parent"):  # per-expert units whose experts do not move: refused
        _without(spec, lambda k, b: k not in router and b.space == experts)


@pytest.mark.parametrize("name", ["mixtral", "olmoe"])
def test_hidden_units_may_not_cross_experts(name):
    """One permutation of all E·I hidden units that sends a unit of expert 0 into expert 1 (a symmetry of a dense FFN
    of width E·I) changes the outputs; the same swap inside expert 0 does not."""
    model, spec, x = _spec(name)
    sd = model.state_dict()
    layer = _experts(spec)[0].removesuffix(".experts")
    gu, dn = f"{layer}.experts.gate_up_proj", f"{layer}.experts.down_proj"

    def swapped(a, b):  # hidden units a = (expert, unit) and b exchanged in gate, up and down alike
        out = dict(sd)
        g_u, d = sd[gu].clone(), sd[dn].clone()
        for off in (0, 16):
            g_u[a[0], off + a[1]], g_u[b[0], off + b[1]] = sd[gu][b[0], off + b[1]], sd[gu][a[0], off + a[1]]
        d[a[0], :, a[1]], d[b[0], :, b[1]] = sd[dn][b[0], :, b[1]], sd[dn][a[0], :, a[1]]
        return out | {gu: g_u, dn: d}

    assert max_diff(outputs(model, x), outputs(loaded(model, swapped((0, 3), (0, 5))), x)) < 1e-4
    assert max_diff(outputs(model, x), outputs(loaded(model, swapped((0, 3), (1, 3))), x)) > 1e-3


def test_hidden_units_move_in_gate_up_and_down_together():
    model, spec, x = _spec("qwen3_moe")
    child = next(s for s in spec.spaces if s.endswith(".expert_ffn"))
    g = spec.identity() | {child: torch.stack([torch.roll(torch.arange(16), i + 1) for i in range(4)])}
    assert _changes(model, spec, g, x) < 1e-4
    no_down = _without(spec, lambda k, b: b.space == child and b.side == "in")
    assert _changes(model, no_down, g, x) > 1e-3


def test_a_per_expert_binding_needs_its_parent_on_the_expert_axis():
    spaces = {"E": Space("E", 2), "H": Space("H", 2, "block_permutation", parent="E", params={"dim": 3})}
    ok = {"w": (AxisBinding(0, "E"), AxisBinding(1, "H", block=3, unit_axis=0))}
    SymmetrySpec(spaces=spaces, tensors=ok, shapes={"w": (2, 3, 4)})
    with pytest.raises(SpecError, match="parent 'E' bound to axis 0"):
        SymmetrySpec(spaces=spaces, tensors={"w": (AxisBinding(2, "E"), AxisBinding(1, "H", block=3, unit_axis=0))},
                     shapes={"w": (2, 3, 2)})
    with pytest.raises(SpecError, match="child space"):
        SymmetrySpec(spaces={"H": Space("H", 2, "block_permutation", params={"dim": 3})},
                     tensors={"w": (AxisBinding(1, "H", block=3, unit_axis=0),)}, shapes={"w": (2, 3, 4)})


def test_activation_matching_refuses_expert_spaces():
    """No module boundary shows an expert's hidden units: refused before any forward pass, naming the spaces."""
    model, spec, x = _spec("mixtral")
    with pytest.raises(SpecError, match="expert.*no activation probes"):
        mc.activation_matching(spec, model, make("mixtral", 1), [x["input_ids"]])


def test_block_permutation_group_laws():
    from modeconn.symmetry.groups import get_group

    grp = get_group("block_permutation", dim=5)
    gen = torch.Generator().manual_seed(0)
    g, h = grp.random(3, gen), grp.random(3, gen)
    t = torch.randn(15, 4)
    both = grp.act(grp.act(t, 0, h, "out", 5), 0, g, "out", 5)
    assert torch.equal(grp.act(t, 0, grp.compose(g, h), "out", 5), both)
    assert torch.equal(grp.act(grp.act(t, 0, g, "out", 5), 0, grp.inverse(g), "out", 5), t)
    assert torch.equal(grp.from_matrices(grp.matrices(g)), g)
    with pytest.raises(SpecError, match="not a permutation"):
        grp.check(torch.zeros(3, 5, dtype=torch.long), 3, "s")


# ----------------------------------------------------------------------------------------- checkpoints, CLI
def test_cli_align_and_merge_keep_the_stored_checkpoint_loadable(tmp_path):
    """transformers 5 stores Mixtral's experts per expert; modeconn reads them as banks and writes banks, which
    from_pretrained loads: the aligned B computes B, the merge generates."""
    dirs = []
    for seed in (0, 1):
        d = tmp_path / f"m{seed}"
        make("mixtral", seed).save_pretrained(d, max_shard_size="20KB")
        dirs.append(d)
    run_cli("align", *dirs, "--out", tmp_path / "aligned", "--restarts", "1", "--max-iter", "5")
    b = T.AutoModelForCausalLM.from_pretrained(dirs[1]).eval()
    aligned = T.AutoModelForCausalLM.from_pretrained(tmp_path / "aligned").eval()
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(aligned(input_ids=ids).logits, b(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    run_cli("merge", *dirs, "--out", tmp_path / "merged", "--align", "weight", "--restarts", "1", "--max-iter", "5")
    merged = T.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert merged.generate(ids, max_new_tokens=3, do_sample=False).shape == (2, 9)
    again = run_cli("align", dirs[0], tmp_path / "aligned", "--out", tmp_path / "again", "--restarts", "1")
    assert "objective" in again.output  # a checkpoint written with banks is read as stored


def test_cli_full_group_on_stored_moe_checkpoints(tmp_path):
    """`align --groups full` on Qwen2-MoE directories: absorbed tensor by tensor (banks read from the per-expert
    files), the full group matched streaming — the in-memory objective — and b/ computes B."""
    from modeconn.symmetry.absorb import load_absorbed
    from modeconn.symmetry.hf import FULL_GROUPS

    ma, mb = make("qwen2_moe", 0), make("qwen2_moe", 1)
    for m, d in ((ma, "a"), (mb, "b")):
        m.save_pretrained(tmp_path / d, max_shard_size="20KB")
    run_cli("align", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "out", "--groups", "full", "--restarts", "1",
            "--max-iter", "5")
    aa, ab = mc.absorb_normalization(ma), mc.absorb_normalization(mb)
    ref = mc.weight_matching(hf.hf_symmetry_spec(aa, FULL_GROUPS), aa.state_dict(), ab.state_dict(), restarts=1,
                             max_iter=5)
    import json

    assert json.loads((tmp_path / "out" / "alignment.json").read_text())["objective"] == pytest.approx(ref.objective,
                                                                                                      rel=1e-6)
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(load_absorbed(tmp_path / "out" / "b")(input_ids=ids).logits,
                                   mb(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
