"""The main job: on scikit-learn's bundled digits, train two MLPs from different seeds, measure the
naive barrier, align with weight matching and activation matching, measure again, merge at the
midpoint, and write ``results.json``, ``report.md`` and ``barrier.png``."""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable

from ..data import load_dataset
from ..io import save_checkpoint
from ..models import build_model
from ..train import TrainConfig, fit
from ..diagnostics.compare import compare_alignments
from ..experiments.output import output_directory
from .reporting import write_comparison

DEMO_MODEL = dict(depth=3, width=512)
DEMO_TRAIN = dict(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4, epochs=40, batch_size=64,
                  warmup_epochs=1.0, schedule="cosine")


def run_demo(out: str | Path, *, seeds: tuple[int, int] = (0, 1), epochs: int | None = None,
             methods=("naive", "weight", "activation"), overwrite: bool = False,
             log: Callable[[str], None] = print, progress: bool = True) -> tuple[Path, dict]:
    """Run the demo end to end; returns the output directory and the results dict."""
    start = time.perf_counter()
    with output_directory(out, overwrite) as tmp:
        bundle = load_dataset("digits")
        train_cfg = dict(DEMO_TRAIN, **({"epochs": epochs} if epochs else {}))
        models = []
        for name, seed in zip("AB", seeds, strict=False):
            log(f"training MLP {name} (seed {seed}) on digits: {len(bundle.train)} train / {len(bundle.test)} test")
            model = build_model("mlp", in_shape=bundle.input_shape, num_classes=bundle.num_classes, seed=seed, **DEMO_MODEL)
            cfg = TrainConfig(seed=seed, **train_cfg)
            fit(model, bundle.train, cfg, val_set=bundle.val, progress=progress)
            save_checkpoint(tmp / "models" / name, model, config={"training": cfg.model_dump(mode="json"),
                                                                  "dataset": "digits"})
            models.append(model)
        comparison = compare_alignments(models[0], models[0].state_dict(), models[1].state_dict(), bundle, methods,
                                        seed=seeds[0], on_step=log, progress=progress)
        results = {
            "task": "demo: two MLPs on scikit-learn digits",
            "model": {"architecture": "mlp", **DEMO_MODEL},
            "training": train_cfg,
            "seeds": list(seeds),
            "dataset": {"name": "digits", "train": len(bundle.train), "val": len(bundle.val), "test": len(bundle.test)},
            "endpoints": comparison.endpoints("test"),
            **comparison.to_json(),
            "seconds": time.perf_counter() - start,
        }
        write_comparison(tmp, comparison, results, title="MLP 3×512 on digits: linear interpolation A → B")
    return Path(out), results
