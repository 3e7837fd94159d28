"""Issue #14, class 6 — merge weights that silently rescale a model.

``--weights 0.7,0.7`` used to be accepted and scale the model by 1.4, and ``weighted_average`` left tensors that
are identical in every input unweighted (weights 0.3/0.3 kept them at 1× while the rest became 0.6×). One
validation, :func:`modeconn.path.interpolate.merge_weights`, now serves every entry point — weighted_average,
``modeconn.merge``, the streaming merge (``stream_merge`` / ``merge_hf_checkpoints``), the merge recipe and the
CLI's ``--weights``: one finite number per model (errors name the entry); by default non-negative and normalised
to sum 1 (the CLI prints a note); ``normalize=False`` / ``--no-normalize`` takes any finite weights as given. Every
floating tensor follows the same rule ``Σ_i w_i θ_i`` (integer buffers are the first model's, never averaged).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from archs import make
from cli_runner import run_cli
from hf_tiny import make as make_hf
from safetensors.torch import load_file

import modeconn as mc
from modeconn.errors import ConfigError
from modeconn.recipes.merge_modeconn import run_merge
from modeconn.io import load_checkpoint, save_checkpoint
from modeconn.models import build_model
from modeconn.path import evaluate as evaluate_mod
from modeconn.path.interpolate import merge_weights, weighted_average
from modeconn.recipes.hf_stream import merge_hf_checkpoints
from modeconn.stream import hf_checkpoint_spec, stream_merge

interp_mod = importlib.import_module("modeconn.path.interpolate")

SHARED = "blocks.0.linear.bias"  # made identical in both models


def _pair():
    a, _ = make("mlp-bn", seed=0)
    b, _ = make("mlp-bn", seed=1)
    sa, sb = a.state_dict(), dict(b.state_dict())
    sb[SHARED] = sa[SHARED].clone()
    sb["blocks.0.norm.num_batches_tracked"] = torch.tensor(41)
    return a, sa, sb


def check_same_rule(out, sds, weights) -> None:
    """The check of this class: every floating tensor of ``out`` is ``Σ w_i θ_i`` (the identical ones included),
    every integer buffer the first model's."""
    for k, t in out.items():
        if not t.is_floating_point():
            assert torch.equal(t, sds[0][k]), f"integer buffer {k} was averaged"
            continue
        expected = sum(w * sd[k].double() for w, sd in zip(weights, sds, strict=False))
        err = float((t.double() - expected).abs().max()) if t.numel() else 0.0
        assert err <= 1e-6 * (1 + float(expected.abs().max())), f"{k} is not Σ w_i θ_i (max error {err:.3g})"


# weights as given → (normalize, effective weights)
RULES = {
    "0.7,0.7 normalised": ([0.7, 0.7], True, [0.5, 0.5]),
    "1,3 normalised": ([1.0, 3.0], True, [0.25, 0.75]),
    "0.3,0.3 as given": ([0.3, 0.3], False, [0.3, 0.3]),
    "2,-1 as given": ([2.0, -1.0], False, [2.0, -1.0]),
}
IN_MEMORY = {
    "weighted_average": lambda sds, w, norm: weighted_average(sds, w, normalize=norm),
    "merge": lambda sds, w, norm: mc.merge(sds, w, normalize=norm),
}


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("entry", list(IN_MEMORY))
def test_every_tensor_follows_one_rule(entry, rule):
    _, sa, sb = _pair()
    weights, normalize, effective = RULES[rule]
    check_same_rule(IN_MEMORY[entry]([sa, sb], weights, normalize), [sa, sb], effective)


