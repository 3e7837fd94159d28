"""Symmetry-breaking model options (docs/methods.md §1, baselines) and the ``symmetry-breaking`` experiment.

Each option is tested for its defining property on *perturbed* weights (so a symmetry cannot hide behind stock
initial values): σ-asymmetric FiGLU (a fixed, seeded, non-trained gate; no permutation of hidden units keeps the
function, while it does for the standard net and for FiGLU with C = I, i.e. SiLU); syre (a fixed dense anchor θ₀
that weight decay pulls W_eff towards; the function keeps the symmetry of its effective weights, the regularised
objective does not); the W-asymmetric ``vit-tiny`` (every linear and the patch projection asymmetric; the Hugging
Face spec's random elements keep the standard ViT's function but not the asymmetric one's; checkpoints round-trip).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cli_runner import run_cli
from modeconn.errors import ConfigError
from modeconn.io import load_checkpoint, save_checkpoint
from modeconn.models import (
    AsymConv2d,
    AsymLinear,
    FiGLU,
    build_model,
    fixed_structure_keys,
    fixed_structure_mismatches,
    fold_fixed_structure,
)
from modeconn.models.asymmetric import generate_fixed_structure
from modeconn.symmetry import symmetry_spec

IMG = (1, 8, 8)
MLP = dict(in_shape=IMG, num_classes=5, depth=2, width=12, norm="layernorm")
VIT = dict(in_shape=(1, 8, 8), num_classes=4, patch_size=4, hidden_size=16, num_hidden_layers=1,
           num_attention_heads=2, intermediate_size=32)
X = torch.randn(6, *IMG, generator=torch.Generator().manual_seed(0))


def _perturbed(model: nn.Module, seed: int = 1) -> nn.Module:
    """A copy with every trainable parameter moved by N(0, 0.3²) (fixed buffers untouched)."""
    m = copy.deepcopy(model).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
        for mod in m.modules():
            if isinstance(mod, AsymLinear | AsymConv2d):
                mod.reset_fixed_entries()
    return m


def _moved_output_change(model: nn.Module, x: torch.Tensor = X, seed: int = 3) -> float:
    """max |y(g·θ) − y(θ)| for a random element g of the model's traced spec."""
    spec = symmetry_spec(model, x[:2])
    moved = copy.deepcopy(model)
    moved.load_state_dict(spec.apply(model.state_dict(), spec.random_element(seed=seed)))
    with torch.no_grad():
        return float((moved(x) - model(x)).abs().max())


# ------------------------------------------------------------------------------------- σ-asymmetric (FiGLU)
def test_figlu_gate_is_fixed_seeded_and_not_trained():
    a = build_model("mlp", seed=0, **MLP, sigma_asymmetric={"gate_seed": 7})
    b = build_model("mlp", seed=1, **MLP, sigma_asymmetric={"gate_seed": 7})
    c = build_model("mlp", seed=0, **MLP, sigma_asymmetric={"gate_seed": 8})
    gates = [k for k in fixed_structure_keys(a)]
    assert gates == ["blocks.0.act.fixed_gate", "blocks.1.act.fixed_gate"]
    assert all(not any(n.endswith("fixed_gate") for n, _ in m.named_parameters()) for m in (a, b))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in gates)  # the gate follows gate_seed, not the init seed
    assert not torch.equal(sa[gates[0]], sc[gates[0]]) and not torch.equal(sa[gates[0]], sa[gates[1]])
    assert fixed_structure_mismatches(a) == []
    before = copy.deepcopy(a.state_dict())
    opt = torch.optim.AdamW(a.parameters(), lr=0.1, weight_decay=0.1)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(a(X), torch.arange(6) % 5).backward()
        opt.step()
    after = a.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in gates)
    assert not torch.equal(before["blocks.0.linear.weight"], after["blocks.0.linear.weight"])
    with torch.no_grad():
        a.blocks[0].act.fixed_gate.add_(1.0)
    assert fixed_structure_mismatches(a) == ["blocks.0.act.fixed_gate"]


def test_figlu_is_x_times_sigmoid_of_cx_and_silu_at_identity():
    act = FiGLU(5, gate_scale=0.5, gate_seed=2, key="k")
    x = torch.randn(3, 4, 5)
    assert torch.allclose(act(x), x * torch.sigmoid(x @ act.fixed_gate.T))
    assert act.fixed_gate.std() == pytest.approx(0.5, rel=0.5)
    with torch.no_grad():
        act.fixed_gate.copy_(act.symmetric_fixed_structure()["fixed_gate"])
    assert torch.allclose(act(x), F.silu(x))


