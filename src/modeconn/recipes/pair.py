"""Loading the two endpoints and the data of a data-driven recipe (barrier, path), per checkpoint kind.

* kinds loaded in memory (modeconn, timm, torchvision …): the data the kind is fed (modeconn: the recorded or named
  dataset, or the user's image folder; the others: the named one), through the kind's hooks.
* Hugging Face (and absorbed) causal LMs (``…ForCausalLM`` directories): the user's corpus (``--dataset
  corpus.jsonl``, tokenized with the checkpoint's own tokenizer by :func:`modeconn.data.user_data_for_checkpoint`:
  tokenizer.json, SentencePiece or BPE files, blocks of ``--context-length`` or ``min(128, max_position_embeddings)``
  tokens) or a text dataset (``--dataset austen``) tokenized with the checkpoint's own tokenizer (``tokenizer.json``, or
  the fast form of its SentencePiece / BPE files; encoded line by line, as modeconn's text data always is), in blocks
  of ``min(128, max_position_embeddings)`` tokens (:func:`hf_text_data`). Both endpoints see the same tokens; each
  model is wrapped as a :class:`~modeconn.models.causal_lm.CausalLM` (token ids → next-token logits). Loss is per
  token, in nats. The data is read and checked before any weights.
"""

from __future__ import annotations

from pathlib import Path

from ..checkpoints import CHECKPOINT_KINDS, open_checkpoints, refuse_kind, register_in_memory
from ..errors import ConfigError


def load_pair_and_data(a: Path, b: Path, command: str, dataset: str | None, data: Path | None,
                       limit_train: int | None):
    """``(model A, model B, A's config, dataset bundle)`` for ``command``; ConfigError for checkpoints of a kind
    ``command`` cannot evaluate or of two architectures, and when no (fitting) dataset is named or recorded;
    DataError for a Hugging Face checkpoint without ``tokenizer.json``."""
    ckpts = open_checkpoints([a, b])
    load = ckpts[0].kind.operation("pair")
    if load is None:
        raise refuse_kind(command, "pair", ckpts[0])
    return load(ckpts, command, dataset, data, limit_train)


def _in_memory(ckpts, command, dataset, data, limit_train):
    from ..checkpoints import load_same_architecture

    ma, mb = load_same_architecture(ckpts)
    return ma, mb, ckpts[0].config, ckpts[0].feed(dataset, data, limit_train)


def _hugging_face(ckpts, command, dataset, data, limit_train):
    """Hugging Face causal LMs (text) or image classifiers (an image folder), in memory
    (:func:`~.hf_memory.load_models`)."""
    from .hf_memory import load_models

    (ma, mb), bundle = load_models(ckpts, command, dataset, data, limit_train)
    return ma, mb, dict(ckpts[0].config), bundle


def hf_text_data(ckpts, command: str, dataset: str | None, data, limit_train):
    """The text of ``dataset`` for causal LMs, read and checked before any weights (module docstring): the user's
    corpus (a path) or a registered text dataset, tokenized with the first checkpoint's own tokenizer. ConfigError for
    another dataset or a checkpoint that is not a causal LM; DataError for a path that does not exist, a tokenizer
    that cannot be read, or bad data (:mod:`modeconn.data`)."""
    archs = [(c.config.get("architectures") or ["?"])[0] for c in ckpts]
    if not all(str(x).endswith("ForCausalLM") for x in archs):
        raise ConfigError(f"{command} on Hugging Face checkpoints needs causal LMs (…ForCausalLM); got {archs}")
    return text_blocks(ckpts, command, dataset, data, limit_train)


def text_blocks(ckpts, command: str, dataset: str | None, data, limit_train):
    """Blocks of the user's corpus or a registered text dataset, tokenized with the first checkpoint's own tokenizer
    (:func:`hf_text_data`, without its causal-LM check); the block length is the current user-data options'
    ``context_length``, else ``min(128, max_position_embeddings)``."""
    from ..data import TEXT_DATASETS, load_dataset, user_data_for_checkpoint, user_data_path
    from ..data.user_options import current_user_data_options
    from ..data.user_text import context_length_for, load_fast_tokenizer, max_positions

    path = user_data_path(dataset)  # DataError for a path that does not exist
    if path is None and dataset not in TEXT_DATASETS:
        raise ConfigError(f"{command} evaluates modeconn checkpoints (on their recorded dataset) or Hugging Face "
                          f"language models on a text dataset: pass --dataset {' or '.join(TEXT_DATASETS.names())} or "
                          f"the path of your corpus (got {dataset!r})")
    if path is not None:
        return user_data_for_checkpoint(ckpts[0].path, ckpts[0].config, path, limit_train=limit_train)
    tokenizer = load_fast_tokenizer(ckpts[0].path)  # tokenizer.json, SentencePiece or BPE files; else DataError
    context = context_length_for(max_positions(ckpts[0].config), current_user_data_options().context_length)
    return load_dataset(dataset, data, limit_train=limit_train, tokenizer=tokenizer, context_length=context)


def check_vocabulary(ckpt, model, bundle) -> None:
    """ConfigError when the tokenizer that made ``bundle`` numbers more tokens than ``model``'s vocabulary holds."""
    if bundle.num_classes > model.config.vocab_size:
        raise ConfigError(f"the tokenizer of {ckpt.path} has {bundle.num_classes} tokens, the model's "
                          f"vocab_size is {model.config.vocab_size}")


CHECKPOINT_KINDS["modeconn"].supports("pair", _in_memory)
CHECKPOINT_KINDS["huggingface"].supports("pair", _hugging_face)
CHECKPOINT_KINDS["absorbed"].supports("pair", _hugging_face)  # e.g. dual-matched LayerNorm-family endpoints
register_in_memory("pair", _in_memory)


def config_has_batchnorm(config: dict) -> bool:
    """True if the architecture recorded in a modeconn checkpoint's ``config`` has BatchNorm layers (built on the meta
    device: nothing allocated, no weights read)."""
    import torch

    from ..models import build_model
    from ..nn_utils import batchnorm_modules

    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        return bool(batchnorm_modules(build_model(config["architecture"], **config.get("kwargs", {}))))


def check_pair_options(model, bundle, *, bn: str = "reset") -> None:
    """ConfigError, before any work, for a ``--bn`` given where it does nothing for ``model`` (an endpoint as loaded;
    ``bundle``: its data): a BatchNorm policy other than the default (reset) on a model without BatchNorm layers, REPAIR
    on a model without REPAIR points (Hugging Face causal LMs). (``--seed`` applies everywhere: a run that makes no
    random choice gives its one result for any seed.)"""
    from ..nn_utils import batchnorm_modules
    from ..symmetry import symmetry_spec

    has_bn = bool(batchnorm_modules(model))
    if bn == "repair" and not symmetry_spec(model, bundle.train.tensors[0][:2]).repair_points:
        raise ConfigError("--bn repair does not apply to these models: REPAIR corrects the statistics of units after "
                          "their layers, and this model's spec has none to correct (no REPAIR points); leave it out")
    if bn not in ("reset", "repair") and not has_bn:
        raise ConfigError(f"--bn {bn} does not apply to these models: they have no BatchNorm layers, and the policies "
                          "reset, interpolate and keep differ only in BatchNorm statistics; leave it out")
