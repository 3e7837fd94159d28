"""Recipe ``fuse``: two checkpoints of one architecture at different widths fused into one width.

The checkpoint's kind does the work (:meth:`~modeconn.checkpoints.CheckpointKind.operation` ``"fuse"``): modeconn's
own architectures at another ``width`` option (:func:`fuse_modeconn`), Hugging Face causal LMs at another FFN width
(:func:`modeconn.recipes.fuse_hf.fuse_hf`); other kinds are refused by name before any weights are read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoints import CHECKPOINT_KINDS, Checkpoint, refuse_kind
from ..errors import ConfigError
from .fuse_hf import fuse_hf
from .outcome import Outcome

Log = Callable[[str], None]


@dataclass(frozen=True)
class FuseOptions:
    """What ``fuse`` was asked for (see :func:`fuse`)."""

    width: float | None = None
    dataset: str | None = None
    data: Path | None = None
    limit_train: int | None = None
    batches: int = 20
    overwrite: bool = False


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


def fuse_handler(ckpts: list[Checkpoint]) -> Callable[..., Outcome]:
    """The kind's ``fuse`` operation; ConfigError, before any weights are read, for a kind without one (naming the
    kinds fuse reads) or two checkpoints of different kinds."""
    for ckpt in ckpts:
        if ckpt.kind.operation("fuse") is None:
            raise refuse_kind("fuse", "fuse", ckpt)
    if ckpts[0].kind is not ckpts[1].kind:
        raise ConfigError(f"fuse needs two checkpoints of one kind: {ckpts[0].describe()} and {ckpts[1].describe()}")
    return ckpts[0].kind.operation("fuse")


def fuse(model_a: Path, model_b: Path, out: Path, *, width: float | None = None, dataset: str | None = None,
         data: Path | None = None, limit_train: int | None = None, batches: int = 20, overwrite: bool = False,
         log: Log = print) -> Outcome:
    """Fuse checkpoints A and B into a checkpoint of ``width`` (default: the narrower model's) by the kind's
    operation (module docstring), with unit activations on ``dataset``'s training split (``batches`` batches), and
    write it to ``out``. Raises ConfigError (another kind, architectures differ beyond the width, a width that cannot
    change, no dataset) or CheckpointError (unreadable inputs, ``out`` exists) before writing anything."""
    from .._util.outdir import check_output_target
    from ..checkpoints import open_checkpoints

    check_output_target(out, inputs=[p for p in (model_a, model_b, data) if p is not None], overwrite=overwrite)
    ckpts = open_checkpoints([model_a, model_b])
    handler = fuse_handler(ckpts)
    return handler(ckpts, out, FuseOptions(width, dataset, data, limit_train, batches, overwrite), log)


def fuse_modeconn(ckpts: list[Checkpoint], out: Path, opts: FuseOptions, log: Log) -> Outcome:
    """modeconn checkpoints (:func:`target_kwargs`; :func:`modeconn.path.width.merge_widths`: activations on the
    dataset's training split, default the checkpoints' dataset, in batches of 128), evaluated on the test split."""
    from ..data import load_dataset, make_loader
    from ..io import load_checkpoint, save_checkpoint
    from ..models import build_model
    from ..path.width import merge_widths
    from ..train import evaluate

    model_a, model_b = (c.path for c in ckpts)
    (a, cfg_a), (b, cfg_b) = load_checkpoint(model_a), load_checkpoint(model_b)
    kwargs = target_kwargs(cfg_a, cfg_b, opts.width)
    dataset = opts.dataset or cfg_a.get("dataset")
    if dataset is None:
        raise ConfigError("the checkpoints record no dataset; give --dataset")
    bundle = load_dataset(dataset, opts.data, limit_train=opts.limit_train)
    target = build_model(cfg_a["architecture"], seed=0, **kwargs)
    fused, alignment = merge_widths(a, b, make_loader(bundle.train, 128, shuffle=True), target=target,
                                    max_batches=opts.batches)
    metrics = {"test": evaluate(fused, bundle.test), "mean_matched_correlation": alignment.correlation}
    save_checkpoint(out, fused, config={"dataset": dataset, "fused_from": [str(model_a), str(model_b)]},
                    metrics=metrics, overwrite=opts.overwrite, inputs=(model_a, model_b), command="fuse")
    log(f"fused width {cfg_a['kwargs']['width']} + {cfg_b['kwargs']['width']} → {kwargs['width']}")
    return Outcome(out, "config.json, model.safetensors, metrics.json",
                   (f"test accuracy {metrics['test']['acc']:.4f}",), "fused checkpoint")


CHECKPOINT_KINDS["modeconn"].supports("fuse", fuse_modeconn)
CHECKPOINT_KINDS["huggingface"].supports("fuse", fuse_hf)
