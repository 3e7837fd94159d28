"""Trust round 3, class 3 — different tokenizers of the same size are merged.

Only vocabulary *sizes* were compared, so two tokenizers sharing a ``vocab_size`` had their embedding rows averaged
(or matched) although row ``i`` stood for different tokens. Now every command combining checkpoints compares the
token → id maps themselves (:func:`modeconn.io.vocabulary.check_vocabularies`: ``tokenizer.json``, ``vocab.json``,
``vocab.txt`` or ``tokenizer.model``, plus ``added_tokens.json``), names the first differing token and its id in each
model, and refuses a checkpoint without tokenizer files next to one that has them — before any work.
"""

from __future__ import annotations

import importlib
import json
import struct
from pathlib import Path

import pytest
from cli_runner import run_cli
from hf_tiny import make

from modeconn.errors import ConfigError
from modeconn.io import save_checkpoint
from modeconn.models import build_model
from modeconn.io.vocabulary import check_vocabularies, read_vocabulary

vocab_mod = importlib.import_module("modeconn.io.vocabulary")
stream_mod = importlib.import_module("modeconn.recipes.hf_stream")

TOKENS = [f"t{i}" for i in range(50)]  # the tiny models' vocab_size


def renamed(tokens: list[str], i: int, new: str) -> list[str]:
    return [new if j == i else t for j, t in enumerate(tokens)]


def swapped(tokens: list[str], i: int, j: int) -> list[str]:
    out = list(tokens)
    out[i], out[j] = out[j], out[i]
    return out


