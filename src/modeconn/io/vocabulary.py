"""Vocabulary identity of checkpoint directories: which token each embedding row stands for.

Models whose embedding rows are combined — merged, aligned, interpolated — must number their tokens the same way;
an equal ``vocab_size`` is not enough (two unrelated tokenizers may share a size). :func:`check_vocabularies`
compares the token → id maps themselves, read from the first tokenizer file a checkpoint has:

* ``tokenizer.json`` (the ``tokenizers`` library): the model's vocabulary (a map, or Unigram's list of pieces)
  plus ``added_tokens``;
* ``vocab.json`` (byte-level BPE; ``merges.txt`` changes how text is split, not which token an id is);
* ``vocab.txt`` (WordPiece: one token a line, the id is the line number);
* ``tokenizer.model`` (SentencePiece: its pieces, read from the protobuf here — nothing is imported or executed);

and ``added_tokens.json`` on top of the last three. A model file whose vocabulary cannot be read as a map (an unknown
``tokenizer.json`` model type) is compared by its SHA-256 digest.

A checkpoint without any tokenizer file merged or aligned with one that has them is refused: its rows cannot be
checked against the other's tokens, and the output would carry the other's tokenizer as if it fit. Copying the
tokenizer files into the checkpoint that lacks them (when it does use that tokenizer) states that it fits.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError, ConfigError
from .checkpoint import CONFIG_NAME
from .safe import check_in_checkpoint, read_json_object

PathLike = str | os.PathLike
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model")
"""The files a vocabulary is read from, in order of preference (the first present is read)."""
ADDED_TOKENS = "added_tokens.json"


@dataclass(frozen=True)
class Vocabulary:
    """A checkpoint's token numbering: ``source`` (the file it was read from), ``ids`` (id → token; ``None`` when
    the file's vocabulary is not a map modeconn reads) and ``digest`` (SHA-256 of the file)."""

    source: str
    ids: dict[int, str] | None
    digest: str

    def describe(self) -> str:
        return f"{len(self.ids)} tokens, {self.source}" if self.ids is not None else f"{self.source}, sha256 " \
            f"{self.digest[:12]}"


def read_vocabulary(path: PathLike) -> Vocabulary | None:
    """The vocabulary of checkpoint directory ``path`` (see the module docstring), or None when it has no tokenizer
    file. Raises CheckpointError naming the file when it is unreadable, malformed or a symlink leaving the checkpoint
    (:func:`modeconn.io.check_in_checkpoint`)."""
    path = Path(path)
    for name in TOKENIZER_FILES:
        file = path / name
        if file.is_file():
            data = _read_bytes(check_in_checkpoint(file, path))
            ids = _READERS[name](data, file)
            if ids is not None and name != "tokenizer.json":
                ids = _with_added(ids, path / ADDED_TOKENS)
            return Vocabulary(name, ids, hashlib.sha256(data).hexdigest())
    return None


