"""`modeconn experiment widths`: width fusion of two models of different widths into the narrower width.

For each case two models of one architecture are trained from different seeds, A at the narrow width and B at the
wide one, and fused into the narrow width by activation-based partial matching and averaging
(:func:`modeconn.path.width.merge_widths`), with BatchNorm statistics re-estimated (``reset``) and, where the size
asks for it, with REPAIR (the fused units' statistics set to the average of the parents' matched units' statistics,
Jordan et al. 2023). Baseline: the plain average of width-matched truncations (both models cut to their first k
units per space, averaged). Each starting point is then fine-tuned for one epoch under each of the size's
schedules: ``0.1× lr`` (a tenth of the parents' peak learning rate, cosine to 0) and ``parents' recipe`` (the
parents' peak learning rate after a short linear warm-up, cosine to 0: one more epoch of the parents' own
schedule). Control: the narrow parent A fine-tuned the same way (as much extra training, no fusion). Reported: test
accuracy of every model and the claims against the better parent. Cases: MLPs on MNIST and ResNet20s on
Fashion-MNIST.

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
    finetune_from: tuple[str, ...] | None = None  # the size's unless given
    match_batches: int | None = None  # the size's unless given


@dataclass(frozen=True)
class Schedule:
    """One epoch of fine-tuning: peak learning rate ``lr_factor`` × the case's ``lr``, linear warm-up over
    ``warmup_epochs``, cosine decay to 0."""

    name: str
    lr_factor: float
    warmup_epochs: float = 0.0


LOW_LR = Schedule("0.1× lr", 0.1)
PARENTS_RECIPE = Schedule("parents' recipe", 1.0, 0.1)


@dataclass(frozen=True)
class WidthsSize:
    cases: tuple[Case, ...]
    schedules: tuple[Schedule, ...] = (LOW_LR, PARENTS_RECIPE)
    # starting points fine-tuned under every schedule; "fused (REPAIR)" also merges with bn="repair"
    finetune_from: tuple[str, ...] = ("fused", "fused (REPAIR)", "truncation average", "A")
    stated_distance: float = 0.03  # the fused model (before fine-tuning) within this accuracy of the better parent
    match_batches: int = 20
    batch_size: int = 128


SIZES = {
    "quick": WidthsSize((Case("mlp", "mlp", "mnist", (32, 64), {"depth": 2}, epochs=2, limit_train=2000,
                              limit_test=1000),
                         Case("resnet20", "resnet20", "fashion-mnist", (0.125, 0.25), epochs=1, limit_train=300,
                              limit_test=300)),
                        schedules=(PARENTS_RECIPE,), finetune_from=("fused", "truncation average"),
                        match_batches=2),
    # the MLPs on all of MNIST, trained 3 and 10 epochs; ResNet20 ×2/×4 on 20,000 Fashion-MNIST images (3 epochs), tested
    # on all 10,000: what one core of a two-core CPU trains in under an hour (a ×4 minibatch of 128 costs seconds there)
    "full": WidthsSize((Case("mlp", "mlp", "mnist", (256, 512), {"depth": 3}, epochs=3,
                             finetune_from=("fused", "fused (REPAIR)", "truncation average", "A")),
                        Case("mlp-10", "mlp", "mnist", (256, 512), {"depth": 3}, epochs=10,
                             finetune_from=("fused", "fused (REPAIR)", "truncation average", "A")),
                        Case("resnet20", "resnet20", "fashion-mnist", (2, 4), epochs=3, limit_train=20000,
                             finetune_from=("fused", "A"), match_batches=8))),
}


def _train_config(size: WidthsSize, epochs: int, lr: float, seed: int, warmup_epochs: float = 0.0) -> dict[str, Any]:
    return {"epochs": epochs, "lr": lr, "batch_size": size.batch_size, "seed": seed, "warmup_epochs": warmup_epochs}


def run_case(case: Case, size: WidthsSize, data, log: Log) -> dict[str, Any]:
    """Train the pair, fuse, truncate, fine-tune; every test accuracy of the case."""
    case_start = time.perf_counter()
    bundle = load_dataset(case.dataset, data, limit_train=case.limit_train, limit_test=case.limit_test)
    train = {k: v for k, v in _train_config(size, case.epochs, case.lr, 0).items() if k != "seed"}
    a, b = (train_models(case.arch, bundle, [seed], train, label=f"{case.name} width {w}", log=log, width=w,
                         **case.kwargs)[0] for seed, w in zip((0, 1), case.widths, strict=True))
    loader = make_loader(bundle.train, size.batch_size, shuffle=True, seed=0)
    starts, batches = case.finetune_from or size.finetune_from, case.match_batches or size.match_batches
    models = {"A": a, "B": b}
    t0 = time.perf_counter()
    models["fused"], alignment = merge_widths(a, b, loader, target=a, max_batches=batches)
    seconds = time.perf_counter() - t0
    if "fused (REPAIR)" in starts:
        models["fused (REPAIR)"], _ = merge_widths(a, b, loader, target=a, max_batches=batches, bn="repair")
    models["truncation average"], _ = merge_widths(a, b, loader, target=a, max_batches=batches, match=False)
    acc = {k: evaluate(m, bundle.test)["acc"] for k, m in models.items()}
    for label in starts:
        for sched in size.schedules:
            tuned = copy.deepcopy(models[label])
            fit(tuned, bundle.train, _train_config(size, 1, case.lr * sched.lr_factor, 2, sched.warmup_epochs),
                progress=False)
            acc[f"{label} + 1 epoch ({sched.name})"] = evaluate(tuned, bundle.test)["acc"]
    log(f"{case.name}: " + ", ".join(f"{k} {v:.4f}" for k, v in acc.items()))
    return {"case": asdict(case), "test_acc": acc, "better_parent": max(acc["A"], acc["B"]), "fuse_seconds": seconds,
            "mean_matched_correlation": alignment.correlation, "train_examples": len(bundle.train),
            "test_examples": len(bundle.test), "seconds": time.perf_counter() - case_start}


def run_widths(out: str | Path, *, size: WidthsSize | None = None, data: str | Path | None = None,
               overwrite: bool = False, log: Log = print, done: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every case of ``size`` (module docstring); writes ``results.json`` and ``report.md`` into ``out``.
    ``done``: results of cases already run (by name, as :func:`run_case` returns them, e.g. in other processes),
    taken as they are."""
    size = size or SIZES["full"]
    start = time.perf_counter()
    done = done or {}
    with output_directory(out, overwrite) as tmp:
        results = {"task": "width fusion", "size": size_label(SIZES, size), "settings": asdict(size),
                   "cases": {c.name: done[c.name] if c.name in done else run_case(c, size, data, log)
                             for c in size.cases}}
        return write_results(tmp, results, report, start)