def test_equal_weights_average_instead_of_scaling():
    a, _ = make("mlp", seed=0)
    b, _ = make("mlp", seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    scaled, uniform = mc.merge([sa, sb], [0.7, 0.7], model=a, bn="interpolate"), mc.merge([sa, sb])
    assert all(torch.equal(scaled[k], uniform[k]) for k in uniform)
    assert merge_weights([0.7, 0.7], 2) == [0.5, 0.5] and merge_weights(None, 4) == [0.25] * 4


def check_rejected(fn, *names: str) -> None:
    """``fn()`` raises ConfigError naming every string of ``names``; anything accepted fails."""
    try:
        fn()
    except ConfigError as err:
        missing = [n for n in names if n not in str(err)]
        assert not missing, f"the error does not name {missing}: {err}"
        return
    raise AssertionError("bad merge weights were accepted")


BAD = {
    "count": ([0.5], True, ["1 entries for 2 models"]),
    "nan": ([0.5, float("nan")], True, ["[1]", "nan", "finite"]),
    "inf as given": ([float("inf"), 0.5], False, ["[0]", "inf"]),
    "text": (["abc", 0.5], True, ["[0]", "'abc'"]),
    "negative": ([2.0, -1.0], True, ["[1]", "-1.0", "normalize=False"]),
    "zero sum": ([0.0, 0.0], True, ["sum to 0"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_weights_name_the_entry_in_memory(case):
    weights, normalize, names = BAD[case]
    a, sa, sb = _pair()
    for fn in (lambda: merge_weights(weights, 2, normalize=normalize),
               lambda: weighted_average([sa, sb], weights, normalize=normalize),
               lambda: mc.merge([sa, sb], weights, normalize=normalize),
               lambda: mc.merge([sa, sb], weights, model=a, bn="interpolate", normalize=normalize)):
        check_rejected(fn, *names)


# ---------------------------------------------------------------------------------------- streaming merge
@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    a, b = make_hf("gpt2", 0), make_hf("gpt2", 1)
    with torch.no_grad():
        b.transformer.ln_f.weight.copy_(a.transformer.ln_f.weight)  # a tensor identical in both checkpoints
    for m, d in ((a, root / "a"), (b, root / "b")):
        m.save_pretrained(d)
    return root / "a", root / "b"


def _tensors(d):
    return load_file(str(d / "model.safetensors"))


@pytest.mark.parametrize("rule", ["0.7,0.7 normalised", "0.3,0.3 as given", "2,-1 as given"])
def test_streaming_merge_follows_the_same_rule(hf_pair, tmp_path, rule):
    da, db = hf_pair
    weights, normalize, effective = RULES[rule]
    ta, tb = _tensors(da), _tensors(db)
    assert torch.equal(ta["transformer.ln_f.weight"], tb["transformer.ln_f.weight"]), "test setup"
    out = stream_merge(hf_checkpoint_spec(da), [da, db], tmp_path / "o", weights=weights, normalize=normalize)
    check_same_rule(_tensors(out), [ta, tb], effective)
    rec = merge_hf_checkpoints([da, db], tmp_path / "r", weights=weights, normalize=normalize, align="none")
    assert rec["weights"] == pytest.approx(effective)
    check_same_rule(_tensors(tmp_path / "r"), [ta, tb], effective)


@pytest.mark.parametrize("case", ["count", "nan", "negative"])
def test_streaming_merge_rejects_bad_weights_before_writing(hf_pair, tmp_path, case):
    da, db = hf_pair
    weights, normalize, names = BAD[case]
    check_rejected(lambda: stream_merge(hf_checkpoint_spec(da), [da, db], tmp_path / "o", weights=weights,
                                        normalize=normalize), *names)
    check_rejected(lambda: merge_hf_checkpoints([da, db], tmp_path / "o", weights=weights, normalize=normalize),
                   *names)
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------ recipe and CLI
def _checkpoints(tmp_path):
    models = [build_model("mlp", in_shape=(1, 4, 4), num_classes=3, depth=2, width=6, seed=s) for s in (0, 1)]
    return models, [save_checkpoint(tmp_path / f"m{i}", m) for i, m in enumerate(models)]


def test_recipe_validates_weights_before_reading_checkpoints(tmp_path):
    missing = [tmp_path / "nope-a", tmp_path / "nope-b"]
    check_rejected(lambda: run_merge(missing, tmp_path / "o", weights=[0.5, float("nan")]), "--weights[1]")
    check_rejected(lambda: run_merge(missing, tmp_path / "o", weights=[1.0, 1.0, 1.0]), "3 entries for 2 models")


@pytest.mark.parametrize("args, effective", [(["--weights", "0.7,0.7"], [0.5, 0.5]),
                                             (["--weights", "2,-1", "--no-normalize"], [2.0, -1.0]),
                                             (["--weights", "0.3,0.3", "--no-normalize"], [0.3, 0.3])],
                         ids=["normalised", "extrapolation", "sum"])
def test_cli_merge_weights(tmp_path, args, effective):
    models, paths = _checkpoints(tmp_path)
    res = run_cli("merge", *paths, "--out", tmp_path / "o", "--align", "none", "--bn", "interpolate", *args)
    assert ("normalised to sum 1" in res.output) == ("--no-normalize" not in args), res.output
    merged = load_checkpoint(tmp_path / "o")[0]
    check_same_rule(merged.state_dict(), [m.state_dict() for m in models], effective)


@pytest.mark.parametrize("weights, names", [("2,-1", ["--weights[1]", "--no-normalize"]), ("0.5,abc", ["--weights[1]", "abc"]),
                                            ("1,1,1", ["3 entries for 2 models"]), ("0.5,inf", ["--weights[1]", "finite"])])
def test_cli_rejects_bad_weights_and_writes_nothing(tmp_path, weights, names):
    _, paths = _checkpoints(tmp_path)
    res = run_cli("merge", *paths, "--out", tmp_path / "o", "--align", "none", "--weights", weights, ok=False)
    assert res.exit_code == 2, res.output
    output = " ".join(res.output.split())  # rich wraps long lines
    assert all(n in output for n in names), res.output
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------- negative controls
def test_negative_control_identical_tensor_shortcut_is_caught(monkeypatch):
    monkeypatch.setattr(interp_mod, "weights_sum_to_one", lambda w: True)  # broken: identical tensors kept at 1×
    _, sa, sb = _pair()
    with pytest.raises(AssertionError, match=SHARED):
        check_same_rule(weighted_average([sa, sb], [0.3, 0.3], normalize=False), [sa, sb], [0.3, 0.3])


def test_negative_control_unnormalised_weights_are_caught(monkeypatch):
    monkeypatch.setattr(evaluate_mod, "merge_weights", lambda w, n, **kw: [float(x) for x in w])  # broken: as given
    _, sa, sb = _pair()
    with pytest.raises(AssertionError):
        check_same_rule(mc.merge([sa, sb], [0.7, 0.7]), [sa, sb], [0.5, 0.5])


def test_negative_control_unvalidated_weights_are_caught(monkeypatch):
    monkeypatch.setattr(interp_mod, "_weight", lambda w, i, option, normalize: float(w))  # broken: no checks
    with pytest.raises(AssertionError, match="accepted"):
        check_rejected(lambda: merge_weights([0.5, float("nan")], 2), "[1]")
