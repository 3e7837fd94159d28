"""The user's text corpus as next-token blocks, tokenized with the checkpoint's own tokenizer.

1. **Documents** are read by :func:`modeconn.data.corpus.read_corpus` (``.txt``, ``.jsonl``/``.json``, ``.csv``,
   ``.parquet``, a ``save_to_disk`` directory).
2. **Tokenizer**: ``transformers.AutoTokenizer.from_pretrained(checkpoint_dir, local_files_only=True,
   trust_remote_code=False)`` — a ``tokenizer.json``, a SentencePiece ``tokenizer.model`` or BPE ``vocab``/``merges``
   files alike (:func:`load_checkpoint_tokenizer`).
3. **Blocks**: each document is encoded without special tokens; the documents are joined into one id stream with the
   tokenizer's end-of-sequence token between them (when it has one) and cut into ``N = (L − 1) // T``
   non-overlapping blocks of ``T`` tokens, labels shifted by one (as :func:`modeconn.data.text.blocks`). ``T`` is
   ``--context-length`` or ``min(128, max_position_embeddings)``; a ``T`` beyond the model's positions is refused.
4. **Held-out**: the user's (a saved split or a second file, ``--split``), blocked the same way; otherwise a seeded
   ``heldout_fraction`` of the blocks (at least one; :func:`modeconn.data.bundle.split_indices` with ``--seed``).
   ``test`` and ``val`` are both the held-out part. The bundle's ``options`` state the block length, the field and
   where the held-out part came from.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..errors import ConfigError, DataError
from .bundle import split_indices
from .corpus import Corpus, read_corpus
from .text import TextBundle, blocks, load_tokenizer
from .user_options import UserDataOptions

#: The block length when none is given (capped by the model's ``max_position_embeddings``).
DEFAULT_CONTEXT = 128


def load_checkpoint_tokenizer(directory: str | os.PathLike) -> Any:
    """The checkpoint directory's own tokenizer, read with ``AutoTokenizer`` from local files only, no remote code.

    Raises:
        DataError: no tokenizer could be read from ``directory`` (the files present named).
    """
    from transformers import AutoTokenizer

    directory = Path(directory)
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except Exception as err:  # transformers raises OSError, ValueError, KeyError, … for a missing/odd tokenizer
        present = ", ".join(sorted(p.name for p in directory.iterdir())) if directory.is_dir() else "not a directory"
        raise DataError(f"{directory}: no tokenizer AutoTokenizer can read locally (tokenizer.json, tokenizer.model, "
                        f"vocab/merges files; present: {present}): {type(err).__name__}: {err}") from None


def load_fast_tokenizer(directory: str | os.PathLike) -> Any:
    """The checkpoint's tokenizer as a ``tokenizers.Tokenizer`` (what the registered text datasets encode with): its
    ``tokenizer.json``, else the fast tokenizer ``AutoTokenizer`` builds from SentencePiece or BPE files.

    Raises:
        DataError: no tokenizer in ``directory`` (see :func:`load_checkpoint_tokenizer`), or one without a fast form.
    """
    if (Path(directory) / "tokenizer.json").is_file():
        return load_tokenizer(directory)
    backend = getattr(load_checkpoint_tokenizer(directory), "backend_tokenizer", None)
    if backend is None:
        raise DataError(f"{directory}: its tokenizer has no fast (tokenizers) form to encode a registered text dataset")
    return backend


def max_positions(config: Mapping[str, Any]) -> int | None:
    """The positions a Hugging Face ``config.json`` gives its model (``max_position_embeddings`` or GPT-2's
    ``n_positions``), or None."""
    value = config.get("max_position_embeddings") or config.get("n_positions")
    return int(value) if value else None


def context_length_for(max_positions: int | None, requested: int | None) -> int:
    """``requested`` or ``min(128, max_positions)``; ConfigError when ``requested`` exceeds the model's positions."""
    if requested is None:
        return min(DEFAULT_CONTEXT, int(max_positions or DEFAULT_CONTEXT))
    if max_positions is not None and requested > max_positions:
        raise ConfigError(f"--context-length {requested} is longer than the model's positions "
                          f"(max_position_embeddings = {max_positions})")
    return int(requested)


