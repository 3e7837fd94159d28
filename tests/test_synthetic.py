"""Tests of modeconn.data.synthetic.subspace_mixture (Gaussian mixture on a k-dim subspace of R^d)."""

from __future__ import annotations

import itertools

import pytest
import torch
from sklearn.linear_model import LogisticRegression

from modeconn.data import DatasetBundle, subspace_mixture
from modeconn.errors import ConfigError
from modeconn.identifiability import subspace_coherence
from modeconn.models import build_model


def _bytes(bundle: DatasetBundle, U: torch.Tensor) -> bytes:
    parts = [U.numpy().tobytes()]
    for split in (bundle.train, bundle.val, bundle.test):
        parts += [t.numpy().tobytes() for t in split.tensors]
    return b"".join(parts)


def test_shapes_and_bundle_fields():
    bundle, U = subspace_mixture(50, 21, d=12, k=3, num_classes=4, seed=1)
    x, y = bundle.train.tensors
    xt, yt = bundle.test.tensors
    assert x.shape == (50, 1, 1, 12) and x.dtype == torch.float32 and y.shape == (50,) and y.dtype == torch.int64
    assert xt.shape == (21, 1, 1, 12) and yt.shape == (21,)
    assert len(bundle.val) == 0 and bundle.val.tensors[0].shape == (0, 1, 1, 12)
    assert bundle.input_shape == (1, 1, 12) and bundle.num_classes == 4
    assert bundle.classes == ("0", "1", "2", "3") and bundle.name == "subspace_mixture" and bundle.source == "synthetic"
    assert torch.bincount(y, minlength=4).tolist() == [13, 13, 12, 12]             # balanced
    assert U.shape == (12, 3) and U.dtype == torch.float64
    assert torch.allclose(U.mT @ U, torch.eye(3, dtype=torch.float64), atol=1e-12)
    # noise = 0: the inputs lie in span(U)
    xf = x.flatten(1).to(torch.float64)
    assert torch.allclose(xf @ U @ U.mT, xf, atol=1e-5)
    # the models accept the layout
    model = build_model("mlp", in_shape=bundle.input_shape, num_classes=4, depth=1, width=8)
    assert model(x[:5]).shape == (5, 4)


def test_determinism_same_seed_same_bytes():
    a = subspace_mixture(40, 10, 9, 2, 3, coherence=0.3, noise=0.1, seed=7)
    b = subspace_mixture(40, 10, 9, 2, 3, coherence=0.3, noise=0.1, seed=7)
    c = subspace_mixture(40, 10, 9, 2, 3, coherence=0.3, noise=0.1, seed=8)
    assert _bytes(*a) == _bytes(*b) and _bytes(*a) != _bytes(*c)
    state = torch.get_rng_state()
    subspace_mixture(5, 5, 4, 2, 2, seed=0)
    assert torch.equal(state, torch.get_rng_state())                              # global RNG untouched


def test_latents_shared_across_coherence_and_noise():
    (b0, U0), (b1, U1) = subspace_mixture(30, 8, 10, 2, 3, seed=3), subspace_mixture(30, 8, 10, 2, 3, coherence=0.7, seed=3)
    z0 = b0.train.tensors[0].flatten(1).double() @ U0
    z1 = b1.train.tensors[0].flatten(1).double() @ U1
    assert torch.allclose(z0, z1, atol=1e-5) and torch.equal(b0.train.tensors[1], b1.train.tensors[1])
    bn, Un = subspace_mixture(30, 8, 10, 2, 3, noise=0.5, seed=3)
    assert torch.allclose(Un, U0) and torch.equal(bn.test.tensors[1], b0.test.tensors[1])
    resid = bn.train.tensors[0].flatten(1).double() - z0 @ U0.mT
    assert 0.3 < float(resid.std()) < 0.7                                          # isotropic noise of std 0.5


@pytest.mark.parametrize("d,k", [(20, 2), (16, 4), (7, 7)])
def test_coherence_knob_extremes_and_monotone(d, k):
    for seed in (0, 1):
        nus = [subspace_coherence(subspace_mixture(4, 0, d, k, 2, coherence=c, seed=seed)[1])
               for c in (0.0, 0.2, 0.4, 0.6, 0.8, 0.95, 1.0)]
        assert all(b >= a - 1e-9 for a, b in itertools.pairwise(nus)), nus
        assert nus[-1] == pytest.approx(d / k, abs=1e-12)
        assert 1.0 - 1e-9 <= nus[0] <= d / k + 1e-9
        if k < d:
            assert nus[0] < 0.75 * d / k and nus[-1] > nus[0]
    U1 = subspace_mixture(4, 0, d, k, 2, coherence=1.0, seed=0)[1]
    assert set(U1.unique().tolist()) <= {0.0, 1.0} and torch.equal(U1.sum(0), torch.ones(k, dtype=torch.float64))


def test_classes_separable_on_projection():
    bundle, U = subspace_mixture(600, 300, d=20, k=4, num_classes=4, class_sep=3.0, noise=0.1, seed=0)
    x, y = bundle.train.tensors
    xt, yt = bundle.test.tensors
    z, zt = (x.flatten(1).double() @ U).numpy(), (xt.flatten(1).double() @ U).numpy()
    clf = LogisticRegression(max_iter=500).fit(z, y.numpy())
    assert clf.score(zt, yt.numpy()) > 0.9
    # class_sep = 0: all classes share one mean -> chance level
    b0, U0 = subspace_mixture(600, 300, d=20, k=4, num_classes=4, class_sep=0.0, seed=0)
    clf0 = LogisticRegression(max_iter=500).fit((b0.train.tensors[0].flatten(1).double() @ U0).numpy(),
                                                b0.train.tensors[1].numpy())
    assert clf0.score((b0.test.tensors[0].flatten(1).double() @ U0).numpy(), b0.test.tensors[1].numpy()) < 0.45


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"d": 3, "k": 4}, "k must be ≤ d"),
        ({"k": 0}, "k must be"),
        ({"coherence": 1.5}, "coherence"),
        ({"coherence": -0.1}, "coherence"),
        ({"num_classes": 1}, "num_classes"),
        ({"noise": -1.0}, "noise"),
        ({"class_sep": float("nan")}, "class_sep"),
        ({"n_train": 0}, "n_train"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"n_train": 10, "n_test": 5, "d": 8, "k": 2, "num_classes": 3}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        subspace_mixture(**args)
