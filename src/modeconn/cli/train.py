"""``modeconn train``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import DATA_HELP, DOWNLOAD_HELP, OVERWRITE_HELP, app, errors_exit, parse_kv
from ._print import show


@app.command()
def train(
    out: Path = typer.Option(..., help="checkpoint directory to write (config.json + model.safetensors + metrics.json)"),
    model: str = typer.Option("mlp", help="architecture: mlp, vgg, resnet20, cnn, mobilenetv2, cct; "
                                          "gpt-neox-tiny (a causal LM, for text datasets)"),
    dataset: str = typer.Option("digits", help="dataset: digits, mnist, fashion-mnist, cifar10, cifar100; "
                                               "austen (text: next-token prediction); or the PATH of your image "
                                               "folder (one sub-folder per class; [0, 1] pixels at their own size; "
                                               "its absolute path is recorded, so later commands find it)"),
    data: Path | None = typer.Option(None, help=DATA_HELP),
    download: bool = typer.Option(False, help=DOWNLOAD_HELP),
    model_arg: list[str] = typer.Option([], "--model-arg", "-m", help="architecture option key=value, e.g. -m width=512 -m depth=3"),
    dataset_arg: list[str] = typer.Option(
        [], "--dataset-arg", help="text dataset option key=value: vocab_size (default 4096), context_length "
                                  "(default 128), val_fraction, test_fraction (default 0.05 each)"),
    seed: int = typer.Option(0, help="seed of initialisation and data order"),
    epochs: int = typer.Option(10, min=1),
    lr: float = typer.Option(0.05, help="peak learning rate (language models: try --optimizer adamw --lr 3e-3)"),
    batch_size: int = typer.Option(128, min=1, help="examples per step (text: blocks of context_length tokens)"),
    optimizer: str = typer.Option("sgd", help="sgd or adamw"),
    weight_decay: float = typer.Option(5e-4, min=0.0),
    warmup_epochs: float = typer.Option(0.0, min=0.0),
    schedule: str = typer.Option("cosine", help="cosine, linear or constant"),
    grad_clip: float | None = typer.Option(None, min=0.0, help="clip the global gradient norm to this value"),
    limit_train: int | None = typer.Option(None, min=1, help="use only the first N training examples (text: blocks)"),
    device: str = typer.Option("cpu", help="torch device, e.g. cpu or cuda"),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
) -> None:
    """Train one model on a dataset and write a checkpoint directory.

    The directory holds config.json (architecture, kwargs, training config, dataset), model.safetensors
    and metrics.json (per-epoch history, validation and test metrics). For a text dataset (austen) the
    model maps token blocks to next-token logits (e.g. --model gpt-neox-tiny); losses are nats per token,
    metrics.json also gives perplexity, config.json records dataset_options, and the tokenizer is saved as
    tokenizer.json (load it with tokenizers.Tokenizer.from_file to decode).
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
