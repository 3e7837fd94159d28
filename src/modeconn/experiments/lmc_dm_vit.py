"""`modeconn experiment lmc-dm-vit`: dual learned matching (LMC-DM, docs/methods.md §3) for a pair of vision transformers.

Two standard (pre-LN) ViTs — Hugging Face ``ViTForImageClassification`` behind the ``vit-tiny`` architecture
(:mod:`modeconn.models.vit`) — are trained on Fashion-MNIST from seeds 0 and 1 with AdamW
(:func:`train_vit_pair`). Then, exactly as for the language models of ``lmc-dm``
(:func:`modeconn.experiments.lmc_dm.dm_barriers`): their normalizations are absorbed, the full group is bound on
the absorbed models (:data:`GROUPS`: orthogonal residual rotation, head permutation, per-head invertible QK and
OV transforms — a ViT has no rotary embeddings, so these are full ``GL(d_head)`` per head — and FFN
permutation), weight matching (WM) is computed once, and the held-out loss **and accuracy** along the linear
path are measured for naive interpolation (as trained and in the absorbed coordinates), WM, one-sided learned
matching (Theus et al. 2025) and dual matching (the literal dual path ``(1−λ)·π_A(θ_A) + λ·π_B(θ_B)``). Ablations
at the same step budget (:data:`ABLATIONS`): dual matching without the QK transforms, without the OV transforms
(the paper: removing either raises the barrier, most on ViT) and without the residual rotation.

Barriers (:func:`~modeconn.experiments.lmc_dm.barrier_row`, test split): ``barrier_mean`` / ``barrier_interp`` of
the cross-entropy (nats), the same of the error ``1 − acc`` (``acc_barrier_mean``: accuracy lost at the worst
point relative to the endpoints' mean), and ``min_acc``, the lowest test accuracy anywhere on the λ grid (the
paper's "ViT-L keeps > 69 % top-1 along the whole path" statistic).

Measured results (they drift with versions) live in the generated ``docs/results/lmc-dm-vit/`` report.

The full size also runs the planted-MiniLM check of dual matching
(:func:`modeconn.experiments.planted_dm.planted_minilm_dual`, :attr:`ViTDMSize.minilm`); the quick size leaves
it to its own test.

Sizes (:data:`SIZES`; both use 7 × 7 patches, i.e. 16 patch tokens + CLS): ``--quick`` (CI, about a minute on
two shared cores: 6,000 training images for 3 epochs, 40 matching steps, 500 test images) and the full size (all
54,000 training images for 3 epochs, 300 matching steps, 2,000 test images, and the planted MiniLM).

Writes ``results.json``, ``report.md`` and ``vit_dm_barrier.png`` (held-out loss and accuracy vs λ for the main
methods).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..data import load_dataset, make_loader
from ..report import plot_curves
from .lmc_dm import ABLATIONS as LM_ABLATIONS
from .lmc_dm import GROUPS, Ablation, Log, dm_barriers, dm_report_sections, dm_results, learned_options
from .output import output_directory, write_results
from .planted_dm import MiniLMDMSize, minilm_report, planted_minilm_dual
from .training import train_models
from .registry import Experiment, register_experiment

#: the ablations of :data:`modeconn.experiments.lmc_dm.ABLATIONS` run on the ViT pair (not the parameterisations)
ABLATIONS: dict[str, Ablation] = {k: v for k, v in LM_ABLATIONS.items() if v.parameterization == "cayley"}
DATASET = "fashion-mnist"


@dataclass(frozen=True)
class ViTSize:
    """The ViT pair and its training: ``vit-tiny`` kwargs (``hidden_size`` × ``layers``, ``heads``, MLP
    ``intermediate``, ``patch`` × ``patch`` pixel patches), AdamW (``lr``, ``weight_decay``, ``batch_size``, cosine
    schedule after a 5 % warm-up, gradient norm clipped at 1) for ``epochs`` over the first ``limit_train`` training
    images (None: all 54,000 after the validation split); ``eval_examples`` test images and ``lambdas`` points on
    every path."""

    hidden_size: int
    layers: int
    heads: int
    intermediate: int
    patch: int
    limit_train: int | None
    epochs: int
    eval_examples: int
    lambdas: int
    lr: float = 3e-3
    weight_decay: float = 0.05
    batch_size: int = 128


@dataclass(frozen=True)
class ViTDMSize:
    """``vit``: the models, their training and evaluation; the rest: the learned matching (Adam steps of one
    ``batch_size`` batch of training images, λ ~ U(0, 1) per step); ``minilm``: the planted-MiniLM check
    (None: not part of this size)."""

    vit: ViTSize
    steps: int
    lr: float = 0.01
    batch_size: int = 128
    lambda_schedule: str = "uniform"
    minilm: MiniLMDMSize | None = None


SIZES = {
    "quick": ViTDMSize(vit=ViTSize(hidden_size=64, layers=2, heads=4, intermediate=128, patch=7, limit_train=6000,
                                   epochs=3, eval_examples=500, lambdas=5), steps=40, batch_size=64),
    "full": ViTDMSize(vit=ViTSize(hidden_size=64, layers=2, heads=4, intermediate=256, patch=7, limit_train=None,
                                  epochs=3, eval_examples=2000, lambdas=11), steps=300, minilm=MiniLMDMSize()),
}


def train_vit_pair(size: ViTSize, bundle, log: Log) -> list[nn.Module]:
    """Two ``vit-tiny`` models trained on ``bundle.train`` from seeds 0 and 1 (initialisation and data order);
    returned in eval mode."""
    train = dict(epochs=size.epochs, lr=size.lr, optimizer="adamw", weight_decay=size.weight_decay,
                 batch_size=size.batch_size, warmup_epochs=0.05 * size.epochs, grad_clip=1.0)
    return train_models("vit-tiny", bundle, (0, 1), train, log=log, label="ViT", patch_size=size.patch,
                        hidden_size=size.hidden_size, num_hidden_layers=size.layers, num_attention_heads=size.heads,
                        intermediate_size=size.intermediate)


def run_lmc_dm_vit(out: str | Path, *, quick: bool = False, data: str | Path | None = None, overwrite: bool = False,
                   size: ViTDMSize | None = None, log: Log = print) -> dict[str, Any]:
    """Run the experiment (module docstring) and write its outputs into ``out`` (atomically).

    Raises: DataError (Fashion-MNIST or, for a size with ``minilm``, the MiniLM checkpoint not found), ConfigError
    (``out`` not empty without ``overwrite``), and what training and matching raise.
    """
    from ..data.locate import find_data_dir

    size = size or SIZES["quick" if quick else "full"]
    v = size.vit
    start = time.perf_counter()
    with output_directory(out, overwrite) as tmp:
        bundle = load_dataset(DATASET, data, limit_train=v.limit_train, limit_test=v.eval_examples)
        minilm_root = find_data_dir("minilm", data) if size.minilm is not None else None  # fail before training
        t0 = time.perf_counter()
        models = train_vit_pair(v, bundle, log)
        train_seconds = time.perf_counter() - t0
        evl = {"test": make_loader(bundle.test, 250)}
        def train_loader():
            return make_loader(bundle.train, size.batch_size, shuffle=True, seed=0)

        curves, ablations, stats = dm_barriers(models, evl, train_loader, lambdas=v.lambdas, opts=learned_options(size),
                                               groups=GROUPS, ablations=ABLATIONS, log=log)
        plot_curves(curves, tmp / "vit_dm_barrier.png",
                    title="ViT pair on Fashion-MNIST: held-out loss and accuracy vs λ")
        results = {
            "task": "dual learned matching for vision transformers (LMC-DM, docs/methods.md §3)",
            "size": asdict(size),
            "groups": GROUPS,
            "learned_options": learned_options(size),
            "data": {"dataset": DATASET, "train_examples": len(bundle.train), "test_examples": len(bundle.test)},
            "training": {"seconds": train_seconds, "epochs": v.epochs, "optimizer": "adamw", "lr": v.lr,
                         "weight_decay": v.weight_decay, "batch_size": v.batch_size},
            "parameters": sum(p.numel() for p in models[0].parameters()),
        } | dm_results(curves, ablations, stats)
        if size.minilm is not None:
            results["minilm"] = planted_minilm_dual(minilm_root, size.minilm, data=data, log=log)
        write_results(tmp, results, report, start)
    return results


def report(r: dict[str, Any]) -> str:
    v = r["size"]["vit"]
    b = r["barriers"]
    lines = [
        f"# {r['task']}",
        "",
        (f"Standard ViT pair (`vit-tiny`: Hugging Face ViTForImageClassification, {v['layers']} layers × "
         f"{v['hidden_size']}, {v['heads']} heads, MLP {v['intermediate']}, {v['patch']}×{v['patch']} patches, "
         f"{r['parameters']:,} parameters), seeds 0 and 1. **Training budget:** {v['epochs']} epoch(s) of AdamW "
         f"(lr {v['lr']}, weight decay {v['weight_decay']}, batch {v['batch_size']}) over "
         f"{r['data']['train_examples']:,} Fashion-MNIST training images, {r['training']['seconds']:.0f} s for both. "
         f"Losses are cross-entropy (nats) and accuracies fractions on {r['data']['test_examples']:,} held-out test "
         f"images, {v['lambdas']} points on each path. Endpoint test accuracies "
         f"{b['naive']['endpoint_acc'][0]:.4f} / {b['naive']['endpoint_acc'][1]:.4f}."),
        "",
        *dm_report_sections(r, "training images", accuracy=True),
    ]
    if "minilm" in r:
        lines += [minilm_report(r["minilm"]), ""]
    lines += ["![loss and accuracy vs λ](vit_dm_barrier.png)", ""]
    return "\n".join(lines)


register_experiment(Experiment("lmc-dm-vit", __doc__, SIZES, run_lmc_dm_vit, report,
                               ("report.md", "results.json", "vit_dm_barrier.png"),
                               {"epochs": "vit.epochs", "width": "vit.hidden_size", "limit_train": "vit.limit_train"},
                               why_not="one pair of vision transformers"))
