"""Tutorial: Dual matching (LMC-DM) of two vision transformers on your own image folder, from the command line.

Two Hugging Face ``ViTForImageClassification`` models (2 layers × 64, 4 heads, 7 × 7 patches of 28 × 28 grey images)
are trained from different seeds in a plain PyTorch loop on Fashion-MNIST written as an image folder
(``images/train/<class>/*.png`` and ``images/test/<class>/*.png``, the classes named in the models' ``id2label``), and
saved with ``save_pretrained``. Then, from the command line:

1. ``check`` — will they merge? (relationship, identifiability, predicted barriers);
2. ``align --method weight --groups full`` — weight matching with the full transformer group (both endpoints absorbed:
   orthogonal residual, head permutations with per-head QK/OV maps, FFN permutations);
3. ``align --method dual`` — dual learned matching: the continuous transforms learned on the training images;
4. ``barrier`` on the held-out images — test accuracy and loss along the straight line between the checkpoints as
   trained (naive) and between the endpoints each alignment wrote: the lowest accuracy on each path against the
   endpoints' mean;
5. ``merge --align dual`` and ``eval`` of the merge. ViT normalises with LayerNorm, which cannot hold the rotated
   model, so the merge is an *absorbed* checkpoint (``modeconn.symmetry.load_absorbed`` loads it).

Run it: ``python examples/tutorial_vit_fashion_dual.py OUT_DIR [--quick]`` (``--quick``: the small size the test
suite runs). The full size's numbers are in the docs' results (ViT dual matching from the command line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
import transformers as T

from cli_helpers import modeconn, run_tutorial

CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]
MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, image_size=28,
             patch_size=7, num_channels=1)
SIZES = {"quick": dict(train=1_000, test=300, epochs=1, learn=10, lambdas=3),
         "full": dict(train=20_000, test=2_000, epochs=6, learn=300, lambdas=11)}
#: Dual matching's settings for images: batches of 128 images (the default 16 is sized for 128-token text blocks),
#: and half the one-sided learning rate (both endpoints move, so the relative element moves twice as fast).
LEARN = ["--batch-size", "128", "--lr", "0.005"]


def fashion_mnist(split: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` uint8 images (n, 28, 28) and labels of the bundled Fashion-MNIST ``split`` (train or t10k)."""
    from modeconn.data import read_idx
    from modeconn.data.locate import find_data_dir

    root = find_data_dir("fashion-mnist")
    return (read_idx(root / f"{split}-images-idx3-ubyte.gz")[:n].astype(np.uint8),
            read_idx(root / f"{split}-labels-idx1-ubyte.gz")[:n].astype(np.int64))


def write_folder(root: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """``root/<class>/<i>.png``: what a user's image folder looks like."""
    from PIL import Image

    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = root / CLASSES[int(label)]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:05d}.png")