def test_permutations_keep_the_standard_function_but_not_the_figlu_one():
    std = _perturbed(build_model("mlp", seed=0, **MLP, activation="gelu"))
    fig = _perturbed(build_model("mlp", seed=0, **MLP, sigma_asymmetric={"gate_seed": 1}))
    assert _moved_output_change(std) < 1e-4
    assert _moved_output_change(fig) > 1e-2
    with torch.no_grad():  # the same weights with C = I (SiLU): the symmetry is back
        for m in fig.modules():
            if isinstance(m, FiGLU):
                m.fixed_gate.copy_(m.symmetric_fixed_structure()["fixed_gate"])
    assert _moved_output_change(fig) < 1e-4


def test_sigma_asymmetric_refuses_a_second_activation():
    with pytest.raises(ConfigError, match="FiGLU"):
        build_model("mlp", **MLP, activation="gelu", sigma_asymmetric={})
    with pytest.raises(ConfigError, match="sigma_asymmetric.*greater than 0"):
        build_model("mlp", **MLP, sigma_asymmetric={"gate_scale": 0.0})


# -------------------------------------------------------------------------------------------------- syre
SYRE = {"sigma_f": 0.2, "density": 0.0, "offsets": "dense", "mask_seed": 3}


def test_syre_anchor_is_dense_fixed_and_weight_decay_pulls_towards_it():
    m = build_model("mlp", seed=0, **MLP, asymmetric=SYRE)
    other = build_model("mlp", seed=5, **MLP, asymmetric=SYRE)
    lin = m.blocks[1].linear
    assert bool((lin.fixed_offsets != 0).all()) and bool((lin.fixed_mask == 1).all())
    assert torch.equal(lin.fixed_offsets, other.blocks[1].linear.fixed_offsets)  # the anchor follows mask_seed
    anchor = lin.fixed_offsets.clone()
    opt = torch.optim.AdamW(m.parameters(), lr=0.5, weight_decay=1.0)
    dist = []
    for _ in range(25):  # no data term: decoupled decay alone, W ← (1 − 0.5)·W per step
        opt.zero_grad()
        (0.0 * m(X).sum()).backward()
        opt.step()
        dist.append(float((lin.effective_weight().detach() - anchor).norm()))
    assert torch.equal(lin.fixed_offsets, anchor)
    assert all(b < a for a, b in zip(dist, dist[1:], strict=False))
    h = torch.randn(4, 12)
    with torch.no_grad():  # the layer's function has gone to the anchor's, not to 0
        assert torch.allclose(lin(h), F.linear(h, anchor), atol=1e-5)
        assert float(lin(h).abs().max()) > 0.1


def test_syre_objective_is_not_permutation_invariant_while_its_function_is():
    m = _perturbed(build_model("mlp", seed=0, **MLP, asymmetric=SYRE))
    folded = fold_fixed_structure(m)
    with torch.no_grad():
        assert torch.allclose(folded(X), m(X), atol=1e-6)
    assert _moved_output_change(folded) < 1e-4  # the function keeps the permutation symmetry of W_eff
    assert _moved_output_change(m) > 1e-3  # permuting W alone (θ₀ stays) moves it
    spec = symmetry_spec(folded, X[:2])
    sd = folded.state_dict()
    moved = spec.apply(sd, spec.random_element(seed=4))
    anchor = m.blocks[1].linear.fixed_offsets
    reg = lambda s: float((s["blocks.1.linear.weight"] - anchor).pow(2).sum())  # noqa: E731
    assert abs(reg(moved) - reg(sd)) > 1e-3 * reg(sd)  # the regulariser ‖W_eff − θ₀‖² sees the permutation


def test_dense_offsets_keep_the_reference_layout_bytes_and_configs():
    masked = generate_fixed_structure(6, 10, 3, 1.5, 42)
    assert all(torch.equal(a, b) for a, b in zip(masked, generate_fixed_structure(6, 10, 3, 1.5, 42, "masked"),
                                                  strict=True))
    dense_f, dense_d = generate_fixed_structure(6, 10, 3, 1.5, 42, "dense")
    assert torch.equal(dense_d, masked[1]) and torch.equal(dense_f[masked[1] == 0], masked[0][masked[1] == 0])
    ref = build_model("mlp", **MLP, asymmetric={"sigma_f": 1.0})
    assert "offsets" not in ref.modeconn_config["kwargs"]["asymmetric"]
    assert build_model("mlp", **MLP, asymmetric=SYRE).modeconn_config["kwargs"]["asymmetric"]["offsets"] == "dense"
    with pytest.raises(ConfigError, match="offsets"):
        build_model("mlp", **MLP, asymmetric={"offsets": "sparse"})