# ------------------------------------------------------------------------------ tokenizer files, by format
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def sentencepiece_model(pieces: list[str]) -> bytes:
    """A SentencePiece ``ModelProto``: pieces (piece, score, type) and an empty trainer spec."""
    def piece(p: str) -> bytes:
        return _field(1, p.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", -1.0) + _varint(3 << 3) + b"\x01"

    return b"".join(_field(1, piece(p)) for p in pieces) + _field(2, b"")


def write_tokenizer(path: Path, fmt: str, tokens: list[str]) -> None:
    """``tokens`` (id = position) as the tokenizer file(s) of format ``fmt`` in checkpoint ``path``."""
    if fmt == "tokenizer.json":
        data = {"version": "1.0", "added_tokens": [{"id": 0, "content": tokens[0], "special": True}],
                "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(tokens)}, "unk_token": tokens[0]}}
        (path / fmt).write_text(json.dumps(data))
    elif fmt == "tokenizer.json (Unigram)":
        data = {"version": "1.0", "added_tokens": [], "model": {"type": "Unigram", "vocab": [[t, -1.0] for t in tokens]}}
        (path / "tokenizer.json").write_text(json.dumps(data))
    elif fmt == "vocab.json":
        (path / fmt).write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
        (path / "merges.txt").write_text("#version: 0.2\n")
    elif fmt == "vocab.txt":
        (path / fmt).write_text("".join(t + "\n" for t in tokens))
    elif fmt == "tokenizer.model":
        (path / fmt).write_bytes(sentencepiece_model(tokens))
    else:
        raise AssertionError(fmt)


FORMATS = ["tokenizer.json", "tokenizer.json (Unigram)", "vocab.json", "vocab.txt", "tokenizer.model"]


@pytest.fixture
def pair(tmp_path):
    """Two tiny Llama checkpoints (same config, vocab_size 50) without tokenizer files."""
    for seed, name in enumerate("ab"):
        make("llama", seed).save_pretrained(tmp_path / name)
    return tmp_path / "a", tmp_path / "b"


def assert_refused(res, out: Path, *names: str) -> None:
    text = " ".join(res.output.split())
    assert res.exit_code == 2, f"exit {res.exit_code}: {res.output}{res.exception!r}"
    missing = [n for n in names if n not in text]
    assert not missing, f"the error does not name {missing}: {res.output}"
    assert not out.exists()


def _no_heavy_work(*args, **kwargs):
    raise AssertionError("weights were matched before the vocabularies were compared")


COMMANDS = {
    "merge --align none": ("merge", "--align", "none"),
    "merge --align weight": ("merge", "--align", "weight"),
    "align": ("align",),
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("edit, names", [
    (lambda t: renamed(t, 17, "zz"), ["'t17'", "id 17", "absent", "'zz'"]),
    (lambda t: swapped(t, 3, 4), ["'t3'", "id 3", "id 4"]),
], ids=["renamed", "swapped"])
def test_same_size_different_tokens_are_refused_naming_the_token(pair, tmp_path, monkeypatch, command, edit, names):
    a, b = pair
    write_tokenizer(a, "tokenizer.json", TOKENS)
    write_tokenizer(b, "tokenizer.json", edit(TOKENS))
    monkeypatch.setattr(stream_mod, "weight_matching", _no_heavy_work)
    res = run_cli(*COMMANDS[command][:1], a, b, *COMMANDS[command][1:], "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", "different vocabularies", *names)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_tokenizer_format_is_compared(pair, tmp_path, fmt):
    a, b = pair
    write_tokenizer(a, fmt, TOKENS)
    write_tokenizer(b, fmt, swapped(TOKENS, 20, 31))
    res = run_cli("merge", a, b, "--align", "none", "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", "'t20'", "id 20", "id 31", fmt.split(" ")[0])
    write_tokenizer(b, fmt, TOKENS)  # the same vocabulary merges
    run_cli("merge", a, b, "--align", "none", "--out", tmp_path / "same")


@pytest.mark.parametrize("fa, fb", [("tokenizer.json", "vocab.json"), ("tokenizer.model", "vocab.txt"),
                                    ("tokenizer.json (Unigram)", "tokenizer.model")])
def test_one_vocabulary_in_two_formats_is_the_same(pair, tmp_path, fa, fb):
    a, b = pair
    write_tokenizer(a, fa, TOKENS)
    write_tokenizer(b, fb, TOKENS)
    run_cli("merge", a, b, "--align", "none", "--out", tmp_path / "o")
    write_tokenizer(b, fb, renamed(TOKENS, 49, "t49x"))
    res = run_cli("merge", a, b, "--align", "none", "--out", tmp_path / "o2", ok=False)
    assert_refused(res, tmp_path / "o2", "'t49'", "id 49")


def test_added_tokens_are_part_of_the_vocabulary(pair, tmp_path):
    a, b = pair
    for path, extra in ((a, "<pad>"), (b, "<sep>")):
        write_tokenizer(path, "vocab.txt", TOKENS[:49])
        (path / "added_tokens.json").write_text(json.dumps({extra: 49}))
    res = run_cli("merge", a, b, "--align", "none", "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", "'<pad>'", "id 49", "absent")


@pytest.mark.parametrize("which", ["a", "b"])
def test_a_checkpoint_without_tokenizer_files_next_to_one_with_them_is_refused(pair, tmp_path, which):
    a, b = pair
    has, lacks = (a, b) if which == "a" else (b, a)
    write_tokenizer(has, "tokenizer.json", TOKENS)
    res = run_cli("merge", a, b, "--align", "none", "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", f"{lacks} has no tokenizer files", "copy tokenizer.json")


def test_modeconn_checkpoints_are_compared_too(tmp_path):
    paths = [save_checkpoint(tmp_path / n, build_model("mlp", in_shape=(1, 4, 4), num_classes=3, depth=1, width=4,
                                                        seed=s)) for s, n in enumerate("ab")]
    write_tokenizer(paths[0], "tokenizer.json", TOKENS)
    write_tokenizer(paths[1], "tokenizer.json", renamed(TOKENS, 5, "five"))
    for args in (("merge", *paths, "--align", "none", "--bn", "interpolate"), ("align", *paths)):
        res = run_cli(*args, "--out", tmp_path / "o", ok=False)
        assert_refused(res, tmp_path / "o", "'t5'", "id 5")


def test_malformed_tokenizer_files_are_named(pair, tmp_path):
    a, b = pair
    write_tokenizer(a, "tokenizer.model", TOKENS)
    (b / "tokenizer.model").write_bytes(sentencepiece_model(TOKENS)[:-7])  # truncated
    with pytest.raises(Exception, match="tokenizer.model"):
        read_vocabulary(b)
    res = run_cli("merge", a, b, "--align", "none", "--out", tmp_path / "o", ok=False)
    assert_refused(res, tmp_path / "o", str(b / "tokenizer.model"), "malformed")


# ---------------------------------------------------------------------------------- negative control
def test_negative_control_sizes_only_are_caught(pair, tmp_path, monkeypatch):
    monkeypatch.setattr(vocab_mod, "read_vocabulary", lambda path: None)  # broken: only vocab_size compared
    a, b = pair
    write_tokenizer(a, "tokenizer.json", TOKENS)
    write_tokenizer(b, "tokenizer.json", swapped(TOKENS, 3, 4))
    check_vocabularies([a, b])  # passes: the sizes agree
    res = run_cli("merge", a, b, "--align", "none", "--out", tmp_path / "o", ok=False)
    with pytest.raises(AssertionError):
        assert_refused(res, tmp_path / "o", "'t3'")
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="'t3'"):
        check_vocabularies([a, b])
