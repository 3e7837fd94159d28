"""``modeconn align``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (DATASET_HELP, DATA_HELP, DEVICE_HELP, DOWNLOAD_HELP, MAX_ITER_HELP, METHOD_OPTION_HELP,
                   OVERWRITE_HELP, RESTARTS_HELP, app, console, context_length_option, errors_exit, label_field_option,
                   live_help, log, parse_kv, progress_bar, split_option, text_field_option, user_data)
from ._print import show


def _method_help() -> str:
    """The methods registered when help is shown (:func:`~._app.live_help`)."""
    from ..match.methods import ALIGNMENT_METHODS, command_line_methods

    entries = [ALIGNMENT_METHODS.get(m) for m in command_line_methods() + command_line_methods(continuous=True)]
    return ("alignment method: " + "; ".join(f"{m.name} — {m.summary}" for m in entries)
            + " (one-sided and dual: language models only; learned on language models: deprecated name of one-sided)")


def _model_help() -> str:
    from ..symmetry.hf.registry import ADAPTERS

    return ("checkpoint directory of the reference model A: a modeconn checkpoint, or a Hugging Face one of model type "
            + ", ".join(ADAPTERS))


@app.command(cls=live_help(method=_method_help))
def align(
    a: Path = typer.Argument(..., help=_model_help()),
    b: Path = typer.Argument(..., help="checkpoint directory of model B (to be permuted into A's basin)"),
    out: Path = typer.Option(..., help="checkpoint directory for the aligned B (plus alignment.json)"),
    method: str = typer.Option("weight", help=_method_help()),
    option: list[str] = typer.Option([], "--option", "-o", help=METHOD_OPTION_HELP),
    dataset: str | None = typer.Option(None, help="data for activation/learned matching: " + DATASET_HELP),
    split: str | None = split_option(),
    text_field: str = text_field_option(),
    label_field: str = label_field_option(),
    context_length: int | None = context_length_option(),
    data: Path | None = typer.Option(None, help=DATA_HELP),
    download: bool = typer.Option(False, help=DOWNLOAD_HELP),
    limit_train: int | None = typer.Option(None, min=1, help="methods that read data: the first N training examples"),
    seed: int | None = typer.Option(None, help="seed of the methods with random choices (weight, learned, dual, "
                                    "one-sided; default 0); activation matching has none"),
    steps: int | None = typer.Option(None, min=1, help="learned matching (learned, dual, one-sided): Adam steps "
                                     "(default 200; learned on vision models 300)"),
    lr: float | None = typer.Option(None, help="learned matching: Adam learning rate (default 0.01; learned on "
                                    "vision models 0.001)"),
    lambda_schedule: str | None = typer.Option(None, help="learned matching: λ per step: uniform (default), narrow "
                                               "or fixed"),
    lambda_value: float | None = typer.Option(None, help="learned matching: centre λ₀ ∈ [0, 1] of the narrow / fixed "
                                              "schedule (default 0.5)"),
    parameterization: str | None = typer.Option(None, help="language models (dual / one-sided): cayley (default), "
                                                "matrix_exp or unconstrained"),
    batch_size: int | None = typer.Option(None, min=1, help="language models (dual / one-sided): training blocks per "
                                          "learned-matching step (default 16)"),
    restarts: int | None = typer.Option(None, min=1, help=RESTARTS_HELP),
    max_iter: int | None = typer.Option(None, min=1, help=MAX_ITER_HELP),
    groups: str = typer.Option("permutation", help="Hugging Face directories: permutation (the permutation groups; "
                               "B's layout) or full (both absorbed tensor by tensor, orthogonal residual, head "
                               "permutations with per-head orthogonal QK/OV, FFN permutations; writes a/ and b/)"),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
    device: str | None = typer.Option(None, help=DEVICE_HELP),
    shard: bool = typer.Option(False, help="language models (dual / one-sided) under torchrun: shard endpoints, "
                               "transforms and Adam state over the processes (FSDP2 / DTensor) instead of a whole copy "
                               "per process"),
) -> None:
    """Align B to A and write the aligned B as a checkpoint directory.

    The aligned B computes the same function as B (checked on an input batch); alignment.json records
    the group element, objective and timings.

    Hugging Face checkpoint directories (config.json with model_type; model.safetensors or shards with
    model.safetensors.index.json) of a supported family (Llama, Mistral, Qwen, Gemma, Phi, OLMo, Falcon, BLOOM, GPT-NeoX …;
    the docs' Transformers guide lists them): streaming weight matching (--method weight only)
    that reads one tensor at a time, so models larger than memory work; permutation groups (residual, per-head
    q·k and v·o, FFN), no normalization absorption. --out gets B's layout (same shard files and index), B's
    config.json and other side files, and alignment.json. Try --max-iter 2 on large models
    (benchmarks/bench_stream_wm.py).

    Language models — modeconn's gpt-neox-tiny checkpoints, and Hugging Face causal LMs of a family with
    normalization absorption (GPT-NeoX/Pythia, GPT-2, Llama-style; text from --dataset tokenized with the
    checkpoint's own tokenizer) — with --method dual (LMC-DM, docs/methods.md §3) or one-sided: both models are
    absorbed (normalizations folded), the full group is bound (orthogonal residual, head permutation, per-head
    invertible QK / OV, FFN permutation), weight matching gives the discrete parts and the start, and the
    continuous transforms are learned on the training split. --out then holds a/ and b/ (the transformed
    endpoints), transforms.safetensors and alignment.json. Hugging Face RMSNorm families (Llama, Mistral, Qwen …)
    are written as stock checkpoints that from_pretrained loads (unit norm weights, the source's tokenizer);
    LayerNorm families and modeconn's LMs as absorbed checkpoints (modeconn.symmetry.load_absorbed; stock
    transformers refuses them). alignment.json's "formats" says which.
    Multi-process: `torchrun --standalone --nproc_per_node N -m modeconn align ...` splits every batch over the N
    processes (--batch-size ≥ N; NCCL on cuda:LOCAL_RANK where CUDA is available, else gloo); rank 0 alone writes
    --out and prints. --shard also splits the endpoints' tensors, the transforms and Adam's state over the processes
    (each holds about 1/N; docs/results/dual-memory/report.md has the memory model).

    Every option given is used by the chosen method on the checkpoints' kind, or refused naming it and why. Any
    setting of the method's config class is given with -o key=value (streaming weight matching of Hugging Face
    directories takes every WeightMatchingConfig field, e.g. -o restart_rtol=0 -o chunk=65536).
    """
    from ..recipes.align import AlignOptions, align as run_align

    opts = AlignOptions(method=method, dataset=dataset, data=data, download=download, limit_train=limit_train, seed=seed,
                        steps=steps, lr=lr, lambda_schedule=lambda_schedule, lambda_value=lambda_value,
                        parameterization=parameterization, batch_size=batch_size, restarts=restarts,
                        max_iter=max_iter, groups=groups, overwrite=overwrite, device=device, shard=shard,
                        options=parse_kv(option, "--option"))
    with errors_exit(download), user_data(dataset, split, text_field, context_length, seed, label_field), progress_bar() as progress:
        outcome = run_align(a, b, out, opts, progress=progress, log=log,
                                note=lambda s: console.print(f"[yellow]{s}[/]"))
    show(outcome)
