"""`modeconn experiment widths`: width fusion of two models of different widths into the narrower width.

For each case two models of one architecture are trained from different seeds, A at the narrow width and B at the
wide one, and fused into the narrow width by activation-based partial matching and averaging
(:func:`modeconn.path.width.merge_widths`). Baseline: the plain average of width-matched truncations (both models cut
to their first k units per space, averaged). Both merges get BatchNorm statistics re-estimated on training data. The
fused model and the truncation average are then fine-tuned for one epoch (the parents' recipe, a smaller learning
rate). Reported: test accuracy of the parents, of both merges before and after fine-tuning, and the fused model's
distance to the better parent. Cases: MLPs on MNIST and ResNet20s on Fashion-MNIST.

Writes ``results.json`` and ``report.md``.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..data import load_dataset, make_loader
from ..path.width import merge_widths
from ..report import markdown_table
from ..train import evaluate, fit
from .output import output_directory, write_results
from .registry import Experiment, Log, register_experiment, size_label
from .training import train_models


@dataclass(frozen=True)
class Case:
    """One fusion: ``arch`` on ``dataset`` at ``widths`` (narrow A, wide B; the architecture's ``width`` option)."""

    name: str
    arch: str
    dataset: str
    widths: tuple[float, float]
    kwargs: dict = field(default_factory=dict)
    epochs: int = 3
    limit_train: int | None = None
    limit_test: int | None = None
    lr: float = 0.05


@dataclass(frozen=True)
class WidthsSize:
    cases: tuple[Case, ...]
    finetune_lr_factor: float = 0.1
    stated_distance: float = 0.03  # the fused model (before fine-tuning) within this accuracy of the better parent
    match_batches: int = 20
    batch_size: int = 128


SIZES = {
    "quick": WidthsSize((Case("mlp", "mlp", "mnist", (32, 64), {"depth": 2}, epochs=2, limit_train=2000,
                              limit_test=1000),
                         Case("resnet20", "resnet20", "fashion-mnist", (0.125, 0.25), epochs=1, limit_train=300,
                              limit_test=300)),
                        match_batches=2),
    # ResNet20 ×0.125/×0.25 on 2,000 images: the largest that trains in minutes on a shared two-core CPU
    "full": WidthsSize((Case("mlp", "mlp", "mnist", (256, 512), {"depth": 3}, epochs=2),
                        Case("resnet20", "resnet20", "fashion-mnist", (0.125, 0.25), epochs=2, limit_train=2000,
                             limit_test=2000))),
}


def _train_config(size: WidthsSize, epochs: int, lr: float, seed: int) -> dict[str, Any]:
    return {"epochs": epochs, "lr": lr, "batch_size": size.batch_size, "seed": seed}


def run_case(case: Case, size: WidthsSize, data, log: Log) -> dict[str, Any]:
    """Train the pair, fuse, truncate, fine-tune; every test accuracy of the case."""
    bundle = load_dataset(case.dataset, data, limit_train=case.limit_train, limit_test=case.limit_test)
    train = {k: v for k, v in _train_config(size, case.epochs, case.lr, 0).items() if k != "seed"}
    a, b = (train_models(case.arch, bundle, [seed], train, label=f"{case.name} width {w}", log=log, width=w,
                         **case.kwargs)[0] for seed, w in zip((0, 1), case.widths, strict=True))
    loader = make_loader(bundle.train, size.batch_size, shuffle=True, seed=0)
    acc = {"A": evaluate(a, bundle.test)["acc"], "B": evaluate(b, bundle.test)["acc"]}
    t0 = time.perf_counter()
    fused, alignment = merge_widths(a, b, loader, target=a, max_batches=size.match_batches)
    seconds = time.perf_counter() - t0
    truncated, _ = merge_widths(a, b, loader, target=a, max_batches=size.match_batches, match=False)
    acc["fused"], acc["truncation average"] = evaluate(fused, bundle.test)["acc"], evaluate(truncated, bundle.test)["acc"]
    for label, model in (("fused", fused), ("truncation average", truncated)):
        tuned = copy.deepcopy(model)
        fit(tuned, bundle.train, _train_config(size, 1, case.lr * size.finetune_lr_factor, 2), progress=False)
        acc[f"{label} + 1 epoch"] = evaluate(tuned, bundle.test)["acc"]
    log(f"{case.name}: " + ", ".join(f"{k} {v:.4f}" for k, v in acc.items()))
    return {"case": asdict(case), "test_acc": acc, "better_parent": max(acc["A"], acc["B"]), "fuse_seconds": seconds,
            "mean_matched_correlation": alignment.correlation, "train_examples": len(bundle.train),
            "test_examples": len(bundle.test)}


def run_widths(out: str | Path, *, size: WidthsSize | None = None, data: str | Path | None = None,
               overwrite: bool = False, log: Log = print) -> dict[str, Any]:
    """Run every case of ``size`` (module docstring); writes ``results.json`` and ``report.md`` into ``out``."""
    size = size or SIZES["full"]
    start = time.perf_counter()
    with output_directory(out, overwrite) as tmp:
        results = {"task": "width fusion", "size": size_label(SIZES, size), "settings": asdict(size),
                   "cases": {c.name: run_case(c, size, data, log) for c in size.cases}}
        return write_results(tmp, results, report, start)


def claims(case: dict[str, Any], distance: float) -> dict[str, bool]:
    """The acceptance claims of one case's results, each true or false."""
    acc, better = case["test_acc"], case["better_parent"]
    return {"fused above the truncation average": acc["fused"] > acc["truncation average"],
            f"fused within {distance:g} of the better parent": acc["fused"] >= better - distance,
            "fused + 1 epoch at or above the better parent": acc["fused + 1 epoch"] >= better}


def report(r: dict[str, Any]) -> str:
    distance = r["settings"].get("stated_distance", WidthsSize.stated_distance)
    rows = []
    for name, c in r["cases"].items():
        acc, case = c["test_acc"], c["case"]
        rows.append([f"{name} ({case['dataset']}, widths {case['widths'][0]} + {case['widths'][1]} → "
                     f"{case['widths'][0]})", acc["A"], acc["B"], acc["truncation average"], acc["fused"],
                     acc["fused"] - c["better_parent"], acc["truncation average + 1 epoch"], acc["fused + 1 epoch"],
                     acc["fused + 1 epoch"] - c["better_parent"]])
    table = markdown_table(["case", "A (narrow)", "B (wide)", "truncation avg", "fused", "fused − better parent",
                            "truncation avg + 1 ep", "fused + 1 ep", "fused + 1 ep − better parent"], rows)
    return "\n".join([
        f"# {r['task']} ({r['size']} size)", "",
        "Test accuracy (fraction). A: seed 0 at the narrow width, B: seed 1 at the wide width; both merges are at "
        "A's width with BatchNorm statistics re-estimated; '+ 1 ep': one more epoch of training at a tenth of the "
        "parents' learning rate.", "", table, "",
        markdown_table(["case", "claim", "holds"], [[n, k, "yes" if v else "**no**"] for n, c in r["cases"].items()
                                                    for k, v in claims(c, distance).items()]), "",
        "Training: " + "; ".join(f"{n}: {c['train_examples']:,} training / {c['test_examples']:,} test examples, "
                                 f"{c['case']['epochs']} epoch(s) at lr {c['case']['lr']}, fusion {c['fuse_seconds']:.1f} s"
                                 for n, c in r["cases"].items()) + ".", "",
        f"Total {r['seconds']:.0f} s.", "",
    ])


register_experiment(Experiment("widths", __doc__, SIZES, run_widths, report, ("report.md", "results.json"),
                               why_not="each case fixes its own widths and training"))
