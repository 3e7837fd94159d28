"""Issue #14, class 11 — BatchNorm statistics and the BN set's last batch; the merge's BN batches vs the path's.

A BN set of size ≡ 1 mod the batch size ends in a batch of one sample: train-mode BatchNorm1d cannot normalise it
(torch: "Expected more than 1 value per channel"), and a per-batch cumulative average weighs a short last batch
as much as a full one. Re-estimated statistics are defined per sample instead: for every BN layer and channel,
the mean and the unbiased variance of *all* values it received in the one train-mode pass (a batch of one is
joined to the batch before it) — pinned here to a hand-computed average over the whole set, for the ``reset``
policy, for REPAIR's channel statistics, and through every entry point (reset_bn_stats, evaluate_path, merge).

And the midpoint merge of a barrier comparison is the path's point at λ=½: both must re-estimate BatchNorm on the
*same* seeded batches, so the merged model's loss is the curve's loss at λ=½ (it used to exceed the path's peak).
"""

from __future__ import annotations

import copy
import itertools
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from archs import make
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import modeconn as mc
from modeconn.data import DatasetBundle
from modeconn.errors import ConfigError
from modeconn.diagnostics import compare as compare_mod
from modeconn.path import batchnorm as bn_mod
from modeconn.path import channel_stats, evaluate_model, reset_bn_stats


def _two_bn_mlp(seed: int = 0) -> nn.Sequential:
    """Linear → BN1d → ReLU → Linear → BN1d → Linear, with stale statistics a reset must forget."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    with torch.no_grad():
        for i in (1, 4):
            net[i].running_mean.fill_(5.0)
            net[i].running_var.fill_(9.0)
    return net.eval()


def _bn_set(n: int = 11, batch_size: int = 5, seed: int = 1) -> DataLoader:
    """A loader over ``n`` samples: with ``n ≡ 1 (mod batch_size)`` its last batch holds a single sample."""
    g = torch.Generator().manual_seed(seed)
    x = 2 + 3 * torch.randn(n, 6, generator=g)
    return DataLoader(TensorDataset(x, torch.randint(0, 2, (n,), generator=g)), batch_size=batch_size)


def _hand_per_sample(net: nn.Sequential, xs: list[torch.Tensor]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per BN layer: (mean, unbiased var) over every value it receives, BN normalising each batch by its own
    statistics (train mode) — the batches as run, i.e. a batch of one joined to the batch before it."""
    run = list(xs) if len(xs[-1]) > 1 else [*xs[:-2], torch.cat(xs[-2:])]
    seen: dict[int, list[torch.Tensor]] = {1: [], 4: []}
    with torch.no_grad():
        for x in run:
            h = x
            for i, layer in enumerate(net):
                if i in seen:
                    seen[i].append(h)
                    h = F.batch_norm(h, None, None, layer.weight, layer.bias, training=True, eps=layer.eps)
                else:
                    h = layer(h)
    return {i: (torch.cat(v).mean(0), torch.cat(v).var(0, unbiased=True)) for i, v in seen.items()}


