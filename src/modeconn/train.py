"""Training: a typed config, a lean deterministic training loop, evaluation and train-to-checkpoint.

``fit`` is the one function in modeconn that mutates a model (it is the training loop). Everything it
does per step stays on the device: losses and correct counts are accumulated as tensors and synchronised
once per epoch, so it runs at the speed of a hand-written PyTorch loop (see ``benchmarks/bench_train.py``).

Determinism: the data order comes from a ``torch.Generator`` seeded with ``config.seed``, and the loop runs
inside ``torch.random.fork_rng`` seeded with ``config.seed`` (so e.g. dropout is reproducible and the
caller's global RNG is not disturbed). Same seed, same data, same initial weights, same device → same
weights (bitwise on CPU).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from .config import StrictConfig
from .errors import ConfigError, NonFiniteError
from ._util.jsonio import to_json
from .io import save_checkpoint
from .io.checkpoint import _check_target
from .models import build_model, validate_model_kwargs
from .nn_utils import flatten_sequence_logits
from .path.evaluate import evaluate_model

__all__ = ["TrainConfig", "evaluate", "fit", "lr_factor", "make_optimizer", "make_scheduler", "train_checkpoint"]


class TrainConfig(StrictConfig):
    """Hyper-parameters of :func:`fit`. Unknown fields (typos) and bad values raise ``ConfigError``.

    Attributes:
        optimizer: "sgd" (``torch.optim.SGD``) or "adamw" (``torch.optim.AdamW``).
        lr: peak learning rate (after warm-up).
        momentum: SGD momentum (ignored by AdamW).
        nesterov: SGD Nesterov momentum (requires momentum > 0).
        weight_decay: L2 penalty (SGD) / decoupled weight decay (AdamW), applied to all parameters.
        epochs: passes over the training set.
        batch_size: examples per step; the last batch of an epoch may be smaller unless ``drop_last``.
        drop_last: drop the last incomplete batch of each epoch.
        warmup_epochs: linear warm-up length in epochs (fractional allowed; converted to whole steps).
        schedule: decay after warm-up: "cosine" (to 0), "linear" (to 0) or "constant".
        label_smoothing: cross-entropy label smoothing in [0, 1).
        seed: seeds the data order and the RNG used during training.
        grad_clip: if set, clip the global gradient norm to this value.
        device: torch device string, e.g. "cpu", "cuda", "cuda:1".
        eval_every_epoch: evaluate ``val_set`` after every epoch (else only after the last one).
    """

    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = False
    weight_decay: float = Field(5e-4, ge=0)
    epochs: int = Field(10, ge=1)
    batch_size: int = Field(128, ge=1)
    drop_last: bool = False
    warmup_epochs: float = Field(0.0, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    seed: int = Field(0, ge=0, lt=2**63)
    grad_clip: float | None = Field(None, gt=0)
    device: str = "cpu"
    eval_every_epoch: bool = True

    @field_validator("device")
    @classmethod
    def _valid_device(cls, v: str) -> str:
        try:
            torch.device(v)
        except (RuntimeError, ValueError) as err:
            raise ValueError(f"not a torch device: {err}") from None
        return v

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> TrainConfig:
        if self.nesterov and (self.optimizer != "sgd" or self.momentum == 0):
            raise ValueError("nesterov=True needs optimizer='sgd' and momentum > 0")
        return self

    def steps_per_epoch(self, num_examples: int) -> int:
        """Optimizer steps per epoch for a training set of ``num_examples``."""
        if self.drop_last:
            return num_examples // self.batch_size
        return math.ceil(num_examples / self.batch_size)


# --------------------------------------------------------------------------------------------- schedule


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Multiplier of the peak LR used at optimizer step ``step`` (0-based) of ``total_steps``.

    Warm-up: ``(step + 1) / warmup_steps`` for ``step < warmup_steps`` (reaches 1 on the last warm-up step).
    Then, with ``p = (step - warmup_steps) / (total_steps - warmup_steps)`` ∈ [0, 1):
    cosine ``0.5 (1 + cos(π p))``, linear ``1 - p``, constant ``1``. Both decays start at 1 and approach 0.

    Raises:
        ConfigError: unknown schedule.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    p = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if schedule == "linear":
        return 1.0 - p
    if schedule == "constant":
        return 1.0
    raise ConfigError(f"unknown schedule {schedule!r}; valid schedules: cosine, linear, constant")


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer described by ``config`` over all of ``model``'s parameters (with ``lr = config.lr``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov, weight_decay=config.weight_decay
        )
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def make_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-step ``LambdaLR`` following :func:`lr_factor` (call ``.step()`` after every optimizer step)."""
    total = config.epochs * steps_per_epoch
    warmup = min(total, int(round(config.warmup_epochs * steps_per_epoch)))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total, warmup, config.schedule)
    )


