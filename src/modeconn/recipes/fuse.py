"""Recipe ``fuse``: two modeconn checkpoints of one architecture at different widths fused into one width."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .outcome import Outcome


def target_kwargs(cfg_a: dict[str, Any], cfg_b: dict[str, Any], width: float | None) -> dict[str, Any]:
    """The fused model's architecture kwargs: those of the model with the smaller ``width`` (or, for an architecture
    whose widths are other options such as ``cnn``'s ``channels``, of A), with ``width`` if given.

    Raises ConfigError if A and B are different architectures, or ``width`` is given for an architecture without a
    ``width`` option."""
    ka, kb = cfg_a["kwargs"], cfg_b["kwargs"]
    if cfg_a["architecture"] != cfg_b["architecture"]:
        raise ConfigError(f"A is a {cfg_a['architecture']}, B a {cfg_b['architecture']}: fuse needs one architecture")
    if "width" not in ka:
        if width is not None:
            raise ConfigError(f"architecture {cfg_a['architecture']!r} has no width option; leave out --width (the "
                              "fused model takes A's widths)")
        return dict(ka)
    narrow = ka if ka["width"] <= kb["width"] else kb
    return {**narrow, "width": narrow["width"] if width is None else width}


def check_modeconn_kind(paths: list[Path]) -> None:
    """ConfigError, before any weights are read, for a checkpoint that is not modeconn's own: only its architectures
    are built at another width (Hugging Face, timm and torchvision widths are not fused)."""
    from ..checkpoints import open_checkpoints

    for ckpt in open_checkpoints(paths):
        if ckpt.kind.name != "modeconn":
            raise ConfigError(f"fuse reads modeconn checkpoints (architectures built with a width option); "
                              f"{ckpt.describe()} is not one: models of other kinds at different widths are not fused")


def fuse(model_a: Path, model_b: Path, out: Path, *, width: float | None = None, dataset: str | None = None,
         data: Path | None = None, limit_train: int | None = None, batches: int = 20, overwrite: bool = False,
         log: Callable[[str], None] = print) -> Outcome:
    """Fuse checkpoints A and B into a checkpoint of ``width`` (:func:`target_kwargs`; :func:`modeconn.path.width.merge_widths`: activations
    on ``dataset``'s training split, default the checkpoints' dataset; ``batches`` batches of 128), evaluate it on
    the test split and write it to ``out``. Raises ConfigError (architectures differ beyond the width, a width that
    cannot change, no dataset) or CheckpointError (unreadable inputs, ``out`` exists) before writing anything."""
    from ..data import load_dataset, make_loader
    from ..io import load_checkpoint, save_checkpoint
    from .._util.outdir import check_output_target
    from ..models import build_model
    from ..path.width import merge_widths
    from ..train import evaluate

    check_output_target(out, inputs=[p for p in (model_a, model_b, data) if p is not None], overwrite=overwrite)
    check_modeconn_kind([model_a, model_b])
    (a, cfg_a), (b, cfg_b) = load_checkpoint(model_a), load_checkpoint(model_b)
    kwargs = target_kwargs(cfg_a, cfg_b, width)
    dataset = dataset or cfg_a.get("dataset")
    if dataset is None:
        raise ConfigError("the checkpoints record no dataset; give --dataset")
    bundle = load_dataset(dataset, data, limit_train=limit_train)
    target = build_model(cfg_a["architecture"], seed=0, **kwargs)
    fused, alignment = merge_widths(a, b, make_loader(bundle.train, 128, shuffle=True), target=target,
                                    max_batches=batches)
    metrics = {"test": evaluate(fused, bundle.test), "mean_matched_correlation": alignment.correlation}
    save_checkpoint(out, fused, config={"dataset": dataset, "fused_from": [str(model_a), str(model_b)]},
                    metrics=metrics, overwrite=overwrite, inputs=(model_a, model_b), command="fuse")
    log(f"fused width {cfg_a['kwargs']['width']} + {cfg_b['kwargs']['width']} → {kwargs['width']}")
    return Outcome(out, "config.json, model.safetensors, metrics.json",
                   (f"test accuracy {metrics['test']['acc']:.4f}",), "fused checkpoint")
