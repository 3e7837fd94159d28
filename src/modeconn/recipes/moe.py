"""Recipe ``moe``: dense Hugging Face causal LMs of one family → one Mixture-of-Experts checkpoint
(:func:`modeconn.dense_to_moe`), with every model's router data read from ``--dataset`` (one for all, or one per
model) through the first checkpoint's own tokenizer. Checks the output target, the family, the configs and the
stored tensor names before any data is read, and the checkpoints before any weights."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from .._util.outdir import check_output_target
from ..checkpoints import open_checkpoints
from ..data import user_data_path
from ..errors import ConfigError
from .outcome import Outcome


def moe(models: Sequence[Path], out: Path, *, datasets: Sequence[str], data: Path | None = None,
        limit_train: int | None = None, top_k: int | None = None, router_steps: int = 0, shared_steps: int = 0,
        align: str = "full", seed: int = 0, overwrite: bool = False, log: Callable[[str], None] = print) -> Outcome:
    """Build the MoE of ``models`` at ``out``; ``datasets``: one registered text dataset or corpus path for all
    models, or one per model (its training split, ``limit_train`` blocks). Raises ConfigError (no dataset, a count
    other than 1 or N, a family without an MoE counterpart, configs that differ — ``tie_word_embeddings`` included —,
    ``out`` an input) or StateDictMismatchError (a tensor stored in one model only) before any data or weights are
    read."""
    from ..io.safe import read_json_object
    from ..moe import dense_to_moe, moe_config
    from ..symmetry.hf.directory import check_same_hf_checkpoints
    from .pair import hf_text_data

    paths = [Path(m) for m in models]
    if not datasets:
        raise ConfigError("moe initialises the router from data: pass --dataset (one for all models, or one per model)")
    if len(datasets) not in (1, len(paths)):
        raise ConfigError(f"--dataset: give one for all models or one per model ({len(paths)}), got {len(datasets)}")
    inputs = [*paths, *(p for d in datasets if (p := user_data_path(d)) is not None), *([data] if data else [])]
    check_output_target(out, inputs=inputs, overwrite=overwrite)
    if len(paths) < 2:
        raise ConfigError(f"moe needs at least two models, got {len(paths)}")
    ckpts = open_checkpoints(paths)
    if ckpts[0].kind.name != "huggingface":
        raise ConfigError(f"moe builds a Mixture-of-Experts from Hugging Face causal LM directories; "
                          f"{ckpts[0].describe()} is not one")
    moe_config(read_json_object(paths[0] / "config.json", "config file"), len(paths), top_k or min(2, len(paths)))
    check_same_hf_checkpoints(paths)  # configs (tie_word_embeddings …) and stored tensors, before the data is read
    blocks = [hf_text_data(ckpts, "moe", d, data, limit_train).train.tensors[0] for d in datasets]
    record = dense_to_moe(paths, out, data=blocks, top_k=top_k, router_steps=router_steps, shared_steps=shared_steps,
                          align=align, seed=seed, overwrite=overwrite, log=log)
    return Outcome(out, "config.json, model.safetensors, tokenizer files, moe.json",
                   (f"{record['moe_type']} of {len(paths)} experts (top-{record['top_k']})",), "MoE checkpoint")