# ------------------------------------------------------------------------------------------------- data


def _model_device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def _tensors_of(dataset: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(inputs, labels) of a 2-tensor TensorDataset, else None."""
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return dataset.tensors[0], dataset.tensors[1]
    return None


def _batches(
    dataset: Any,
    batch_size: int,
    *,
    generator: torch.Generator | None,
    drop_last: bool,
    device: torch.device,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(x, y) batches on ``device``; shuffled by ``generator`` if given.

    TensorDatasets are sliced directly (one gather per batch, no per-example collation); other datasets go
    through a ``DataLoader``; an iterable of (x, y) batches (e.g. a DataLoader) is used as is.
    """
    non_blocking = device.type == "cuda"
    tensors = _tensors_of(dataset)
    if tensors is not None:
        xs, ys = tensors
        n = xs.shape[0]
        order = torch.randperm(n, generator=generator) if generator is not None else None
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            if order is None:
                xb, yb = xs[start : start + batch_size], ys[start : start + batch_size]
            else:
                idx = order[start : start + batch_size]
                xb, yb = xs[idx], ys[idx]
            yield xb.to(device, non_blocking=non_blocking), yb.to(device, dtype=torch.long, non_blocking=non_blocking)
        return
    if isinstance(dataset, Dataset):
        loader: Iterable = DataLoader(
            dataset, batch_size=batch_size, shuffle=generator is not None, generator=generator, drop_last=drop_last
        )
    else:
        loader = dataset
    for batch in loader:
        xb, yb = batch[0], batch[1]
        yield xb.to(device, non_blocking=non_blocking), yb.to(device, dtype=torch.long, non_blocking=non_blocking)


def _num_examples(dataset: Any) -> int:
    try:
        return len(dataset)
    except TypeError:
        raise ConfigError(f"training data must be a sized Dataset (e.g. TensorDataset), got {type(dataset).__name__}")


# ------------------------------------------------------------------------------------------- evaluation

EVAL_TOKENS_PER_BATCH = 16384
"""Most tokens per evaluation batch of sequence data (logits of 16k tokens × V = 4096 are 256 MiB in fp32)."""


def evaluate(
    model: nn.Module, dataset_or_loader: Any, batch_size: int = 1024
) -> dict[str, float]:
    """Mean cross-entropy (nats) and accuracy (fraction in [0, 1]) of ``model`` on a dataset or loader.

    Runs in eval mode under ``torch.no_grad`` on the model's device, then restores the model's previous
    training mode. Accepts a TensorDataset of (x (N, ...), y (N,) int64), any map-style Dataset of (x, y),
    or an iterable of (x, y) batches. Language models (logits (B, T, V), labels (B, T)) are scored per
    token: ``loss`` is nats per token (perplexity ``exp(loss)``), ``acc`` next-token accuracy, ``n`` the
    number of tokens (:func:`modeconn.path.evaluate.evaluate_model`); for a TensorDataset with (N, T) labels
    the batch is capped at :data:`EVAL_TOKENS_PER_BATCH` tokens so the (B, T, V) logits stay small.

    Returns:
        ``{"loss": float, "acc": float, "n": int}``.

    Raises:
        ConfigError: empty data.
    """
    tensors = _tensors_of(dataset_or_loader)
    if tensors is not None and tensors[1].ndim == 2 and tensors[1].shape[1] > 0:  # (N, T) token labels
        batch_size = max(1, min(batch_size, EVAL_TOKENS_PER_BATCH // tensors[1].shape[1]))
    batches = _batches(dataset_or_loader, batch_size, generator=None, drop_last=False, device=_model_device(model))
    return evaluate_model(model, batches)


# ---------------------------------------------------------------------------------------------- training


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return contextlib.nullcontext(None)
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="step", desc="train", leave=False, dynamic_ncols=True)


def _seed_global_rng(seed: int, cuda_index: int | None) -> None:
    """Seed the (forked) global CPU RNG and, on CUDA, the device's RNG with ``seed``."""
    torch.default_generator.manual_seed(seed)
    if cuda_index is not None:
        with torch.cuda.device(cuda_index):
            torch.cuda.manual_seed(seed)


def _train_epoch(model: nn.Module, train_set: Any, config: TrainConfig, optimizer: torch.optim.Optimizer,
                 scheduler: Any, data_gen: torch.Generator, device: torch.device, bar: Any,
                 epoch: int) -> dict[str, Any]:
    """One training epoch of :func:`fit` (train mode, one device sync at the end).

    Returns ``train_loss`` / ``train_acc`` (per target), ``lr`` (of the last step), ``seconds``, ``seen``
    (examples), ``targets`` (examples, or tokens for sequence outputs) and ``sequence``.

    Raises: NonFiniteError (the epoch's training loss is NaN/Inf).
    """
    model.train()
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    seen = 0  # examples
    targets = 0  # predictions scored: examples, or tokens for sequence outputs
    sequence = False
    lr = optimizer.param_groups[0]["lr"]
    t0 = time.perf_counter()
    batches = _batches(train_set, config.batch_size, generator=data_gen, drop_last=config.drop_last, device=device)
    for xb, yb in batches:
        out, yt = flatten_sequence_logits(model(xb), yb)
        loss = F.cross_entropy(out, yt, label_smoothing=config.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        sequence = sequence or yb.ndim > 1
        seen += yb.shape[0]
        targets += yt.shape[0]
        loss_sum += loss.detach() * yt.shape[0]
        correct += (out.detach().argmax(dim=1) == yt).sum()
        if bar is not None:
            bar.update(1)
    train_loss = loss_sum.item() / targets  # one device sync per epoch
    train_acc = correct.item() / targets
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    if not math.isfinite(train_loss):
        raise NonFiniteError(
            f"fit: training loss is {train_loss} in epoch {epoch} (lr={lr:g}); lower the LR or enable grad_clip"
        )
    return {"train_loss": train_loss, "train_acc": train_acc, "lr": lr, "seconds": seconds, "seen": seen,
            "targets": targets, "sequence": sequence}


def _epoch_record(epoch: int, steps: int, stats: Mapping[str, Any]) -> dict[str, Any]:
    """The per-epoch dict of :func:`fit` from :func:`_train_epoch`'s stats (validation fields None)."""
    seconds, targets = stats["seconds"], stats["targets"]
    record: dict[str, Any] = {
        "epoch": epoch,
        "steps": steps,
        "train_loss": stats["train_loss"],
        "train_acc": stats["train_acc"],
        "val_loss": None,
        "val_acc": None,
        "lr": stats["lr"],
        "seconds": seconds,
        "samples_per_second": stats["seen"] / seconds if seconds > 0 else float("inf"),
    }
    if stats["sequence"]:  # sequence outputs: per-token metrics
        record["tokens"] = targets
        record["tokens_per_second"] = targets / seconds if seconds > 0 else float("inf")
    return record


def _show_epoch(bar: Any, record: Mapping[str, Any]) -> None:
    """The progress bar's postfix after an epoch (loss, accuracy, validation accuracy when evaluated)."""
    post = {"loss": f"{record['train_loss']:.4f}", "acc": f"{record['train_acc']:.3f}"}
    if record["val_acc"] is not None:
        post["val_acc"] = f"{record['val_acc']:.3f}"
    bar.set_postfix(post, refresh=True)


def fit(
    model: nn.Module,
    train_set: Any,
    config: TrainConfig | Mapping[str, Any] | None = None,
    *,
    val_set: Any = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Train ``model`` in place with cross-entropy on ``train_set``; returns per-epoch metrics.

    The model is moved to ``config.device`` and trained in train mode; afterwards it is left in the training
    mode it had before the call. The LR follows :func:`lr_factor` per step (linear warm-up over
    ``warmup_epochs``, then cosine/linear decay or constant).

    Args:
        model: maps (N, ...) inputs to (N, K) logits, or (N, T) token ids to (N, T, V) next-token logits
            with (N, T) labels (a language model: the loss is the mean cross-entropy over all N·T tokens).
        train_set: TensorDataset(x, y) (fast path: shuffled by index, no DataLoader), or a map-style Dataset
            of (x, y) pairs (wrapped in a seeded DataLoader). Labels are class indices (cast to int64).
        config: a :class:`TrainConfig` or a dict of its fields.
        val_set: optional held-out data evaluated with :func:`evaluate`.
        progress: show a tqdm progress bar over steps.

    Returns:
        One dict per epoch: ``epoch`` (1-based), ``steps``, ``train_loss`` / ``train_acc`` (mean over the
        epoch's batches in train mode, as seen during training), ``val_loss`` / ``val_acc`` (None when not
        evaluated), ``lr`` (LR of the epoch's last step), ``seconds`` (training wall time of the epoch,
        evaluation excluded) and ``samples_per_second``. For language models ``train_loss`` / ``train_acc`` are
        per token (weighted by token count) and the dict also has ``tokens`` (targets seen in the epoch) and
        ``tokens_per_second``.

    Raises:
        ConfigError: bad config (typo, value) or an empty training set.
        NonFiniteError: the training loss became NaN/Inf (the epoch is named).
    """
    config = TrainConfig.from_any(config)
    n = _num_examples(train_set)
    steps_per_epoch = config.steps_per_epoch(n)
    if steps_per_epoch == 0:
        raise ConfigError(f"fit: {n} training examples give no step with batch_size={config.batch_size}")
    device = torch.device(config.device)
    model.to(device)
    optimizer = make_optimizer(model, config)
    scheduler = make_scheduler(optimizer, config, steps_per_epoch)
    data_gen = torch.Generator().manual_seed(config.seed)
    was_training = model.training
    history: list[dict[str, Any]] = []
    cuda_index = None
    if device.type == "cuda":
        cuda_index = device.index if device.index is not None else torch.cuda.current_device()
    rng_devices = [cuda_index] if cuda_index is not None else []
    total_steps = config.epochs * steps_per_epoch

    try:
        with torch.random.fork_rng(devices=rng_devices), _progress_bar(total_steps, progress) as bar:
            _seed_global_rng(config.seed, cuda_index)
            for epoch in range(1, config.epochs + 1):
                stats = _train_epoch(model, train_set, config, optimizer, scheduler, data_gen, device, bar, epoch)
                record = _epoch_record(epoch, epoch * steps_per_epoch, stats)
                if val_set is not None and (config.eval_every_epoch or epoch == config.epochs):
                    val = evaluate(model, val_set, batch_size=max(config.batch_size, 1024))
                    record["val_loss"], record["val_acc"] = val["loss"], val["acc"]
                history.append(record)
                if bar is not None:
                    _show_epoch(bar, record)
    finally:
        model.train(was_training)
    return history


def train_checkpoint(
    architecture: str,
    model_kwargs: Mapping[str, Any],
    train_set: Any,
    config: TrainConfig | Mapping[str, Any] | None,
    out_dir: str | os.PathLike,
    *,
    val_set: Any = None,
    test_set: Any = None,
    extra_config: Mapping[str, Any] | None = None,
    extra_json: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Build ``architecture`` with ``seed=config.seed``, :func:`fit` it, evaluate it and save a checkpoint.

    All inputs (config, model kwargs, ``extra_config`` JSON-serialisability, the output directory) are
    validated before training starts. ``config.json`` gets ``training`` (the TrainConfig fields) and the
    entries of ``extra_config`` (e.g. ``{"dataset": "mnist"}``); ``metrics.json`` gets ``history`` (per-epoch
    dicts from :func:`fit`), ``final`` (the last epoch's dict), and ``val`` / ``test`` (``{"loss", "acc", "n"}``)
    when those sets are given; for language models these also hold ``"ppl"`` = ``exp(loss)`` (perplexity per
    token). ``extra_json`` maps further ``*.json`` file names to JSON payloads written into the checkpoint
    (e.g. ``{"tokenizer.json": json.loads(bundle.tokenizer_json())}``), see :func:`modeconn.io.save_checkpoint`.

    Returns:
        The checkpoint directory (loadable with :func:`modeconn.io.load_checkpoint`).

    Raises:
        ConfigError: bad config, architecture, kwargs or extra_config.
        CheckpointError: ``out_dir`` exists and is not empty (without ``overwrite``), or writing fails.
    """
    config = TrainConfig.from_any(config)
    validate_model_kwargs(architecture, dict(model_kwargs))
    if extra_config is not None and "training" in extra_config:
        raise ConfigError("train_checkpoint: extra_config must not contain 'training' (it is filled from config)")
    extra = {"training": config.model_dump(mode="json"), **dict(extra_config or {})}
    to_json(extra, "extra_config", nan="null")
    for name, payload in (extra_json or {}).items():
        if not isinstance(name, str) or Path(name).name != name or not name.endswith(".json"):
            raise ConfigError(f"train_checkpoint: extra_json file name {name!r} must be a plain *.json name")
        to_json(payload, name, nan="null")
    out_dir = Path(out_dir)
    _check_target(out_dir, overwrite)

    model = build_model(architecture, seed=config.seed, **model_kwargs)
    history = fit(model, train_set, config, val_set=val_set, progress=progress)
    metrics: dict[str, Any] = {"history": history, "final": history[-1]}
    sequence = "tokens" in history[-1]
    for split, data in (("val", val_set), ("test", test_set)):
        if data is not None:
            metrics[split] = evaluate(model, data)
            if sequence:
                metrics[split]["ppl"] = _perplexity(metrics[split]["loss"])
    return save_checkpoint(out_dir, model.cpu(), config=extra, metrics=metrics, extra_json=extra_json,
                           overwrite=overwrite)


def _perplexity(loss: float) -> float:
    """``exp(loss)`` for a loss in nats per token (inf when it overflows)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")
