"""Text for Hugging Face encoders, tokenized with the checkpoint's own tokenizer: masked-LM blocks and labelled
examples for sequence classifiers.

**Masked LM** (``…ForMaskedLM``): the text is cut into blocks as for causal LMs (:mod:`modeconn.data.user_text`, or a
registered text dataset's blocks) of ``T − s`` tokens, ``s`` the special tokens the tokenizer adds to one sequence
(BERT: ``[CLS] … [SEP]``, as the tokenizer adds them to a text), so that a block is ``T`` tokens.
:data:`MASK_FRACTION` of each block's non-special positions (at least one), drawn with the seed, are replaced by the
mask token; labels are the original ids there and ``-100`` elsewhere (Hugging Face's ignore index: never scored,
:func:`modeconn.nn_utils.flatten_sequence_logits`). The masks are fixed, so the loss is a deterministic function of
the weights and both endpoints (and every point between them) predict the same tokens: the loss is the masked-token
cross-entropy in nats per masked token.

**Sequence classification** (``…ForSequenceClassification``): each document is one example, encoded with the special
tokens, truncated to ``T`` tokens and padded with the pad token to the longest (the wrapper masks padding); its label is the
``--label-field`` value — a class index in ``[0, num_labels)`` or a name of the config's ``id2label``. ``T`` is
``--context-length`` or ``min(128, max_position_embeddings)``; how many documents were truncated is recorded in the
bundle's ``options``. The held-out part is the user's (``--split``) or a seeded share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from ..errors import ConfigError, DataError
from ..nn_utils import IGNORE_INDEX
from .bundle import DatasetBundle
from .corpus import read_corpus
from .text import TextBundle
from .user_options import UserDataOptions
from .user_text import context_length_for, limit_rows, split_heldout

#: Share of each block's non-special positions replaced by the mask token (BERT's 15 %).
MASK_FRACTION = 0.15


@dataclasses.dataclass(frozen=True)
class TextClassificationBundle(DatasetBundle):
    """Labelled texts: ``TensorDataset(input_ids (N, T) int64, labels (N,) int64)`` splits padded with
    ``pad_token_id`` (the tokenizer's; the classifier masks those positions out)."""

    pad_token_id: int = 0


def special_wrapping(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids ``tokenizer`` puts before and after one sequence (BERT: ``[CLS]`` and ``[SEP]``), read off the encoding
    of a probe text with and without special tokens.

    Raises:
        DataError: the two encodings do not differ by a prefix and a suffix.
    """
    probe = "modeconn probe text"
    bare = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            return full[:start], full[start + len(bare):]
    raise DataError(f"the checkpoint's tokenizer ({type(tokenizer).__name__}) changes a text's tokens when it adds "
                    "special tokens; modeconn cannot build masked-LM blocks with it")


def masked_blocks(inner: torch.Tensor, tokenizer: Any, generator: torch.Generator,
                  fraction: float = MASK_FRACTION) -> TensorDataset:
    """``TensorDataset(input_ids (N, T), labels (N, T))`` from blocks ``inner`` (N, T − s) of token ids: the special
    tokens added (:func:`special_wrapping`), then ``fraction`` of each block's text positions (at least one), drawn
    from ``generator``, replaced by the mask token; labels hold the original id at those positions and ``-100``
    elsewhere.

    Raises:
        DataError: the tokenizer has no mask token.
    """
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise DataError("the checkpoint's tokenizer has no mask token, so masked-LM blocks cannot be made")
    prefix, suffix = special_wrapping(tokenizer)
    n, width = inner.shape
    ids = torch.cat([torch.tensor([prefix] * n, dtype=torch.int64).reshape(n, len(prefix)), inner.long(),
                     torch.tensor([suffix] * n, dtype=torch.int64).reshape(n, len(suffix))], dim=1)
    inputs, labels = ids.clone(), torch.full_like(ids, IGNORE_INDEX)
    k = max(1, round(fraction * width))
    for i in range(n):
        chosen = len(prefix) + torch.randperm(width, generator=generator)[:k]
        labels[i, chosen] = ids[i, chosen]
        inputs[i, chosen] = int(mask_id)
    return TensorDataset(inputs, labels)


def masked_lm_bundle(bundle: TextBundle, tokenizer: Any, seed: int) -> TextBundle:
    """``bundle`` (next-token blocks of ``T − s`` tokens: :func:`masked_context`) as masked-LM blocks of ``T``
    tokens (:func:`masked_blocks`; train and held-out masks drawn from one generator seeded with ``seed``)."""
    gen = torch.Generator().manual_seed(int(seed))
    train = masked_blocks(bundle.train.tensors[0], tokenizer, gen)
    test = masked_blocks(bundle.test.tensors[0], tokenizer, gen)
    context = int(train.tensors[0].shape[1])
    options = {**bundle.options, "context_length": context, "masked_fraction": MASK_FRACTION, "mask_seed": int(seed)}
    return dataclasses.replace(bundle, name=f"{bundle.name}, masked LM ({MASK_FRACTION:.0%} of the tokens masked)",
                               train=train, val=test, test=test, input_shape=(context,), context_length=context,
                               options=options)


def masked_context(tokenizer: Any, max_positions: int | None, requested: int | None) -> int:
    """The length ``T − s`` of the text in a masked-LM block of ``T`` tokens (``T``: ``requested`` or
    ``min(128, max_positions)``, :func:`~modeconn.data.user_text.context_length_for`); ConfigError when no text
    would fit."""
    inner = context_length_for(max_positions, requested) - sum(map(len, special_wrapping(tokenizer)))
    if inner < 1:
        raise ConfigError(f"--context-length {requested} leaves no room for text beside the tokenizer's special tokens")
    return inner


def class_index(label: Any, config: Mapping[str, Any], num_labels: int, where: str) -> int:
    """A stored label as a class index: an int in ``[0, num_labels)`` or a name of ``config['id2label']`` (a string
    of digits is read as an index). DataError naming the label, ``where`` and the classes."""
    names = {str(v): int(k) for k, v in (config.get("id2label") or {}).items()}
    if isinstance(label, str) and label in names:
        return names[label]
    if isinstance(label, str) and label.strip().lstrip("-").isdigit():
        label = int(label)
    if isinstance(label, float) and label.is_integer():
        label = int(label)
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < num_labels:
        shown = ", ".join(f"{i}={n}" for n, i in sorted(names.items(), key=lambda t: t[1])) or f"0..{num_labels - 1}"
        raise DataError(f"{where}: label {label!r} is not one of the model's {num_labels} classes ({shown})")
    return label


def pad_token(tokenizer: Any, config: Mapping[str, Any], where: str) -> int:
    """The tokenizer's pad id; DataError when it has none or the model's config names another."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        raise DataError(f"{where}: the checkpoint's tokenizer has no pad token, so texts of different lengths cannot "
                        "be batched for its sequence classifier")
    if config.get("pad_token_id") not in (None, pad):
        raise DataError(f"{where}: the tokenizer pads with id {pad}, the model's config.json says pad_token_id = "
                        f"{config['pad_token_id']}")
    return int(pad)


def _examples(texts: Sequence[str], labels: Sequence[Any], tokenizer: Any, context: int, pad: int,
              config: Mapping[str, Any], num_labels: int, where: str) -> tuple[TensorDataset, int]:
    """``(TensorDataset(input_ids (N, T), labels (N,)), documents truncated)``."""
    encoded = tokenizer(list(texts), add_special_tokens=True)["input_ids"]
    truncated = sum(len(e) > context for e in encoded)
    ids = torch.full((len(encoded), context), int(pad), dtype=torch.int64)
    for i, e in enumerate(encoded):
        e = e[:context]
        ids[i, :len(e)] = torch.tensor(e, dtype=torch.int64)
    y = torch.tensor([class_index(v, config, num_labels, f"{where} row {i}") for i, v in enumerate(labels)],
                     dtype=torch.int64)
    return TensorDataset(ids, y), truncated


def _used_width(ds: TensorDataset, pad: int) -> int:
    """The last column of ``ds``'s ids that holds a token other than ``pad`` in some row, plus one."""
    used = (ds.tensors[0] != pad).any(dim=0).nonzero()
    return int(used.max()) + 1 if len(used) else 1


def text_classification_bundle(path: str | Path, tokenizer: Any, config: Mapping[str, Any], *,
                               options: UserDataOptions | None = None, limit_train: int | None = None
                               ) -> TextClassificationBundle:
    """The labelled corpus at ``path`` as ``TensorDataset(input_ids (N, T) int64, labels (N,) int64)`` splits for the
    sequence classifier whose ``config.json`` is ``config`` (module docstring); ``num_classes`` = its ``num_labels``.

    Raises:
        DataError: bad data (:func:`~modeconn.data.corpus.read_corpus` with the label field), a label that is not one
            of the model's classes, a tokenizer without a pad token, one document and no ``--split``.
        ConfigError: a context length beyond the model's positions.
    """
    opts = options or UserDataOptions()
    num_labels = int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)
    context = context_length_for(config.get("max_position_embeddings"), opts.context_length)
    corpus = read_corpus(path, text_field=opts.text_field, split=opts.split, label_field=opts.label_field)
    pad = pad_token(tokenizer, config, corpus.source)
    train, cut = _examples(corpus.train, corpus.train_labels, tokenizer, context, pad, config, num_labels,
                           corpus.source)
    if corpus.heldout is None:
        train, test = split_heldout(train, corpus.source, opts, "labelled text")
        heldout, cut_test = f"{opts.heldout_fraction:g} of the texts, seed {opts.seed}", 0
    else:
        test, cut_test = _examples(corpus.heldout, corpus.heldout_labels, tokenizer, context, pad, config, num_labels,
                                   str(corpus.heldout_source))
        heldout = str(corpus.heldout_source)
    width = max(_used_width(d, pad) for d in (train, test))
    train, test = (TensorDataset(d.tensors[0][:, :width], d.tensors[1]) for d in (train, test))
    train = limit_rows(train, limit_train)
    names = config.get("id2label") or {}
    classes = tuple(str(names.get(str(i), names.get(i, i))) for i in range(num_labels))
    return TextClassificationBundle(
        name=f"{Path(path).name} (texts of at most {width} tokens, held out: {heldout}, truncated: {cut + cut_test})",
        train=train, val=test, test=test, num_classes=num_labels, input_shape=(context,), classes=classes,
        source=corpus.source, pad_token_id=pad)