def _read_bytes(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as err:
        raise CheckpointError(f"{file}: cannot read the tokenizer file: {err}") from None


def _json(data: bytes, file: Path):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{file}: not a valid JSON tokenizer file: {err}") from None


def _malformed(file: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{file}: malformed tokenizer file: {what}")


def _token_map(vocab, file: Path) -> dict[int, str]:
    """``{token: id}`` → id → token (CheckpointError for a non-integer id or one id given twice)."""
    if not isinstance(vocab, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in vocab.values()):
        raise _malformed(file, "the vocabulary must map tokens to integer ids")
    ids = {i: t for t, i in vocab.items()}
    if len(ids) != len(vocab):
        raise _malformed(file, "two tokens share an id")
    return ids


def _tokenizer_json(data: bytes, file: Path) -> dict[int, str] | None:
    """The model vocabulary and added tokens; None (compared by digest) for a layout without a readable vocabulary."""
    raw = _json(data, file)
    model = raw.get("model") if isinstance(raw, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, list):  # Unigram: [[piece, score], …], the id is the position
        if not all(isinstance(e, list) and e and isinstance(e[0], str) for e in vocab):
            raise _malformed(file, "a Unigram vocabulary is a list of [piece, score]")
        ids = {i: e[0] for i, e in enumerate(vocab)}
    elif isinstance(vocab, dict):
        ids = _token_map(vocab, file)
    else:
        return None
    added = raw.get("added_tokens") or []
    if not isinstance(added, list):
        raise _malformed(file, "'added_tokens' must be a list")
    for t in added:
        if not (isinstance(t, dict) and isinstance(t.get("id"), int) and isinstance(t.get("content"), str)):
            raise _malformed(file, f"added token {t!r} needs an integer 'id' and a string 'content'")
        ids[t["id"]] = t["content"]
    return ids


def _vocab_json(data: bytes, file: Path) -> dict[int, str]:
    return _token_map(_json(data, file), file)


def _vocab_txt(data: bytes, file: Path) -> dict[int, str]:
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as err:
        raise _malformed(file, f"not UTF-8 text: {err}") from None
    if lines and lines[-1] == "":
        lines.pop()
    return {i: t.rstrip("\r") for i, t in enumerate(lines)}


def _sentencepiece(data: bytes, file: Path) -> dict[int, str]:
    """The pieces of a SentencePiece ``ModelProto`` (field 1, each a message whose field 1 is the piece)."""
    try:
        pieces = [next(v for f, w, v in _fields(msg) if f == 1 and w == 2).decode("utf-8")
                  for f, w, msg in _fields(data) if f == 1 and w == 2]
    except (ValueError, StopIteration, UnicodeDecodeError) as err:
        raise _malformed(file, f"not a SentencePiece model ({err or 'a piece without text'})") from None
    return dict(enumerate(pieces))


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """``(field number, wire type, value)`` of a protobuf message; ValueError when it is truncated or malformed."""
    i = 0
    while i < len(buf):
        tag, i = _varint(buf, i)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated")
        yield field, wire, value


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


_READERS = {"tokenizer.json": _tokenizer_json, "vocab.json": _vocab_json, "vocab.txt": _vocab_txt,
            "tokenizer.model": _sentencepiece}


def _with_added(ids: dict[int, str], file: Path) -> dict[int, str]:
    if not file.is_file():
        return ids
    added = _token_map(_json(_read_bytes(file), file), file)
    return {**ids, **added}


def check_vocabularies(paths: Sequence[PathLike]) -> None:
    """ConfigError unless every checkpoint directory of ``paths`` numbers its tokens as the first does: the config's
    ``vocab_size`` (where given) and the token → id maps of their tokenizer files (see the module docstring) are
    compared; the error names the first differing token and its id in each model, or the model without tokenizer
    files. CheckpointError for a tokenizer file that cannot be read."""
    paths = [Path(p) for p in paths]
    _check_sizes(paths)
    vocabs = [read_vocabulary(p) for p in paths]
    for p, v in zip(paths[1:], vocabs[1:], strict=True):
        _compare(paths[0], vocabs[0], p, v)


def _check_sizes(paths: list[Path]) -> None:
    sizes = {}
    for p in paths:
        cfg = read_json_object(p / CONFIG_NAME, "config file")
        text = cfg.get("text_config")
        size = cfg.get("vocab_size", text.get("vocab_size") if isinstance(text, dict) else None)
        sizes[str(p)] = size if isinstance(size, int) else None
    if None not in sizes.values() and len(set(sizes.values())) > 1:
        raise ConfigError("the models have different vocabularies, vocab_size (config.json): "
                          + ", ".join(f"{p}: {n} tokens" for p, n in sizes.items())
                          + "; merging needs one tokenizer (align the vocabularies first)")


def _compare(pa: Path, a: Vocabulary | None, pb: Path, b: Vocabulary | None) -> None:
    if a is None and b is None:
        return
    if a is None or b is None:
        has, lacks, v = (pa, pb, a) if a is not None else (pb, pa, b)
        raise ConfigError(f"{lacks} has no tokenizer files ({', '.join(TOKENIZER_FILES)}) while {has} has "
                          f"{v.source}: which token each of its embedding rows stands for cannot be checked; if it "
                          f"uses {has}'s tokenizer, copy {v.source} into {lacks}")
    if a.ids is None or b.ids is None:
        if a.digest != b.digest:
            raise ConfigError(f"the models have different tokenizers: {pa}: {a.describe()}; {pb}: {b.describe()} "
                              "(the vocabulary of a tokenizer.json of this model type is compared by digest)")
        return
    if a.ids == b.ids:
        return
    i = min(j for j in a.ids.keys() | b.ids.keys() if a.ids.get(j) != b.ids.get(j))
    token = a.ids.get(i, b.ids.get(i))
    where = [_id_of(token, v.ids) for v in (a, b)]
    raise ConfigError(f"the models have different vocabularies: token {token!r} is {where[0]} in {pa} and "
                      f"{where[1]} in {pb} (id {i}: {_token_at(a.ids, i)} in {pa}, {_token_at(b.ids, i)} in {pb}); "
                      f"{pa}: {a.describe()}, {pb}: {b.describe()}; merged or aligned embedding rows must stand for "
                      "the same tokens")


def _id_of(token: str, ids: dict[int, str]) -> str:
    found = [i for i, t in ids.items() if t == token]
    return f"id {found[0]}" if found else "absent"


def _token_at(ids: dict[int, str], i: int) -> str:
    return repr(ids[i]) if i in ids else "no token"
