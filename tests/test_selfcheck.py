"""symmetry_spec checks what it traced on a perturbed copy (torchvision ConvNeXt's LayerNorm2d pattern), and names the
module of an unsupported operation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import modeconn as mc
from modeconn.errors import SpecError, UnsupportedOperationError
from modeconn.models import build_model
from modeconn.symmetry import trace as trace_mod
from modeconn.symmetry import selfcheck
from modeconn.symmetry.selfcheck import check_function_preserved, perturbed_state

pytestmark = pytest.mark.usefixtures("one_thread")


class LayerNorm2d(nn.LayerNorm):
    """torchvision ConvNeXt's norm: an ``nn.LayerNorm`` subclass that normalises channels-last inside forward."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.n, self.c2 = nn.Conv2d(3, 8, 3, padding=1), LayerNorm2d(8), nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.c2(torch.relu(self.n(self.c1(x)))).mean((2, 3)))


def test_channels_last_norm_subclass_is_traced_into_and_bound():
    """torchvision ConvNeXt's LayerNorm2d: traced through its own forward (permute, F.layer_norm, permute)."""
    model, x = Net(), torch.randn(2, 3, 8, 8)
    spec = mc.symmetry_spec(model, x)
    assert [b.space for b in spec.tensors["n.weight"]] == ["P_c1"] and [b.space for b in spec.tensors["n.bias"]] == ["P_c1"]
    assert check_function_preserved(spec, model, (x,), seed=5) <= 1e-4


def _old_leaf_rule(m):  # the broken variant: any subclass of a rule layer is a leaf with its base's rule
    return isinstance(m, trace_mod._RULE_MODULES)


def test_a_wrong_traced_spec_is_refused_naming_the_unbound_tensors(monkeypatch):
    monkeypatch.setattr(trace_mod, "_rule_leaf", _old_leaf_rule)
    model, x = Net(), torch.randn(2, 3, 8, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(SpecError, match=r"changes its function.*\['P_c1'\].*'n\.weight', 'n\.bias'"):
        mc.symmetry_spec(model, x)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the input is never modified
    wrong = mc.symmetry_spec(model, x, check=False)  # the silent wrong answer the check prevents:
    wrong.validate(model)  # it validates,
    g = wrong.random_element(seed=1)
    sd = model.state_dict()
    stock = Net()  # keeps the outputs at stock init (γ = 1, β = 0) ...
    stock.load_state_dict(wrong.apply(sd, g))
    with torch.no_grad():
        assert torch.allclose(model.eval()(x), stock.eval()(x), atol=1e-5)
    perturbed = perturbed_state(model, torch.Generator().manual_seed(0))  # ... but not once the norm is perturbed
    moved = wrong.apply(perturbed, g)
    assert (selfcheck._forward(model, (x,), perturbed)[0] - selfcheck._forward(model, (x,), moved)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["mlp", "resnet20", "mobilenetv2", "cct"])
def test_correct_specs_pass_the_check(arch):
    shape = (1, 28, 28) if arch == "mlp" else (3, 32, 32)
    model = build_model(arch, in_shape=shape, num_classes=10, seed=0)
    spec = mc.symmetry_spec(model, torch.randn(2, *shape))
    assert check_function_preserved(spec, model, (torch.randn(2, *shape),), seed=3) <= 1e-4


def test_w_asymmetric_layers_are_checked_at_their_symmetric_structure():
    """W-asymmetry breaks the symmetry by design: the spec is checked with F = 0, D = 1, and at the trained fixed
    structure a permutation does change the function (as it should)."""
    model = build_model("mlp", in_shape=(1, 8, 8), num_classes=10, width=16, depth=2, seed=0,
                        asymmetric={"sigma_f": 1.0, "num_fixed": 4, "mask_seed": 0})
    x = torch.randn(4, 1, 8, 8)
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    moved = build_model("mlp", in_shape=(1, 8, 8), num_classes=10, width=16, depth=2, seed=0,
                        asymmetric={"sigma_f": 1.0, "num_fixed": 4, "mask_seed": 0})
    moved.load_state_dict(spec.apply(sd, spec.random_element(seed=0)))
    with torch.no_grad():
        assert (model.eval()(x) - moved.eval()(x)).abs().max() > 1e-3


class Sorter(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=1).values


class WithSort(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.block, self.head = nn.Linear(4, 6), Sorter(), nn.Linear(6, 2)

    def forward(self, x):
        return self.head(self.block(self.fc(x)))


def test_unsupported_operation_names_its_module():
    with pytest.raises(UnsupportedOperationError, match=r"sort.* in module 'block' \(Sorter\)"):
        mc.symmetry_spec(WithSort(), torch.randn(2, 4))


def test_fp32_rounding_of_large_activations_is_not_reported_as_a_wrong_binding():
    """A LayerNorm over activations near 3e5: a permutation reorders its fp32 mean's sum and moves the outputs by a
    few percent although the spec is exact; the check re-runs in fp64 before it reports."""

    class Big(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.norm, self.b = nn.Linear(4, 64), nn.LayerNorm(64), nn.Linear(64, 2)
            with torch.no_grad():
                self.a.bias.fill_(3e5)
                self.a.weight.mul_(1e-2)

        def forward(self, x):
            return self.b(self.norm(self.a(x)))

    torch.manual_seed(0)
    model, x = Big().eval(), torch.randn(8, 4)
    spec = mc.symmetry_spec(model, x)  # no SpecError
    g = spec.random_element(seed=0)
    state = selfcheck.perturbed_state(model, torch.Generator().manual_seed(0), torch.float32)
    assert selfcheck._change(spec, model, state, selfcheck._forward(model, (x,), state), (x,), g) > selfcheck.RTOL  # fp32 fails
    assert selfcheck.check_function_preserved(spec, model, (x,)) <= 1e-8


def test_the_check_runs_on_thefirst_examples_of_one_batch_only():
    from modeconn.symmetry.selfcheck import EXAMPLES, first_examples

    x, m = torch.randn(8, 3), torch.ones(8, 5)
    assert [t.shape[0] for t in first_examples((x, m), EXAMPLES)] == [EXAMPLES, EXAMPLES]
    assert torch.equal(first_examples((x,), EXAMPLES)[0], x[:EXAMPLES])
    for kept in ((x, torch.ones(7, 5)), (x, 3), (torch.randn(EXAMPLES, 3),), (torch.tensor(1.0),), ()):
        assert first_examples(kept, EXAMPLES) is kept  # not one batch of tensors (or no larger): unchanged


def test_the_perturbed_state_shares_no_storage_with_the_model():
    """The check overwrites its perturbed state in place (the transform), so no tensor of it may be the model's own —
    integer buffers and buffers outside the state dict included — and tied tensors stay one tensor."""

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.bn, self.head = nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 4)
            self.head.weight = nn.Parameter(torch.randn(4, 6))
            self.register_buffer("scale", torch.ones(6), persistent=False)

        def forward(self, x):
            return self.head(self.bn(self.emb(x)) * self.scale)

    model = Tied()
    model.out = model.head  # the head's tensors under a second name as well
    state = perturbed_state(model, torch.Generator().manual_seed(0))
    own = {t.data_ptr() for t in [*model.parameters(), *model.buffers()]}
    assert {"bn.num_batches_tracked", "scale", "head.weight", "out.weight"} <= set(state)
    assert not own & {t.data_ptr() for t in state.values()}
    assert state["head.weight"] is state["out.weight"]
