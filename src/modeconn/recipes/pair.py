"""Loading the two endpoints and the data of a data-driven recipe (barrier, path), per checkpoint kind.

* modeconn checkpoints: the recorded (or named) dataset, or the user's image folder.
* Hugging Face causal LMs (``…ForCausalLM`` directories): the user's corpus (``--dataset corpus.jsonl``, tokenized with
  the checkpoint's own tokenizer by :func:`modeconn.data.user_data_for_checkpoint`: tokenizer.json, SentencePiece or
  BPE files, blocks of ``--context-length`` or ``min(128, max_position_embeddings)`` tokens) or a text dataset
  (``--dataset austen``) tokenized with the checkpoint's own tokenizer (``tokenizer.json``, or the fast form of its
  SentencePiece / BPE files; encoded line by line, as modeconn's text data always is), in blocks of ``min(128,
  max_position_embeddings)`` tokens. Both endpoints see the same tokens; each model is wrapped as a
  :class:`~modeconn.models.causal_lm.CausalLM` (token ids → next-token logits). Loss is per token, in nats. The data
  is read and checked before any weights.
"""

from __future__ import annotations

from pathlib import Path

from ..checkpoints import CHECKPOINT_KINDS, open_checkpoints
from ..errors import ConfigError
from .align import dataset_for


def load_pair_and_data(a: Path, b: Path, command: str, dataset: str | None, data: Path | None,
                       limit_train: int | None):
    """``(model A, model B, A's config, dataset bundle)`` for ``command``; ConfigError for checkpoints of a kind
    ``command`` cannot evaluate or of two architectures, and when no (fitting) dataset is named or recorded;
    DataError for a Hugging Face checkpoint without ``tokenizer.json``."""
    ckpts = open_checkpoints([a, b])
    load = ckpts[0].kind.operation("pair")
    if load is None:
        raise ConfigError(f"{command} evaluates modeconn checkpoints or Hugging Face causal LMs; {ckpts[0].describe()} "
                          "is neither")
    return load(ckpts, command, dataset, data, limit_train)


def _modeconn(ckpts, command, dataset, data, limit_train):
    from ..io.models import load_same_architecture

    (ma, mb), (cfg, _) = load_same_architecture([c.path for c in ckpts])
    return ma, mb, cfg, dataset_for(cfg, dataset, data, limit_train)


def _hf_causal_lm(ckpts, command, dataset, data, limit_train):
    from ..data import TEXT_DATASETS, load_dataset, user_data_for_checkpoint, user_data_path
    from ..data.user_text import context_length_for, load_fast_tokenizer, max_positions
    from ..models.causal_lm import CausalLM
    from ..symmetry import check_same_config

    path = user_data_path(dataset)  # DataError for a path that does not exist
    if path is None and dataset not in TEXT_DATASETS:
        raise ConfigError(f"{command} evaluates modeconn checkpoints (on their recorded dataset) or Hugging Face causal "
                          f"LMs on a text dataset: pass --dataset {' or '.join(TEXT_DATASETS.names())} or the path of "
                          f"your corpus (got {dataset!r})")
    archs = [(c.config.get("architectures") or ["?"])[0] for c in ckpts]
    if not all(str(x).endswith("ForCausalLM") for x in archs):
        raise ConfigError(f"{command} on Hugging Face checkpoints needs causal LMs (…ForCausalLM); got {archs}")
    if path is not None:  # the user's corpus; the data is read and checked before any weights
        bundle = user_data_for_checkpoint(ckpts[0].path, ckpts[0].config, path, limit_train=limit_train)
    else:
        tokenizer = load_fast_tokenizer(ckpts[0].path)  # tokenizer.json, SentencePiece or BPE files; else DataError
        context = context_length_for(max_positions(ckpts[0].config), None)
        bundle = load_dataset(dataset, data, limit_train=limit_train, tokenizer=tokenizer, context_length=context)
    ma, mb = (c.load().float() for c in ckpts)
    check_same_config(ma, mb)
    if bundle.num_classes > ma.config.vocab_size:
        raise ConfigError(f"the tokenizer of {ckpts[0].path} has {bundle.num_classes} tokens, the model's "
                          f"vocab_size is {ma.config.vocab_size}")
    context = bundle.input_shape[0]
    return CausalLM.wrap(ma, context), CausalLM.wrap(mb, context), dict(ckpts[0].config), bundle


CHECKPOINT_KINDS["modeconn"].supports("pair", _modeconn)
CHECKPOINT_KINDS["huggingface"].supports("pair", _hf_causal_lm)


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
