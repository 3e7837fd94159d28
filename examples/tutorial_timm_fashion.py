"""Tutorial: your own timm models and your own image folder, through modeconn's command line.

Two timm ``resnet18d`` classifiers are trained from different seeds in a plain PyTorch loop on Fashion-MNIST, saved
the way the Hugging Face hub stores timm models (``timm.models.save_for_hf``), and the data is written as an image
folder (one sub-folder per class, ``train/`` and ``test/``). Then, from the command line: ``check`` (will they merge?),
``barrier`` (naive vs aligned), ``align --method activation``, ``merge`` and ``path --method bezier``.

Run it: ``python examples/tutorial_timm_fashion.py OUT_DIR [--quick]`` (``--quick``: the small size the test suite
runs). Every command's outputs land under OUT_DIR.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import timm
import torch
import torch.nn.functional as F

from cli_helpers import modeconn, run_tutorial

CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]


def fashion_mnist(limit: int):
    """Fashion-MNIST as uint8 arrays ``(N, 28, 28)`` and labels, through modeconn's bundled copy."""
    from modeconn.data import load_dataset

    bundle = load_dataset("fashion-mnist", limit_train=limit)
    to_uint8 = lambda t: (t[:, 0] * 0.3530 + 0.2860).clamp(0, 1).mul(255).round().byte().numpy()  # noqa: E731
    (xtr, ytr), (xte, yte) = bundle.train.tensors, bundle.test.tensors
    return to_uint8(xtr), ytr.numpy(), to_uint8(xte[:limit // 4]), yte[:limit // 4].numpy()


def write_image_folder(root: Path, splits) -> Path:
    """``root/{train,test}/<class>/<i>.png``: the layout torchvision's ImageFolder and ``datasets`` read."""
    from PIL import Image

    for split, (images, labels) in splits.items():
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            folder = root / split / CLASSES[int(label)]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{i:05d}.png")
    return root


def train(seed: int, images: np.ndarray, labels: np.ndarray, epochs: int) -> torch.nn.Module:
    """A plain PyTorch loop: a 1-channel timm resnet18d (narrow) trained with SGD on [0, 1] pixels."""
    torch.manual_seed(seed)
    model = timm.create_model("resnet18d", num_classes=10, in_chans=1, channels=(16, 32, 64, 128))
    x, y = torch.from_numpy(images).float().div(255).unsqueeze(1), torch.from_numpy(labels).long()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(64):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


def save(model: torch.nn.Module, directory: Path) -> Path:
    """Saved as the hub stores timm models; the preprocessing states the images as they are (28×28, one channel,
    pixels in [0, 1]) so that modeconn feeds the image folder the way the model was trained."""
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (1, 28, 28), "mean": (0.0,), "std": (1.0,),
                            "interpolation": "bilinear", "crop_pct": 1.0, "num_classes": 10}
    timm.models.save_for_hf(model, directory)
    return directory


def main(out: Path, quick: bool) -> dict:
    limit, epochs = (600, 1) if quick else (10000, 3)
    xtr, ytr, xte, yte = fashion_mnist(limit)
    data = write_image_folder(out / "fashion", {"train": (xtr, ytr), "test": (xte, yte)})
    a, b = (save(train(seed, xtr, ytr, epochs), out / name) for seed, name in ((0, "model-a"), (1, "model-b")))
    modeconn("check", a, b, "--dataset", data, "--max-batches", "2", "--out", out / "check")
    modeconn("barrier", a, b, "--dataset", data, "--method", "naive", "--method", "activation", "--lambdas", "5",
             "--out", out / "barrier")
    modeconn("align", a, b, "--method", "activation", "--dataset", data, "--out", out / "b-aligned")
    modeconn("merge", a, b, "--align", "activation", "--dataset", data, "--out", out / "merged")
    modeconn("path", a, b, "--method", "bezier", "--dataset", data, "--budget", "40" if quick else "400",
             "--eval-limit", "200", "--out", out / "path", ok=(0, 3))
    return {name: json.loads((out / name / "results.json").read_text()) for name in ("check", "barrier", "path")}


if __name__ == "__main__":
    run_tutorial(main, __doc__)