def token_stream(tokenizer: Any, documents: list[str]) -> np.ndarray:
    """The ids of ``documents`` encoded one by one (no special tokens), joined by the EOS id when there is one."""
    encoded = tokenizer(documents, add_special_tokens=False)["input_ids"]
    eos = getattr(tokenizer, "eos_token_id", None)
    ids: list[int] = []
    for i, doc in enumerate(encoded):
        if i and eos is not None:
            ids.append(int(eos))
        ids.extend(doc)
    return np.asarray(ids, dtype=np.int64)


def _blocks_or_error(ids: np.ndarray, context: int, where: str) -> TensorDataset:
    sets = blocks(ids, context)
    if len(sets) == 0:
        raise DataError(f"{where}: {len(ids)} tokens, fewer than one block of context_length={context} + 1; give more "
                        "text or a shorter --context-length")
    return sets


def split_heldout(train: TensorDataset, source: str, opts: UserDataOptions,
                  unit: str = "block of text") -> tuple[TensorDataset, TensorDataset]:
    """``train`` split into (train, held-out): a seeded ``opts.heldout_fraction`` held out, at least one ``unit``;
    DataError naming ``source`` when there is only one."""
    n = len(train)
    if n < 2:
        raise DataError(f"{source}: one {unit}, nothing left to hold out; give more text, a shorter --context-length "
                        "or a held-out split (--split)")
    train_idx, test_idx = split_indices(n, opts.heldout_fraction, opts.seed)
    if len(test_idx) == 0:  # always hold out at least one
        train_idx, test_idx = train_idx[1:], train_idx[:1]
    return tuple(TensorDataset(*(t[torch.from_numpy(idx)] for t in train.tensors)) for idx in (train_idx, test_idx))


def limit_rows(ds: TensorDataset, limit: int | None) -> TensorDataset:
    return ds if limit is None else TensorDataset(*(t[:limit] for t in ds.tensors))


def user_text_bundle(path: str | os.PathLike, tokenizer: Any, *, max_positions: int | None = None,
                     options: UserDataOptions | None = None, limit_train: int | None = None,
                     limit_test: int | None = None) -> TextBundle:
    """The corpus at ``path`` as a :class:`~modeconn.data.text.TextBundle` of next-token blocks (module docstring).

    Args:
        tokenizer: the checkpoint's tokenizer (:func:`load_checkpoint_tokenizer`).
        max_positions: the model's ``max_position_embeddings`` (None: not known).
        options: split, text field, context length, held-out fraction and seed (defaults: :class:`UserDataOptions`).

    Returns:
        ``train`` / ``test`` ``TensorDataset(input_ids (N, T) int64, labels (N, T) int64)``, ``val`` = ``test``;
        ``num_classes`` = ``len(tokenizer)``.

    Raises:
        DataError: bad data (see :func:`~modeconn.data.corpus.read_corpus`), or fewer tokens than one block.
        ConfigError: a context length beyond the model's positions.
    """
    opts = options or UserDataOptions()
    context = context_length_for(max_positions, opts.context_length)
    corpus = read_corpus(path, text_field=opts.text_field, split=opts.split)
    train = _blocks_or_error(token_stream(tokenizer, corpus.train), context, corpus.source)
    if corpus.heldout is None:
        train, test = split_heldout(train, corpus.source, opts)
        heldout = f"{opts.heldout_fraction:g} of the blocks, seed {opts.seed}"
    else:
        test = _blocks_or_error(token_stream(tokenizer, corpus.heldout), context, str(corpus.heldout_source))
        heldout = str(corpus.heldout_source)
    return _bundle(Path(path), tokenizer, corpus, context, limit_rows(train, limit_train), limit_rows(test, limit_test),
                   {"context_length": context, "text_field": opts.text_field, "held_out": heldout})


def _bundle(path: Path, tokenizer: Any, corpus: Corpus, context: int, train: TensorDataset, test: TensorDataset,
            options: dict[str, Any]) -> TextBundle:
    vocab = len(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a tokenizers.Tokenizer, as TextBundle holds
    digest = hashlib.sha256("\n".join(corpus.train).encode("utf-8")).hexdigest()
    name = f"{path.name} ({context}-token blocks, held out: {options['held_out']})"
    return TextBundle(
        name=name, train=train, val=test, test=test, num_classes=vocab, input_shape=(context,),
        classes=tuple(str(t) for t in tokenizer.convert_ids_to_tokens(list(range(vocab)))), source=corpus.source,
        tokenizer=backend, vocab_size=vocab, context_length=context, options=options, text_sha256=digest,
        tokenizer_sha256=hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest() if backend is not None else "",
    )
