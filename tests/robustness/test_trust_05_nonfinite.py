"""Issue #14, class 5 — NaN reported as a result.

An extrapolating merge (``--weights 2,-1 --no-normalize --bn interpolate``) gives BatchNorm a negative
``running_var``: the model outputs NaN, and an "accuracy" or a barrier computed from NaN logits is a wrong number
that looks like a result. Invalid BatchNorm statistics (negative/non-finite ``running_var``, non-finite
``running_mean``) are refused (``bn="reset"`` re-estimates them instead), and every loss/accuracy computed for a
report — evaluate_model, every point of evaluate_path, the merge recipe's and the comparison's evaluations, the
endpoints of a barrier, every figure of a Curve — raises NonFiniteError naming the λ (or model) and the split
when a logit or loss is NaN/Inf. The merge CLI then exits non-zero and writes nothing to --out.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from archs import make
from cli_runner import run_cli
from rb_helpers import batches
from torch import nn

import modeconn as mc
from modeconn.errors import NonFiniteError
from modeconn.recipes import merge_modeconn as merge_mod
from modeconn.io import save_checkpoint
from modeconn.models import build_model
from modeconn.path import Curve, evaluate_model
from modeconn.path import curve as curve_mod
from modeconn.path import evaluate as evaluate_mod


def refused(fn, *names: str) -> str:
    """The check of this class: ``fn()`` raises NonFiniteError whose message names every string in ``names``
    (λ, split, tensor); a returned value — a number computed from NaN — fails. Returns the message."""
    try:
        value = fn()
    except NonFiniteError as err:
        msg = str(err)
        missing = [n for n in names if n not in msg]
        assert not missing, f"NonFiniteError does not name {missing}: {msg}"
        return msg
    raise AssertionError(f"no error: a result was reported from non-finite values: {value!r}")


def _extrapolation_pair():
    """Two mlp-bn state dicts where ``2·var_A − var_B`` is negative in every channel of the first BN."""
    a, x = make("mlp-bn", seed=0)
    b, _ = make("mlp-bn", seed=1)
    sb = dict(b.state_dict())
    key = "blocks.0.norm.running_var"
    sb[key] = 3 * a.state_dict()[key]
    return a, a.state_dict(), sb, x, key


class ScaledNet(nn.Module):
    """``linear(x) / s``: with s = 1 at A and −1 at B the λ=½ point divides by zero (finite weights, Inf logits)."""

    def __init__(self, s: float):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.s = nn.Parameter(torch.tensor(s))

    def forward(self, x):
        return self.lin(x) / self.s


def _scaled_pair():
    torch.manual_seed(0)
    a, b = ScaledNet(1.0), ScaledNet(-1.0)
    b.lin.load_state_dict(a.lin.state_dict())
    return a, a.state_dict(), b.state_dict()


# ------------------------------------------------------------------------------------ invalid BN statistics
def test_extrapolated_bn_statistics_are_refused():
    a, sa, sb, x, key = _extrapolation_pair()
    loader = batches(x.shape[1:], n=2)
    refused(lambda: mc.merge([sa, sb], [2.0, -1.0], model=a, bn="interpolate", normalize=False), "merged model", key)
    invalid_a = dict(sa, **{key: 2 * sa[key] - sb[key]})  # bn="keep": the first model's (here invalid) statistics
    refused(lambda: mc.merge([invalid_a, sb], model=a, bn="keep"), "merged model", key)
    # the reset policy re-estimates the statistics: a valid, finite model
    merged = mc.merge([sa, sb], [2.0, -1.0], model=a, bn="reset", bn_loader=loader, normalize=False)
    assert (merged[key] >= 0).all()
    m = make("mlp-bn")[0]
    m.load_state_dict(merged)
    assert np.isfinite(evaluate_model(m, loader)["loss"])


@pytest.mark.parametrize("bad", ["negative var", "nan mean"])
def test_invalid_endpoint_statistics_are_refused_on_the_path(bad):
    a, sa, sb, x, key = _extrapolation_pair()
    sb = dict(sb)
    if bad == "negative var":
        sb[key] = sa[key] - sb[key]
        names = ("λ=1", key)
    else:
        sb["blocks.1.norm.running_mean"] = torch.full_like(sb["blocks.1.norm.running_mean"], float("nan"))
        names = ("blocks.1.norm.running_mean",)
    loader = batches(x.shape[1:], n=2)
    refused(lambda: mc.evaluate_path(a, sa, sb, loader, lambdas=3, bn="interpolate"), *names)


# ------------------------------------------------------------------------------------ non-finite evaluation
def test_non_finite_logits_name_lambda_and_split():
    a, sa, sb = _scaled_pair()
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g))]
    msg = refused(lambda: mc.evaluate_path(a, sa, sb, {"train": data, "test": data}, lambdas=5), "λ=0.5", "'train'")
    assert "logits" in msg


def test_non_finite_loss_is_refused():
    a, _ = make("mlp")
    x = torch.randn(6, 1, 6, 6)
    data = [(x, torch.zeros(6, dtype=torch.long))]
    def nan_loss(logits, y):
        return torch.tensor(float("nan"))
    refused(lambda: evaluate_model(a, data, nan_loss, where="θ(λ=0.25), split 'val'"), "λ=0.25", "'val'", "loss")


def test_curve_figures_refuse_non_finite_values():
    lam = np.linspace(0, 1, 5)
    loss = np.array([0.5, 0.9, np.nan, 0.8, 0.4])
    c = Curve(lam, {"test": {"loss": loss, "acc": np.array([0.9, 0.8, np.nan, 0.8, 0.9])}})
    for fn in (lambda: c.barrier("mean"), lambda: c.barrier("interp"), lambda: c.peak(), lambda: c.accuracy_drop(),
               c.summary, c.to_json):
        refused(fn, "λ=0.5", "'test'")


# ---------------------------------------------------------------------------------------------------- CLI
def _checkpoints(tmp_path):
    paths = []
    for seed in (0, 1):
        m = build_model("mlp", in_shape=(1, 4, 4), num_classes=3, depth=2, width=6, norm="batchnorm", seed=seed)
        with torch.no_grad():
            m.blocks[0].norm.running_var.fill_(1.0 if seed == 0 else 3.0)  # 2·1 − 3 < 0
        paths.append(save_checkpoint(tmp_path / f"m{seed}", m))
    return paths


def check_cli_refuses_nan_merge(tmp_path) -> None:
    """`modeconn merge A B --weights 2,-1 --no-normalize --bn interpolate` fails, names the tensor, writes nothing."""
    a, b = _checkpoints(tmp_path)
    out = tmp_path / "merged"
    res = run_cli("merge", a, b, "--out", out, "--weights", "2,-1", "--no-normalize", "--bn", "interpolate",
                  "--align", "none", ok=False)
    assert res.exit_code != 0, f"the NaN model was accepted:\n{res.output}"
    assert "running_var" in res.output, res.output
    assert not out.exists(), "--out was written although the merge is invalid"


def test_cli_merge_refuses_invalid_statistics_and_writes_nothing(tmp_path):
    check_cli_refuses_nan_merge(tmp_path)


def test_merge_recipe_evaluation_refuses_nan_logits(tmp_path, monkeypatch):
    """The recipe's test-split evaluation: NaN logits raise (naming the merged model and split) before saving."""
    a, b = _checkpoints(tmp_path)
    out = tmp_path / "merged"
    monkeypatch.setattr(merge_mod, "load_dataset", lambda *args, **kw: _nan_bundle())
    refused(lambda: merge_mod.run_merge([a, b], out, align_method="none", bn="interpolate", dataset="toy"),
            "merged model", "'test'")
    assert not out.exists()


