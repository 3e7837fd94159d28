"""Loading the two endpoints and the data of a data-driven recipe (barrier, path), per checkpoint kind.

* kinds loaded in memory (modeconn, timm, torchvision …): the data the kind is fed (modeconn: the recorded or named
  dataset; the others: the named one), through the kind's hooks.
* Hugging Face causal LMs (``…ForCausalLM`` directories): a text dataset (``--dataset austen``) tokenized with the
  checkpoint's own ``tokenizer.json`` (encoded line by line, as modeconn's text data always is; both endpoints see
  the same tokens), in blocks of ``min(128, max_position_embeddings)`` tokens; each model is wrapped as a
  :class:`~modeconn.models.causal_lm.CausalLM` (token ids → next-token logits). Loss is per token, in nats.
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


def _hf_causal_lm(ckpts, command, dataset, data, limit_train):
    from ..models.causal_lm import CausalLM
    from ..symmetry import check_same_config

    tokenizer = check_hf_text(ckpts, command, dataset)
    ma, mb = (c.load().float() for c in ckpts)
    check_same_config(ma, mb)
    context, bundle = hf_text_bundle(ckpts[0], ma, tokenizer, dataset, data, limit_train)
    return CausalLM.wrap(ma, context), CausalLM.wrap(mb, context), dict(ckpts[0].config), bundle


def check_hf_text(ckpts, command: str, dataset: str | None):
    """Before any weights are read: ConfigError unless ``dataset`` is a text dataset and every checkpoint a causal LM;
    DataError when the first has no tokenizer file. Returns its tokenizer."""
    from ..data import TEXT_DATASETS, load_tokenizer

    if dataset not in TEXT_DATASETS:
        raise ConfigError(f"{command} evaluates modeconn checkpoints (on their recorded dataset) or Hugging Face causal "
                          f"LMs on a text dataset: pass --dataset {' or '.join(TEXT_DATASETS.names())} (got {dataset!r})")
    archs = [(c.config.get("architectures") or ["?"])[0] for c in ckpts]
    if not all(str(x).endswith("ForCausalLM") for x in archs):
        raise ConfigError(f"{command} on Hugging Face checkpoints needs causal LMs (…ForCausalLM); got {archs}")
    return load_tokenizer(ckpts[0].path)  # DataError naming the file when it is missing


def hf_text_bundle(ckpt, model, tokenizer, dataset: str, data, limit_train):
    """``(context length, text bundle)``: ``dataset`` tokenized with ``tokenizer`` (``ckpt``'s own) in blocks of
    ``min(128, max_position_embeddings)`` tokens; ConfigError when it numbers more tokens than ``model``'s
    vocabulary."""
    from ..data import load_dataset

    context = min(128, int(getattr(model.config, "max_position_embeddings", None) or 128))
    bundle = load_dataset(dataset, data, limit_train=limit_train, tokenizer=tokenizer, context_length=context)
    if bundle.num_classes > model.config.vocab_size:
        raise ConfigError(f"{ckpt.path / 'tokenizer.json'} has {bundle.num_classes} tokens, the model's "
                          f"vocab_size is {model.config.vocab_size}")
    return context, bundle


CHECKPOINT_KINDS["modeconn"].supports("pair", _in_memory)
CHECKPOINT_KINDS["huggingface"].supports("pair", _hf_causal_lm)
CHECKPOINT_KINDS["absorbed"].supports("pair", _hf_causal_lm)  # e.g. dual-matched LayerNorm-family endpoints
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
