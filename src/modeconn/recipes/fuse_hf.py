"""``fuse`` on Hugging Face causal LMs of one family whose FFN width (``intermediate_size``) differs.

Every layer's FFN units of A (``m``) and B (``n``) are paired by the correlation of their activations on text (a
partial assignment, :func:`modeconn.match.width.width_matching`), both models keep ``k`` paired units per layer
(default ``min(m, n)``), B's residual stream and attention heads are aligned to A's by weight matching on the reduced
models, and the two are averaged (:func:`modeconn.path.width.merge_widths`). The output is a stock checkpoint of the
family with ``intermediate_size = k`` (``from_pretrained`` loads it) and A's tokenizer files.

Only the FFN width changes: the residual width (read and written by every layer, carried by the embeddings and the
tied output head), head counts and sizes, depth and vocabulary must agree, and Mixture-of-Experts models are refused;
the refusal names the dimension, before any weights are read. So must every other config field (``tie_word_embeddings``
included: a tied head and an untied one cannot be paired) and the names of the stored tensors; a difference is named
with both files.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..checkpoints import Checkpoint
from ..errors import ConfigError
from .outcome import Outcome

FFN_WIDTH_KEYS = {"gptj": "n_inner", "opt": "ffn_dim"}
"""``model_type`` → the config field of its FFN width where it is not ``intermediate_size``."""
DEFAULT_FFN_WIDTH_KEY = "intermediate_size"

_RESIDUAL = "the residual width (every layer reads and writes it; the embeddings and the tied output head carry it)"
FIXED_DIMENSIONS = {
    "hidden_size": _RESIDUAL, "n_embd": _RESIDUAL, "d_model": _RESIDUAL,
    "num_attention_heads": "the number of attention heads", "n_head": "the number of attention heads",
    "num_key_value_heads": "the number of key/value heads", "head_dim": "the width of an attention head",
    "num_hidden_layers": "the depth", "n_layer": "the depth", "vocab_size": "the vocabulary",
}
"""Config fields fuse cannot change, with what they are."""
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
"""Config fields that make a Mixture-of-Experts model."""


def ffn_width(config: Mapping[str, Any]) -> tuple[str, int]:
    """``(field, width)``: the config field of the FFN width and its value (GPT-J's ``n_inner = None``: 4× the
    residual width). ConfigError for a Mixture-of-Experts config or one without the field."""
    model_type = config.get("model_type", "?")
    moe = [k for k in MOE_KEYS if config.get(k)]
    if moe:
        raise ConfigError(f"{model_type} is a Mixture-of-Experts model ({moe[0]} = {config[moe[0]]}): fuse changes "
                          "the width of dense FFNs; the number and width of experts cannot change")
    key = FFN_WIDTH_KEYS.get(model_type, DEFAULT_FFN_WIDTH_KEY)
    if key not in config:
        raise ConfigError(f"{model_type} has no {key!r} in its config: fuse changes the FFN width of Hugging Face "
                          f"causal LMs that record it")
    value = config[key]
    return key, int(value if value is not None else 4 * config["n_embd"])


def fused_width(config_a: Mapping[str, Any], config_b: Mapping[str, Any], width: float | None) -> tuple[str, int]:
    """``(field, k)``: the FFN width field and the fused width (``width``, default the narrower model's).

    Raises ConfigError, naming the dimension, when A and B are of two families or differ in a field of
    :data:`FIXED_DIMENSIONS` (with what it is), for a Mixture-of-Experts model, or a ``width`` that is not a positive
    whole number. Every other field is compared by :func:`check_pair`."""
    (key, m), (_, n) = ffn_width(config_a), ffn_width(config_b)
    types = config_a.get("model_type"), config_b.get("model_type")
    if types[0] != types[1]:
        raise ConfigError(f"fuse changes the FFN width within one model family; A is {types[0]!r}, B is {types[1]!r}")
    fixed = [f"{k} ({FIXED_DIMENSIONS[k]}: {config_a.get(k)} vs {config_b.get(k)})" for k in FIXED_DIMENSIONS
             if config_a.get(k) != config_b.get(k)]
    if fixed:
        raise ConfigError(f"fuse changes only the FFN width ({key}) of one model family; A and B also differ in "
                          + "; ".join(fixed) + ": that dimension cannot change")
    if width is not None and (width != int(width) or width < 1):
        raise ConfigError(f"--width of a Hugging Face model is its FFN width ({key}), a whole number ≥ 1; got {width}")
    return key, int(width) if width is not None else min(m, n)


def check_pair(ckpts: list[Checkpoint], width: float | None) -> tuple[str, int]:
    """:func:`fused_width`, then every other config field (``tie_word_embeddings`` included, defaults resolved) and
    the stored tensor names of A and B compared, naming both files
    (:func:`~modeconn.symmetry.hf.directory.check_same_hf_checkpoints`): all before any data or weights are read."""
    from ..symmetry.hf.directory import check_same_hf_checkpoints

    key, k = fused_width(ckpts[0].config, ckpts[1].config, width)
    check_same_hf_checkpoints([c.path for c in ckpts], free=(key,))
    return key, k


def fuse_hf(ckpts: list[Checkpoint], out: Path, opts, log: Callable[[str], None]) -> Outcome:
    """Fuse two Hugging Face causal LMs into FFN width ``opts.width`` (module docstring) with activations on
    ``opts.dataset`` (text, tokenized with A's tokenizer; ``opts.batches`` batches of 8 blocks) and write the stock
    checkpoint with ``fuse.json`` (widths, dataset, held-out scores, mean matched correlation per layer)."""
    from ..data import make_loader
    from ..experiments.output import output_directory
    from ..path.width import merge_widths
    from .hf_memory import check_fits_in_memory, hf_model, load_wrapped, read_data, rewrap, save_wrapped, score_merged

    key, k = check_pair(ckpts, opts.width)
    if opts.dataset is None:
        raise ConfigError("fuse pairs the FFN units of Hugging Face models by their activations on text: pass "
                          "--dataset (a text dataset such as austen, or the path of your corpus)")
    bundle = read_data(ckpts, "fuse", opts.dataset, opts.data, opts.limit_train, tasks=("causal_lm",))
    check_fits_in_memory(ckpts, "fuse", None)
    a, b = load_wrapped(ckpts, bundle, same_config=False)
    config = copy.deepcopy(hf_model(a).config)
    setattr(config, key, k)
    target = rewrap(a, type(hf_model(a))(config).float())
    fused, alignment = merge_widths(a, b, make_loader(bundle.train, 8, shuffle=True, seed=0), target=target,
                                    max_batches=opts.batches)
    test, line = score_merged(fused, bundle)
    widths = [ffn_width(c.config)[1] for c in ckpts]
    record = {"fused_from": [str(c.path) for c in ckpts], "widths": widths, key: k, "dataset": bundle.name,
              "test": test, "mean_matched_correlation": alignment.correlation}
    with output_directory(out, opts.overwrite, inputs=[c.path for c in ckpts], command="fuse") as tmp:
        save_wrapped(tmp, fused, ckpts[0].path, {"fuse.json": record})
    log(f"fused {key} {widths[0]} + {widths[1]} → {k}")
    return Outcome(Path(out), "config.json, model.safetensors, tokenizer files, fuse.json", (line,),
                   "fused checkpoint")
