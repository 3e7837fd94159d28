"""``modeconn moe``."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import app, data_option, errors_exit, log, overwrite_option
from ._print import show


@app.command()
def moe(
    models: list[Path] = typer.Argument(..., help="two or more dense checkpoint directories of one family (Llama, "
                                        "Mistral, Qwen2); the first is the reference"),
    out: Path = typer.Option(..., help="checkpoint directory for the Mixture-of-Experts model"),
    dataset: list[str] = typer.Option([], help="text for the router: a dataset name or corpus path, once for all "
                                      "models or once per model (its own data)"),
    data: Path | None = data_option(),
    limit_train: int | None = typer.Option(None, min=1, help="the first N training blocks"),
    top_k: int | None = typer.Option(None, min=1, help="active experts per token (default min(2, N))"),
    router_steps: int = typer.Option(0, min=0, help="router-only training steps after the initialisation"),
    shared_steps: int = typer.Option(0, min=0, help="then steps training the router and the averaged parts "
                                     "(embeddings, attention, norms, head), the experts frozen"),
    align_method: str = typer.Option("full", "--align", help="align every model to the first: full (the full group "
                                     "where the family allows), weight (permutations), none"),
    seed: int = typer.Option(0, help="seed of the alignment and the trainings"),
    overwrite: bool = overwrite_option(),
) -> None:
    """Turn dense language models of one family into one Mixture-of-Experts model.

    Aligns every model to the first (weight matching, the full group where the family allows), averages the shared
    parts (embeddings, attention, norms, head), makes each model's FFN one expert (Llama, Mistral → Mixtral; Qwen2 →
    Qwen2-MoE) and initialises the router from each model's mean FFN input on its data; then, if asked, trains the
    router alone and the router with the averaged parts (experts frozen). Docs: the Merge guide.
    """
    from ..recipes.moe import moe as run_moe

    with errors_exit():
        outcome = run_moe(models, out, datasets=dataset, data=data, limit_train=limit_train, top_k=top_k,
                          router_steps=router_steps, shared_steps=shared_steps, align=align_method, seed=seed,
                          overwrite=overwrite, log=log)
    show(outcome)
