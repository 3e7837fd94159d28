"""Briefly trained model pairs for the weight-matching benchmarks, built with modeconn's own training API and cached
under ``benchmarks/cache/`` (git-ignored): trained once, then read back.

Pairs (two seeds each, independent initialisation and data order, SGD with modeconn's defaults):

* ``mlp``: MLP 3×512 on MNIST (first 10,000 training images, 3 epochs);
* ``resnet``: ResNet20×4 with BatchNorm on Fashion-MNIST (first 2,000 training images, 2 epochs) — short, since one
  ResNet20×4 step costs a few seconds on two cores, but enough to move every weight well away from its initialisation.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from modeconn.data import load_dataset
from modeconn.experiments.training import train_models
from modeconn.io import load_state_dict, save_state_dict
from modeconn.models import build_model

CACHE = Path(__file__).resolve().parent / "cache"

PAIRS = {
    "mlp": dict(arch="mlp", kwargs=dict(depth=3, width=512), dataset="mnist", limit_train=10_000,
                train=dict(epochs=3, lr=0.05, batch_size=128)),
    "resnet": dict(arch="resnet20", kwargs=dict(width=4.0, norm="batchnorm"), dataset="fashion-mnist",
                   limit_train=2_000, train=dict(epochs=2, lr=0.05, batch_size=64)),
}


def trained_pair(name: str, seeds: tuple[int, int] = (0, 1)) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two trained models of pair ``name`` (eval mode), from the cache or trained now and cached."""
    p = PAIRS[name]
    files = [CACHE / f"{name}_seed{s}.safetensors" for s in seeds]
    models = [build_model(p["arch"], in_shape=(1, 28, 28), num_classes=10, seed=s, **p["kwargs"]) for s in seeds]
    if all(f.exists() for f in files):
        for m, f in zip(models, files, strict=True):
            m.load_state_dict(load_state_dict(f))
        return models[0].eval(), models[1].eval()
    bundle = load_dataset(p["dataset"], os.environ.get("MODECONN_DATA"), limit_train=p["limit_train"])
    models = train_models(p["arch"], bundle, list(seeds), p["train"], in_shape=(1, 28, 28), log=print, **p["kwargs"])
    CACHE.mkdir(exist_ok=True)
    for m, f in zip(models, files, strict=True):
        save_state_dict(f, m.state_dict())
    return models[0], models[1]


if __name__ == "__main__":
    for n in PAIRS:
        trained_pair(n)