# ------------------------------------------------------------------------------------- W-asymmetric ViT
ASYM = {"sigma_f": 1.0, "density": 0.25, "mask_seed": 9}


def test_vit_asymmetric_option_replaces_every_linear_and_keeps_the_initialised_w():
    std = build_model("vit-tiny", seed=0, **VIT)
    asym = build_model("vit-tiny", seed=0, **VIT, asymmetric=ASYM)
    linears = [n for n, m in std.named_modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 7 and all(isinstance(asym.get_submodule(n), AsymLinear) for n in linears)
    proj = "model.vit.embeddings.patch_embeddings.projection"
    assert isinstance(asym.get_submodule(proj), AsymConv2d)
    s, a = std.state_dict(), asym.state_dict()
    for n in [*linears, proj]:
        d = a[f"{n}.fixed_mask"]
        assert torch.equal(a[f"{n}.weight"], s[f"{n}.weight"] * d)  # HF's W where trained, 0 where fixed
        assert asym.get_submodule(n).structure_key == n
    assert fixed_structure_mismatches(asym) == []
    hidden = build_model("vit-tiny", seed=0, **VIT, asymmetric={**ASYM, "layers": "hidden"})
    assert type(hidden.get_submodule(proj)) is nn.Conv2d and type(hidden.model.classifier) is nn.Linear
    assert isinstance(hidden.model.vit.layers[0].attention.q_proj, AsymLinear)


def test_vit_spec_elements_keep_the_standard_function_but_not_the_asymmetric_one():
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    std = _perturbed(build_model("vit-tiny", seed=0, **VIT))
    asym = _perturbed(build_model("vit-tiny", seed=0, **VIT, asymmetric=ASYM))
    assert _moved_output_change(std, x) < 1e-4
    assert _moved_output_change(asym, x) > 1e-2
    folded = fold_fixed_structure(asym)
    with torch.no_grad():
        assert torch.allclose(folded(x), asym(x), atol=1e-5)
    assert _moved_output_change(folded, x) < 1e-4


def test_vit_asymmetric_checkpoint_round_trip(tmp_path):
    asym = build_model("vit-tiny", seed=0, **VIT, asymmetric=ASYM).eval()
    save_checkpoint(tmp_path / "ck", asym)
    loaded, cfg = load_checkpoint(tmp_path / "ck")
    assert "fixed_structure_digest" in cfg
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(x), asym(x))


# ------------------------------------------------------------------------------------------ the experiment
@pytest.mark.experiment
def test_symmetry_breaking_quick_through_the_cli(tmp_path):
    out = tmp_path / "sb"
    run_cli("experiment", "symmetry-breaking", "--quick", "--out", out)
    assert {"report.md", "results.json", "summary.png"} <= {p.name for p in out.iterdir()}
    res = json.loads((out / "results.json").read_text())
    rows = {s["label"]: s["summary"] for s in res["methods"]}
    assert list(rows) == ["standard", "W-asymmetric", "sparse-mask", "σ-asymmetric (FiGLU)", "syre (θ₀ σ 0.01)",
                          "syre (θ₀ σ 0.05)", "anchor only (θ₀ σ 0.05, no decay)"]
    assert all(r["unaligned_barrier_mean"]["n"] == 2 for r in rows.values())
    # the qualitative claims: large F gives unaligned LMC, the mask alone does not; alignment helps a standard net
    assert rows["W-asymmetric"]["unaligned_barrier_mean"]["mean"] < 0.5 * rows["standard"]["unaligned_barrier_mean"]["mean"]
    assert rows["sparse-mask"]["unaligned_barrier_mean"]["mean"] > 2 * rows["W-asymmetric"]["unaligned_barrier_mean"]["mean"]
    assert rows["standard"]["aligned_barrier_mean"]["mean"] < rows["standard"]["unaligned_barrier_mean"]["mean"]
    assert rows["σ-asymmetric (FiGLU)"]["aligned_barrier_mean"]["n"] == 0 and rows["syre (θ₀ σ 0.01)"]["aligned_barrier_mean"]["n"] == 2
    assert [s["label"] for s in res["vit"]] == ["standard", "W-asymmetric"]
    assert [s["paper_unaligned_acc_drop_pct"] for s in res["k"]["settings"]] == [46.4, 6.1]
    assert "paper" in (out / "report.md").read_text()