def claims(case: dict[str, Any], distance: float, schedules: list[str]) -> dict[str, bool]:
    """The acceptance claims of one case's results, each true or false (fine-tuning: one claim per schedule), and the
    control's: whether the narrow parent itself reaches the better parent with as much extra training."""
    acc, better = case["test_acc"], case["better_parent"]
    out = {"fused above the truncation average": acc["fused"] > acc["truncation average"],
           f"fused within {distance:g} of the better parent": acc["fused"] >= better - distance}
    for start in ("fused", "fused (REPAIR)", "A"):
        for name in schedules:
            key = f"{start} + 1 epoch ({name})"
            if key in acc:
                label = f"control: {key}" if start == "A" else key
                out[f"{label} at or above the better parent"] = acc[key] >= better
    return out


def after_one_epoch(name: str, case: dict[str, Any]) -> str:
    """One line: the best fine-tuned fusion against the best fine-tuned control (A) and the better parent."""
    acc = case["test_acc"]

    def best(*starts: str) -> float | None:
        tuned = [v for k, v in acc.items() if any(k.startswith(f"{s} + 1 epoch") for s in starts)]
        return max(tuned) if tuned else None

    fused, control = best("fused", "fused (REPAIR)"), best("A")
    if fused is None or control is None:
        return f"- {name}: no fused model and control both fine-tuned in this size."
    verdict = "beats" if fused > control else "does not beat"
    return (f"- {name}: after one epoch the best fused model ({fused:.4f}) {verdict} the narrow parent trained as long "
            f"({control:.4f}); the better parent: {case['better_parent']:.4f}.")


def _case_label(name: str, case: dict[str, Any]) -> str:
    w = case["widths"]
    return f"{name} ({case['dataset']}, {w[0]} + {w[1]} → {w[0]})"


def report(r: dict[str, Any]) -> str:
    settings = r["settings"]
    distance = settings.get("stated_distance", WidthsSize.stated_distance)
    schedules = settings["schedules"]
    before = ["A", "B", "truncation average", "fused", "fused (REPAIR)"]
    after = [f"{start} + 1 epoch ({s['name']})" for start in settings["finetune_from"] for s in schedules]
    cases = list(r["cases"].items())
    table = markdown_table(["model"] + [_case_label(n, c["case"]) for n, c in cases],
                           [[k.replace("truncation average", "truncation avg")] + [c["test_acc"].get(k, "—")
                                                                                  for _, c in cases]
                            for k in before + after if any(k in c["test_acc"] for _, c in cases)])
    sched_text = "; ".join(f"{s['name']}: peak lr {s['lr_factor']:g}× the parents', warm-up {s['warmup_epochs']:g} "
                           "epoch, cosine to 0" for s in schedules)
    names = [s["name"] for s in schedules]
    return "\n".join([
        f"# {r['task']} ({r['size']} size)", "",
        "Test accuracy (fraction). A: seed 0 at the narrow width, B: seed 1 at the wide width; every merge is at "
        "A's width; 'fused' and 'truncation average' with BatchNorm statistics re-estimated, 'fused (REPAIR)' with "
        "REPAIR. '+ 1 epoch (schedule)': one more epoch of training from that model under the schedule "
        f"({sched_text}). 'A + 1 epoch' is the control: as much extra training, no fusion.", "", table, "",
        markdown_table(["case", "claim", "holds"],
                       [[n, k, "yes" if v else "**no**"] for n, c in r["cases"].items()
                        for k, v in claims(c, distance, names).items()]), "",
        *(after_one_epoch(n, c) for n, c in r["cases"].items()), "",
        "Training: " + "; ".join(f"{n}: {c['train_examples']:,} training / {c['test_examples']:,} test examples, "
                                 f"{c['case']['epochs']} epoch(s) at lr {c['case']['lr']} (cosine), fusion "
                                 f"{c['fuse_seconds']:.1f} s, case {c.get('seconds', 0):.0f} s"
                                 for n, c in r["cases"].items()) + ".", "",
        f"Total {sum(c.get('seconds', 0) for c in r['cases'].values()):.0f} s (the cases' own times).", "",
    ])


register_experiment(Experiment("widths", __doc__, SIZES, run_widths, report, ("report.md", "results.json"),
                               why_not="each case fixes its own widths and training"))