def check_per_sample_statistics(net: nn.Sequential, loader) -> None:
    """The check of this class: re-estimation over ``loader`` neither crashes nor weighs batches equally — its
    statistics are the hand-computed per-sample mean / unbiased variance over the whole set."""
    xs = [x for x, _ in loader]
    expected = _hand_per_sample(net, xs)
    try:
        reset_bn_stats(net, loader_inputs(loader))
    except Exception as err:  # torch's raw "Expected more than 1 value per channel" included
        raise AssertionError(f"re-estimation crashed: {type(err).__name__}: {err}") from err
    for i, (mean, var) in expected.items():
        torch.testing.assert_close(net[i].running_mean, mean, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(net[i].running_var, var, atol=1e-5, rtol=1e-5)


def loader_inputs(loader) -> list[torch.Tensor]:
    return [x for x, _ in loader]


@pytest.mark.parametrize("n, batch_size", [(11, 5), (21, 4), (16, 6)], ids=["last-one", "last-one-of-4", "short-last"])
def test_reset_is_the_per_sample_average_over_the_whole_set(n, batch_size):
    loader = _bn_set(n, batch_size)
    assert len(list(loader)[-1][0]) == (1 if n % batch_size == 1 else n % batch_size), "test setup"
    check_per_sample_statistics(_two_bn_mlp(), loader)


def test_first_layer_statistics_do_not_depend_on_batching():
    """The first BN's input does not depend on batching: its statistics are those of the whole set at once."""
    net = _two_bn_mlp()
    x = torch.cat(loader_inputs(_bn_set(11, 5)))
    reset_bn_stats(net, [x[:5], x[5:10], x[10:]])
    pre = net[0](x).detach()
    torch.testing.assert_close(net[1].running_mean, pre.mean(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(net[1].running_var, pre.var(0, unbiased=True), atol=1e-5, rtol=1e-5)


def test_repair_channel_statistics_are_per_sample():
    a, x = make("mlp-bn", seed=0)
    spec = mc.symmetry_spec(a, x)
    points = list(spec.repair_points)
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(n, *x.shape[1:], generator=g) for n in (9, 9, 1)]
    outs: dict[str, list[torch.Tensor]] = {}
    modules = dict(a.named_modules())
    hooks = [modules[n].register_forward_hook(lambda m, i, o, _n=n: outs.setdefault(_n, []).append(o)) for n, _ in points]
    with torch.no_grad():
        for b in xs:
            a(b)
    for h in hooks:
        h.remove()
    stats = channel_stats(a, points, xs)
    for name, dim in points:
        z = torch.cat(outs[name]).movedim(dim, 1)
        flat = z.transpose(0, 1).reshape(z.shape[1], -1)
        torch.testing.assert_close(stats[name][0], flat.mean(1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(stats[name][1], flat.var(1, unbiased=True).sqrt(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bn", ["reset", "repair"])
def test_every_entry_point_handles_a_last_batch_of_one(bn):
    """evaluate_path and merge with a BN loader of 11 samples in batches of 5 (BatchNorm1d layers): no crash,
    and the same result as the set with the lone sample joined to the batch before it."""
    a, x = make("mlp-bn", seed=0)
    b, _ = make("mlp-bn", seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(11, *x.shape[1:], generator=g)
    ragged = [xs[:5], xs[5:10], xs[10:]]
    joined = [xs[:5], xs[5:]]
    evals = [(xs, torch.randint(0, 5, (11,), generator=g))]
    merged = mc.merge([sa, sb], model=a, bn=bn, bn_loader=ragged)
    ref = mc.merge([sa, sb], model=a, bn=bn, bn_loader=joined)
    for k in ref:
        torch.testing.assert_close(merged[k], ref[k], atol=1e-6, rtol=1e-6, msg=k)  # moments pooled in another order
    curve = mc.evaluate_path(a, sa, sb, evals, lambdas=3, bn=bn, bn_loader=ragged)
    ref_curve = mc.evaluate_path(a, sa, sb, evals, lambdas=3, bn=bn, bn_loader=joined)
    assert curve.values().tolist() == pytest.approx(ref_curve.values().tolist(), rel=1e-6)


def test_a_bn_set_of_one_sample_is_a_clear_error():
    net = _two_bn_mlp()
    with pytest.raises(ConfigError, match=r"BatchNorm '1'.*one value per channel"):
        reset_bn_stats(net, [torch.randn(1, 6)])


@contextmanager
def _no_pooling(layers):  # broken variant: stock per-batch cumulative average (every batch weighs the same)
    yield


def test_negative_control_equal_batch_weights_are_caught(monkeypatch):
    monkeypatch.setattr(bn_mod, "pooled_statistics", _no_pooling)
    with pytest.raises(AssertionError):
        check_per_sample_statistics(_two_bn_mlp(), _bn_set(16, 6))  # batches 6, 6, 4: no batch of one


def test_negative_control_raw_batch_of_one_is_caught(monkeypatch):
    monkeypatch.setattr(bn_mod, "bn_batches", list)  # broken variant: the lone sample runs as its own batch
    with pytest.raises(AssertionError, match="crashed"):
        check_per_sample_statistics(_two_bn_mlp(), _bn_set(11, 5))


# ------------------------------------------------------------------- the merge at λ=½ is the path's midpoint
def _bundle(n_train: int = 200, n_test: int = 40) -> DatasetBundle:
    g = torch.Generator().manual_seed(5)

    def split(n):
        return TensorDataset(torch.randn(n, 1, 6, 6, generator=g), torch.randint(0, 5, (n,), generator=g))

    return DatasetBundle(name="toy", train=split(n_train), val=split(0), test=split(n_test), num_classes=5,
                         input_shape=(1, 6, 6), classes=tuple("abcde"), source="test")


def check_merge_is_the_midpoint(bn: str) -> None:
    """The comparison's midpoint merge has the curve's loss and accuracy at λ=½ on every split."""
    a, _ = make("mlp-bn", seed=0)
    b, _ = make("mlp-bn", seed=1)
    res = compare_mod.compare_alignments(a, a.state_dict(), b.state_dict(), _bundle(), ["naive"], lambdas=5, bn=bn,
                                         batch_size=8, seed=3)
    curve, merged = res.curves["naive"], res.merged["naive"]
    assert curve.lambdas[2] == 0.5
    for split in ("train", "test"):
        for metric in ("loss", "acc"):
            path_value = float(curve.values(split, metric)[2])
            assert merged[split][metric] == pytest.approx(path_value, rel=1e-6, abs=1e-7), (split, metric)
        assert merged[split]["loss"] <= curve.peak(split) + 1e-7


@pytest.mark.parametrize("bn", ["reset", "repair"])
def test_midpoint_merge_uses_the_paths_bn_batches(bn):
    check_merge_is_the_midpoint(bn)


class _FirstBatchesOfAFreshEpoch:
    """Broken variant of drawing the BN batches once: each use iterates the shuffled loader anew (the old code)."""

    def __init__(self, loader, n):
        self.loader, self.n = loader, n

    def __iter__(self):
        return itertools.islice(iter(self.loader), self.n)


def test_negative_control_batches_drawn_twice_are_caught(monkeypatch):
    monkeypatch.setattr(compare_mod, "fixed_batches", _FirstBatchesOfAFreshEpoch)
    with pytest.raises(AssertionError):
        check_merge_is_the_midpoint("reset")


def test_reset_statistics_evaluate_like_a_single_big_batch():
    """End to end: a model reset on a ragged BN set predicts (eval mode) like one whose first BN was given the
    whole set's statistics — the per-sample semantics seen through evaluate_model."""
    net = _two_bn_mlp()
    loader = _bn_set(11, 5)
    x = torch.cat(loader_inputs(loader))
    reset_bn_stats(net, loader_inputs(loader))
    ref = copy.deepcopy(net)
    pre = ref[0](x).detach()
    with torch.no_grad():
        ref[1].running_mean.copy_(pre.mean(0))
        ref[1].running_var.copy_(pre.var(0, unbiased=True))
    data = [(x, torch.zeros(len(x), dtype=torch.long))]
    assert evaluate_model(net, data)["loss"] == pytest.approx(evaluate_model(ref, data)["loss"], rel=1e-5)
