"""Language-modelling data: a byte-level BPE tokenizer and fixed-length next-token blocks.

``load_dataset("austen")`` (or :func:`load_austen`) reads Jane Austen's six novels
(``<data>/austen/austen.txt.gz``, 4,025,044 bytes of UTF-8; found like the other datasets, see
:func:`modeconn.data.find_data_dir`) and returns a :class:`TextBundle`:

1. **Splits** (fixed, contiguous, never shuffled): the text is cut at line boundaries into
   ``train`` = the first ``1 − val_fraction − test_fraction`` of the characters, ``val`` = the next
   ``val_fraction``, ``test`` = the last ``test_fraction`` (defaults 0.90 / 0.05 / 0.05; for "austen" the
   held-out test text is the second half of *Persuasion*). Each cut point is the first line start at or
   after the fraction's character offset.
2. **Tokenizer**: a byte-level BPE (``tokenizers`` library; GPT-2 pre-tokenizer regex, no prefix space,
   the 256 byte symbols always in the vocabulary, one special token ``<|endoftext|>`` = id 0, merges of
   pairs seen at least twice) trained on the *training split only* with ``vocab_size`` entries. Training
   is deterministic (same text and size → the same ``tokenizer.json`` bytes, in every process) and takes
   about 1.5 s for Austen; results are cached in memory keyed by ``(sha256 of the training text,
   vocab_size)``. Byte-level BPE is lossless: ``decode(encode(s)) == s`` for every string.
3. **Blocks**: each split is tokenised on its own (line by line — a pre-token never spans a newline, which
   gives the same ids as encoding the split in one piece) into one id stream ``s`` of length ``L``, cut
   into ``N = (L − 1) // T`` non-overlapping blocks: ``input_ids[i] = s[iT : iT+T]`` and
   ``labels[i] = s[iT+1 : iT+T+1]`` (the inputs shifted by one: next-token prediction). Each token of the
   stream except the first is a target exactly once; the last ``< T`` tokens of a split are dropped.

Every split is a ``TensorDataset(input_ids (N, T) int64, labels (N, T) int64)``; ``num_classes`` is the
vocabulary size and ``input_shape`` is ``(T,)``. Losses on these sets are per-token means
(:func:`modeconn.path.evaluate.evaluate_model` flattens ``(B, T, V)`` logits).

:func:`text_bundle` builds the same from any string (used by the tests); :func:`load_tokenizer` reads
the ``tokenizer.json`` that ``modeconn train`` writes into a checkpoint directory.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import itertools
import os
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..errors import ConfigError, DataError
from ..registry import Registry
from .bundle import DatasetBundle
from .checksums import verify_content_sha256
from .locate import find_data_dir, idx_file

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

#: SHA-256 of the decompressed ``austen/austen.txt`` (shared/data/README.md).
AUSTEN_SHA256 = "7a590c6b3577dbc25d958b3d1798965f91272f4be41db8041a350060016adf33"
AUSTEN_FILE = "austen.txt"  # read as austen.txt or austen.txt.gz (gzip detected from the magic bytes)

DEFAULT_VOCAB_SIZE = 4096
DEFAULT_CONTEXT_LENGTH = 128
DEFAULT_VAL_FRACTION = 0.05
DEFAULT_TEST_FRACTION = 0.05
MIN_FREQUENCY = 2
SPECIAL_TOKENS = ("<|endoftext|>",)
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
MAX_VOCAB_SIZE = 1 << 20

#: Text dataset loaders by name: ``fn(root, **options) -> TextBundle`` (see :func:`load_austen`).
TEXT_DATASETS: Registry[Callable[..., TextBundle]] = Registry("text dataset")


@dataclass(frozen=True)
class TextBundle(DatasetBundle):
    """A :class:`DatasetBundle` of next-token blocks plus the tokenizer that made them.

    ``train`` / ``val`` / ``test`` are ``TensorDataset(input_ids (N, T) int64, labels (N, T) int64)`` with
    ``labels`` the inputs shifted by one; ``num_classes`` = ``vocab_size``; ``input_shape`` = ``(T,)``;
    ``classes`` are the vocabulary's token strings (byte-level symbols, e.g. ``"Ġthe"`` for " the").

    Attributes (beyond DatasetBundle's):
        tokenizer: the ``tokenizers.Tokenizer`` (a private copy; mutate it freely).
        vocab_size: vocabulary size V (ids ``0..V-1``).
        context_length: block length T.
        options: the loader options that reproduce this bundle (``vocab_size``, ``context_length``,
            ``val_fraction``, ``test_fraction``); recorded as ``dataset_options`` in checkpoints.
        text_sha256: SHA-256 of the whole (decoded, UTF-8) text.
        tokenizer_sha256: SHA-256 of :meth:`tokenizer_json`.
        char_spans: ``{"train" | "val" | "test": (start, stop)}`` character offsets of each split.
        num_tokens: tokens per split stream before blocking (``N·T + 1 + dropped tail``).
    """

    tokenizer: Any = field(default=None, repr=False, compare=False)
    vocab_size: int = 0
    context_length: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    text_sha256: str = ""
    tokenizer_sha256: str = ""
    char_spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    num_tokens: dict[str, int] = field(default_factory=dict)

    def tokenizer_json(self) -> str:
        """The tokenizer serialised as ``tokenizer.json`` text (``Tokenizer.from_str`` reads it back)."""
        return self.tokenizer.to_str()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Any) -> str:
        """Text of token ids (a list, or an int tensor/array of any shape, flattened)."""
        if isinstance(ids, (torch.Tensor, np.ndarray)):
            ids = ids.reshape(-1).tolist()
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


# ------------------------------------------------------------------------------------------- tokenizer

_CACHE_LOCK = threading.Lock()
_TOKENIZER_CACHE: dict[tuple[str, int], str] = {}
_IDS_CACHE: dict[tuple[str, str], np.ndarray] = {}


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo or (
        hi is not None and value > hi
    ):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ConfigError(f"{name} must be an integer {rng}, got {value!r}")
    return int(value)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _new_tokenizer_and_trainer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def train_tokenizer(text: str, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Train a byte-level BPE tokenizer with ``vocab_size`` entries on ``text`` (see the module docstring).

    Deterministic: the same ``(text, vocab_size)`` gives the same ``tokenizer.to_str()`` in every process.
    Results are cached in memory by ``(sha256(text), vocab_size)``; every call returns a fresh copy.
    The vocabulary can be smaller than ``vocab_size`` if the text has too few distinct pairs.

    Raises:
        ConfigError: ``vocab_size`` not an integer in ``[257, 2**20]`` or ``text`` empty.
    """
    from tokenizers import Tokenizer

    vocab_size = _check_int("vocab_size", vocab_size, MIN_VOCAB_SIZE, MAX_VOCAB_SIZE)
    if not isinstance(text, str) or not text:
        raise ConfigError("train_tokenizer: text must be a non-empty string")
    key = (hashlib.sha256(text.encode("utf-8")).hexdigest(), vocab_size)
    with _CACHE_LOCK:
        cached = _TOKENIZER_CACHE.get(key)
    if cached is None:
        tok, trainer = _new_tokenizer_and_trainer(vocab_size)
        lines = _lines(text)
        tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
        cached = tok.to_str()
        with _CACHE_LOCK:
            _TOKENIZER_CACHE[key] = cached
    return Tokenizer.from_str(cached)


def encode_stream(tokenizer: Tokenizer, text: str) -> np.ndarray:
    """All token ids of ``text`` as one int64 array (encoded line by line, no special tokens).

    Equal to ``tokenizer.encode(text).ids`` for the tokenizers trained here (no merge crosses a newline),
    but batched (parallel) and faster. Cached in memory by (tokenizer, text) digests.
    """
    if not text:
        return np.zeros(0, dtype=np.int64)
    tok_json = tokenizer.to_str()
    key = (hashlib.sha256(tok_json.encode("utf-8")).hexdigest(), hashlib.sha256(text.encode("utf-8")).hexdigest())
    with _CACHE_LOCK:
        cached = _IDS_CACHE.get(key)
    if cached is None:
        encodings = tokenizer.encode_batch(_lines(text), add_special_tokens=False)
        flat = itertools.chain.from_iterable(e.ids for e in encodings)
        cached = np.fromiter(flat, dtype=np.int64)
        cached.setflags(write=False)
        with _CACHE_LOCK:
            _IDS_CACHE[key] = cached
    return cached


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """A tokenizer from ``tokenizer.json`` or from a checkpoint directory holding one.

    Raises:
        DataError: the file is missing or is not a valid tokenizer file (the path is named).
    """
    from tokenizers import Tokenizer

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise DataError(f"{file}: tokenizer file not found (checkpoints of text models hold a tokenizer.json)")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError(f"{file}: not a valid tokenizer.json: {err}") from None


# ------------------------------------------------------------------------------------------------ splits


def split_text(text: str, val_fraction: float, test_fraction: float) -> dict[str, tuple[int, int]]:
    """Character spans ``{"train", "val", "test"}`` of the fixed contiguous split (module docstring, step 1).

    Raises:
        ConfigError: fractions outside ``[0, 1)`` or summing to ``>= 1``.
    """
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ConfigError(f"{name} must be a number in [0, 1), got {value!r}")
    if val_fraction + test_fraction >= 1.0:
        raise ConfigError(
            f"val_fraction + test_fraction must be < 1 (leaving training text), got {val_fraction} + {test_fraction}"
        )
    n = len(text)

    def line_start(frac: float) -> int:
        pos = min(n, max(0, int(round(n * frac))))
        if pos in (0, n) or text[pos - 1] == "\n":
            return pos
        nxt = text.find("\n", pos)
        return n if nxt < 0 else nxt + 1

    a = line_start(1.0 - val_fraction - test_fraction)
    b = max(a, line_start(1.0 - test_fraction))
    return {"train": (0, a), "val": (a, b), "test": (b, n)}


def blocks(ids: np.ndarray | torch.Tensor, context_length: int) -> TensorDataset:
    """``TensorDataset(input_ids (N, T), labels (N, T))`` from an id stream (module docstring, step 3)."""
    t = _check_int("context_length", context_length, 1)
    s = torch.tensor(np.asarray(ids), dtype=torch.int64)  # a copy: never aliases a cached stream
    n = max(0, (s.numel() - 1) // t)
    x = s[: n * t].reshape(n, t).clone()
    y = s[1 : n * t + 1].reshape(n, t).clone()
    return TensorDataset(x, y)


def text_bundle(
    text: str,
    *,
    name: str = "text",
    source: str = "<memory>",
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    context_length: int = DEFAULT_CONTEXT_LENGTH,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    limit_train: int | None = None,
    limit_test: int | None = None,
    tokenizer: Tokenizer | None = None,
) -> TextBundle:
    """A :class:`TextBundle` of ``text``: contiguous splits, a BPE tokenizer trained on the training split,
    next-token blocks of ``context_length`` tokens (module docstring).

    Args:
        vocab_size: BPE vocabulary size (≥ 257: 256 bytes + ``<|endoftext|>``); ignored with ``tokenizer``.
        tokenizer: a ready ``tokenizers.Tokenizer`` (a pretrained model's ``tokenizer.json``) used instead of
            training one; the bundle's vocabulary is then the tokenizer's.
        context_length: tokens per block T (≥ 1).
        val_fraction, test_fraction: shares of the text (by characters) in the val and test splits.
        limit_train, limit_test: keep only the first N blocks of ``train`` / ``test``.

    Raises:
        ConfigError: an option out of range, or a training split that yields no block.
    """
    vocab_size = _check_int("vocab_size", vocab_size, MIN_VOCAB_SIZE, MAX_VOCAB_SIZE)
    context_length = _check_int("context_length", context_length, 1)
    for lname, limit in (("limit_train", limit_train), ("limit_test", limit_test)):
        if limit is not None:
            _check_int(lname, limit, 0)
    spans = split_text(text, val_fraction, test_fraction)
    pieces = {k: text[a:b] for k, (a, b) in spans.items()}
    if not pieces["train"]:
        raise ConfigError(f"{source}: the training split is empty")
    tokenizer = train_tokenizer(pieces["train"], vocab_size) if tokenizer is None else tokenizer
    streams = {k: encode_stream(tokenizer, p) for k, p in pieces.items()}
    sets = {k: blocks(s, context_length) for k, s in streams.items()}
    if len(sets["train"]) == 0:
        raise ConfigError(
            f"{source}: the training split has {len(streams['train'])} tokens, fewer than one block of "
            f"context_length={context_length} + 1"
        )
    for split, limit in (("train", limit_train), ("test", limit_test)):
        if limit is not None:
            sets[split] = TensorDataset(*(t[:limit] for t in sets[split].tensors))
    tok_json = tokenizer.to_str()
    vocab = tokenizer.get_vocab_size()
    id_to_token = {i: s for s, i in tokenizer.get_vocab().items()}
    return TextBundle(
        name=name,
        train=sets["train"],
        val=sets["val"],
        test=sets["test"],
        num_classes=vocab,
        input_shape=(context_length,),
        classes=tuple(id_to_token.get(i, "") for i in range(vocab)),
        source=source,
        tokenizer=tokenizer,
        vocab_size=vocab,
        context_length=context_length,
        options={"vocab_size": vocab_size, "context_length": context_length,
                 "val_fraction": val_fraction, "test_fraction": test_fraction},
        text_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        tokenizer_sha256=hashlib.sha256(tok_json.encode("utf-8")).hexdigest(),
        char_spans=spans,
        num_tokens={k: len(s) for k, s in streams.items()},
    )


# ------------------------------------------------------------------------------------------------ austen


def read_text_file(path: Path, expected_sha256: str | None) -> str:
    """UTF-8 text of ``path`` (gzip detected from the magic bytes), checked against ``expected_sha256`` of
    the decompressed bytes when given.

    Raises:
        DataError: unreadable, corrupt gzip, checksum mismatch or invalid UTF-8 (the file is named).
    """
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from err
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(f"corrupt or truncated gzip file {path}: {err}") from err
    if expected_sha256 is not None:
        verify_content_sha256(raw, expected_sha256, path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text: {err}") from None


@TEXT_DATASETS.register("austen")
def load_austen(
    root: str | os.PathLike | None = None,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    context_length: int = DEFAULT_CONTEXT_LENGTH,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    limit_train: int | None = None,
    limit_test: int | None = None,
    verify: bool = True,
    tokenizer: Tokenizer | None = None,
) -> TextBundle:
    """Jane Austen's six novels as next-token blocks (module docstring); about 5 s the first time in a process
    (tokenizer training ≈ 1.5 s, encoding ≈ 3.5 s), then cached in memory.

    With the defaults (V = 4096, T = 128): train 963,348 tokens → 7,526 blocks; val 55,992 and test 55,567
    tokens (437 and 434 blocks).

    Args:
        root: the directory holding ``austen.txt[.gz]`` or a parent with an ``austen/`` sub-directory; when
            omitted, ``$MODECONN_DATA/austen`` and then the download cache are searched.
        verify: check the SHA-256 of the decompressed text against :data:`AUSTEN_SHA256`.
        tokenizer: tokenize with this ``tokenizers.Tokenizer`` instead of training one (a pretrained model's).
        Other options: as in :func:`text_bundle`.

    Raises:
        DataError: ``austen.txt[.gz]`` not found (the message lists where it looked and how to provide it),
            corrupt, or failing its checksum.
        ConfigError: an option out of range.
    """
    directory = find_data_dir("austen", root)
    path = idx_file(directory, AUSTEN_FILE)
    if path is None:  # pragma: no cover - find_data_dir checked it
        raise DataError(f"{directory}: {AUSTEN_FILE}[.gz] not found")
    text = read_text_file(path, AUSTEN_SHA256 if verify else None)
    return text_bundle(
        text, name="austen", source=str(directory), vocab_size=vocab_size, context_length=context_length,
        val_fraction=val_fraction, test_fraction=test_fraction, limit_train=limit_train, limit_test=limit_test,
        tokenizer=tokenizer,
    )


def load_text_dataset(name: str, root: str | os.PathLike | None = None, **options: Any) -> TextBundle:
    """Call the registered text loader ``name`` with ``options`` (checked against its signature first).

    Raises:
        ConfigError: unknown dataset, or an option it does not take (named, with the valid ones).
    """
    loader = TEXT_DATASETS.get(name)
    params = inspect.signature(loader).parameters
    valid = [p for p in params if p != "root"]
    unknown = sorted(k for k in options if k not in valid)
    if unknown:
        raise ConfigError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for text dataset "
            f"{name!r}; valid options: {', '.join(sorted(valid))}"
        )
    return loader(root, **options)