def _nan_bundle():
    from torch.utils.data import TensorDataset

    from modeconn.data import DatasetBundle

    x = torch.full((4, 1, 4, 4), float("nan"))
    ds = TensorDataset(x, torch.zeros(4, dtype=torch.long))
    return DatasetBundle(name="toy", train=ds, val=ds, test=ds, num_classes=3, input_shape=(1, 4, 4),
                         classes=("a", "b", "c"), source="test")


# ---------------------------------------------------------------------------------------- negative controls
def test_negative_control_unguarded_evaluation_reports_nan(monkeypatch):
    """Without the output guard the path comes back with NaN and an ordinary-looking barrier: the check fails."""
    monkeypatch.setattr(evaluate_mod, "_check_finite_output", lambda *args: None)
    monkeypatch.setattr(curve_mod.Curve, "finite_values", curve_mod.Curve.values)
    a, sa, sb = _scaled_pair()
    data = [(torch.randn(8, 4), torch.randint(0, 3, (8,)))]
    with pytest.raises(AssertionError, match="no error"):
        refused(lambda: mc.evaluate_path(a, sa, sb, {"train": data}, lambdas=5).barrier("mean"), "λ=0.5")


def test_negative_control_unchecked_statistics_reach_the_output(monkeypatch, tmp_path):
    """Without the statistics check the merge returns a negative variance, whose model outputs NaN; the CLI then
    exits 0 and saves it — and both checks of this class fail."""
    for mod in (evaluate_mod, merge_mod):
        monkeypatch.setattr(mod, "check_bn_statistics", lambda *args: None)
    a, sa, sb, x, key = _extrapolation_pair()
    merged = {}
    with pytest.raises(AssertionError, match="no error"):
        refused(lambda: merged.update(mc.merge([sa, sb], [2.0, -1.0], model=a, bn="interpolate", normalize=False)))
    assert (merged[key] < 0).any()
    m = make("mlp-bn")[0]
    m.load_state_dict(merged)
    with torch.no_grad():
        assert torch.isnan(m(x)).any(), "the wrong number the guard prevents"
    with pytest.raises(AssertionError, match="accepted|written"):
        check_cli_refuses_nan_merge(tmp_path)
