"""Loading the two endpoints and the data of a data-driven recipe (barrier, path), per checkpoint kind.

* modeconn checkpoints: the recorded (or named) dataset.
* Hugging Face causal LMs (``…ForCausalLM`` directories): a text dataset (``--dataset austen``) tokenized with the
  checkpoint's own ``tokenizer.json`` (encoded line by line, as modeconn's text data always is; both endpoints see
  the same tokens), in blocks of ``min(128, max_position_embeddings)`` tokens; each model is wrapped as a
  :class:`~modeconn.models.causal_lm.CausalLM` (token ids → next-token logits). Loss is per token, in nats.
"""

from __future__ import annotations

from pathlib import Path

from ..checkpoints import open_checkpoints
from ..errors import ConfigError
from .align import dataset_for


def load_pair_and_data(a: Path, b: Path, command: str, dataset: str | None, data: Path | None,
                       limit_train: int | None):
    """``(model A, model B, A's config, dataset bundle)`` for ``command``; ConfigError for checkpoints of a kind
    ``command`` cannot evaluate or of two architectures, and when no (fitting) dataset is named or recorded;
    DataError for a Hugging Face checkpoint without ``tokenizer.json``."""
    ckpts = open_checkpoints([a, b])
    load = _BY_KIND.get(ckpts[0].kind.name)
    if load is None:
        raise ConfigError(f"{command} evaluates modeconn checkpoints or Hugging Face causal LMs; {ckpts[0].describe()} "
                          "is neither")
    return load(ckpts, command, dataset, data, limit_train)


def _modeconn(ckpts, command, dataset, data, limit_train):
    from ..experiments.checkpoints import load_same_architecture

    (ma, mb), (cfg, _) = load_same_architecture([c.path for c in ckpts])
    return ma, mb, cfg, dataset_for(cfg, dataset, data, limit_train)


def _hf_causal_lm(ckpts, command, dataset, data, limit_train):
    from ..data import TEXT_DATASETS, load_dataset, load_tokenizer
    from ..models.causal_lm import CausalLM
    from ..symmetry import check_same_config

    if dataset not in TEXT_DATASETS:
        raise ConfigError(f"{command} evaluates modeconn checkpoints (on their recorded dataset) or Hugging Face causal "
                          f"LMs on a text dataset: pass --dataset {' or '.join(TEXT_DATASETS.names())} (got {dataset!r})")
    archs = [(c.config.get("architectures") or ["?"])[0] for c in ckpts]
    if not all(str(x).endswith("ForCausalLM") for x in archs):
        raise ConfigError(f"{command} on Hugging Face checkpoints needs causal LMs (…ForCausalLM); got {archs}")
    tokenizer = load_tokenizer(ckpts[0].path)  # DataError naming the file when it is missing
    ma, mb = (c.load().float() for c in ckpts)
    check_same_config(ma, mb)
    context = min(128, int(getattr(ma.config, "max_position_embeddings", None) or 128))
    bundle = load_dataset(dataset, data, limit_train=limit_train, tokenizer=tokenizer, context_length=context)
    if bundle.num_classes > ma.config.vocab_size:
        raise ConfigError(f"{ckpts[0].path / 'tokenizer.json'} has {bundle.num_classes} tokens, the model's "
                          f"vocab_size is {ma.config.vocab_size}")
    return CausalLM.wrap(ma, context), CausalLM.wrap(mb, context), dict(ckpts[0].config), bundle


_BY_KIND = {"modeconn": _modeconn, "huggingface": _hf_causal_lm}