def train(seed: int, images: np.ndarray, labels: np.ndarray, epochs: int) -> T.ViTForImageClassification:
    """A plain PyTorch loop: AdamW (cosine schedule, batches of 128) on the images as ``[0, 1]`` tensors — what
    modeconn feeds a checkpoint without preprocessing of its own."""
    torch.manual_seed(seed)
    cfg = T.ViTConfig(num_labels=len(CLASSES), id2label=dict(enumerate(CLASSES)),
                      label2id={c: i for i, c in enumerate(CLASSES)}, **MODEL)
    model = T.ViTForImageClassification(cfg)
    x = torch.from_numpy(images).float().div(255).unsqueeze(1)
    y = torch.from_numpy(labels)
    steps = epochs * (len(x) // 128)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for i in range(len(x) // 128):
            idx = order[i * 128:(i + 1) * 128]
            opt.zero_grad()
            model(pixel_values=x[idx], labels=y[idx]).loss.backward()
            opt.step()
            sched.step()
    return model.eval()


def path_accuracy(out: Path) -> dict:
    """From a ``barrier --method naive`` run: the test accuracy at the endpoints and its minimum along the path."""
    results = json.loads((out / "results.json").read_text())
    acc = results["curves"]["naive"]["metrics"]["test"]["acc"]
    return {"endpoints": [acc[0], acc[-1]], "min": min(acc), "min_over_mean": min(acc) / ((acc[0] + acc[-1]) / 2),
            "barrier_mean_loss": results["barriers"]["naive"]["test"]["barrier_mean_loss"]}


def main(out: Path, quick: bool) -> dict:
    size = SIZES["quick" if quick else "full"]
    out.mkdir(parents=True, exist_ok=True)
    train_x, train_y = fashion_mnist("train", size["train"])
    test_x, test_y = fashion_mnist("t10k", size["test"])
    images = out / "images"
    write_folder(images / "train", train_x, train_y)
    write_folder(images / "test", test_x, test_y)
    for seed, name in ((0, "vit-a"), (1, "vit-b")):
        train(seed, train_x, train_y, size["epochs"]).save_pretrained(out / name)
    a, b = out / "vit-a", out / "vit-b"
    data = ["--dataset", images]
    modeconn("check", a, b, *data, "--max-batches", "2", "--out", out / "check")
    modeconn("align", a, b, "--method", "weight", "--groups", "full", "--out", out / "wm")
    modeconn("align", a, b, "--method", "dual", *data, "--steps", str(size["learn"]), *LEARN, "--out", out / "dual")
    paths = {}
    for name, (x, y) in {"naive": (a, b), "wm": (out / "wm" / "a", out / "wm" / "b"),
                         "dual": (out / "dual" / "a", out / "dual" / "b")}.items():
        modeconn("barrier", x, y, *data, "--method", "naive", "--lambdas", str(size["lambdas"]),
                 "--out", out / f"barrier-{name}")
        paths[name] = path_accuracy(out / f"barrier-{name}")
    modeconn("merge", a, b, "--align", "dual", *data, "-o", f"steps={size['learn']}", "-o", "lr=0.005",
             "--out", out / "merged")
    modeconn("eval", out / "merged", *data, "--out", out / "eval")
    print("test accuracy along each path:", json.dumps(paths))
    return {"paths": paths, "merge": json.loads((out / "merged" / "merge.json").read_text()),
            "eval": json.loads((out / "eval" / "results.json").read_text())}


def summary(out: Path) -> dict:
    """The numbers of a finished run in ``out``: accuracy along each path through the command line, the merge's
    score, and what ran."""
    import platform
    from datetime import date

    paths = {name: path_accuracy(out / f"barrier-{name}") for name in ("naive", "wm", "dual")}
    merge = json.loads((out / "merged" / "merge.json").read_text())
    return {"date": date.today().isoformat(), "torch": torch.__version__, "transformers": T.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores", "model": MODEL, "size": SIZES["full"],
            "paths": paths, "merge": {"test": merge["test"], "format": merge["format"]}}


def report(s: dict) -> str:
    """A markdown report of :func:`summary`."""
    m, z = s["model"], s["size"]
    rows = "\n".join(f"| {name} | {p['endpoints'][0]:.4f} / {p['endpoints'][1]:.4f} | {p['min']:.4f} | "
                     f"{p['min_over_mean']:.3f} | {p['barrier_mean_loss']:.4f} |" for name, p in s["paths"].items())
    test = s["merge"]["test"]
    return (f"# Dual matching of two vision transformers on an image folder, from the command line\n\n"
            f"Hugging Face `ViTForImageClassification` pair ({m['num_hidden_layers']} layers × {m['hidden_size']}, "
            f"{m['num_attention_heads']} heads, MLP {m['intermediate_size']}, {m['patch_size']} × {m['patch_size']} "
            f"patches of 28 × 28 grey images), trained from seeds 0 and 1 for {z['epochs']} epochs of AdamW on the "
            f"first {z['train']:,} Fashion-MNIST training images written as an image folder, saved with "
            f"`save_pretrained` (`examples/tutorial_vit_fashion_dual.py`, full size).\n\n"
            f"Paths: `modeconn barrier --method naive` on the folder's {z['test']:,} held-out images, {z['lambdas']} "
            f"points, between the checkpoints as trained (naive), the endpoints `align --method weight --groups full` "
            f"wrote (wm) and those `align --method dual --batch-size 128 --lr 0.005` wrote ({z['learn']} steps; "
            f"dual).\n\n"
            f"| pair | endpoint test accuracy | lowest accuracy on the path | ÷ endpoints' mean | barrier_mean "
            f"(test loss) |\n|---|---|---|---|---|\n{rows}\n\n"
            f"`merge --align dual -o lr=0.005` (its own dual matching, in batches of 16 images; weights ½, ½; written "
            f"as an {s['merge']['format']} checkpoint): test loss "
            f"{test['loss']:.4f}, accuracy {test['acc']:.4f}.\n\nRan on {s['date']} with torch {s['torch']}, "
            f"transformers {s['transformers']}, {s['machine']}.\n")


if __name__ == "__main__":
    run_tutorial(main, __doc__)
