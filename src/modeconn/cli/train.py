"""``modeconn train``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import app, data_option, download_option, errors_exit, overwrite_option, parse_kv
from ._print import show


@app.command()
def train(
    out: Path = typer.Option(..., help="checkpoint directory to write"),
    model: str = typer.Option("mlp", help="architecture (modeconn list models)"),
    dataset: str = typer.Option("digits", help="a dataset (modeconn list datasets) or the PATH of your image folder"),
    data: Path | None = data_option(),
    download: bool = download_option(),
    model_arg: list[str] = typer.Option([], "--model-arg", "-m", help="architecture option key=value (e.g. -m "
                                        "width=512)"),
    dataset_arg: list[str] = typer.Option([], "--dataset-arg", help="text dataset option key=value (vocab_size, "
                                          "context_length, val_fraction, test_fraction)"),
    seed: int = typer.Option(0, help="seed of initialisation and data order"),
    epochs: int = typer.Option(10, min=1, help="training epochs"),
    lr: float = typer.Option(0.05, help="peak learning rate (LMs: try --optimizer adamw --lr 3e-3)"),
    batch_size: int = typer.Option(128, min=1, help="examples (text: blocks) per step"),
    optimizer: str = typer.Option("sgd", help="sgd or adamw"),
    weight_decay: float = typer.Option(5e-4, min=0.0, help="weight decay"),
    warmup_epochs: float = typer.Option(0.0, min=0.0, help="epochs of linear warm-up"),
    schedule: str = typer.Option("cosine", help="cosine, linear or constant"),
    grad_clip: float | None = typer.Option(None, min=0.0, help="clip the global gradient norm to this value"),
    limit_train: int | None = typer.Option(None, min=1, help="use only the first N training examples (blocks)"),
    device: str = typer.Option("cpu", help="torch device, e.g. cpu or cuda"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Train one model on a dataset and write a checkpoint directory.

    The directory holds config.json (architecture, kwargs, training config, dataset), model.safetensors and
    metrics.json (per-epoch history, validation and test metrics). On a text dataset (austen, with --model
    gpt-neox-tiny) losses are nats per token and the tokenizer is saved as tokenizer.json.
    """
    from ..recipes.train import train as run_train
    from ..train import TrainConfig

    with errors_exit(download):
        cfg = TrainConfig(seed=seed, epochs=epochs, lr=lr, batch_size=batch_size, optimizer=optimizer,
                          weight_decay=weight_decay, warmup_epochs=warmup_epochs, schedule=schedule,
                          grad_clip=grad_clip, device=device)
        show(run_train(out, model, dataset, cfg, data=data, model_kwargs=parse_kv(model_arg, "--model-arg"),
                           dataset_options=parse_kv(dataset_arg, "--dataset-arg"), limit_train=limit_train,
                           overwrite=overwrite))
