"""#31 item 2: the user's own data — the --dataset resolver, text corpora in every format tokenized with the
checkpoint's own tokenizer (SentencePiece, BPE files), image folders checked against the model's head, and every
bad-data error naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from modeconn.data import (ImageHead, UserDataOptions, load_checkpoint_tokenizer, load_dataset, load_user_dataset,
                           user_data_path)
from modeconn.data.image_folder import load_image_folder
from modeconn.data.image_preprocess import head_from_config, image_folder_for_checkpoint
from modeconn.errors import ConfigError, DataError
from user_data_fixtures import bpe_files_dir, sentencepiece_dir, sentences, write_pngs

TEXT = "\n".join(sentences(120))


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
    return load_checkpoint_tokenizer(sentencepiece_dir(tmp_path_factory.mktemp("sp"), TEXT))


def _load(path, tok, **opts):
    return load_user_dataset(path, tokenizer=tok, max_positions=64, options=UserDataOptions(**opts))


# ------------------------------------------------------------------------------------------------ resolver
def check_missing_paths_refused(resolve_fn) -> None:
    """Every path-like value that does not exist is a DataError naming it (never a name, never None)."""
    for value in ("corpus.jsonl", "no/such/dir", "./digits", "~/nope-modeconn-data", "mnist.txt"):
        with pytest.raises(DataError, match="no such file") as err:
            resolve_fn(value)
        assert value in str(err.value)


def test_resolver_names_paths_and_missing_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_missing_paths_refused(user_data_path)
    (tmp_path / "digits").mkdir()  # a registered name stays a name even beside a folder of that name
    assert user_data_path("./digits") == Path("digits")
    assert user_data_path("digits") is None and user_data_path("austen") is None and user_data_path(None) is None
    assert user_data_path("mnsit") is None  # a mistyped name: refused later with the valid names
    (tmp_path / "corpus").mkdir()
    assert user_data_path("corpus") == Path("corpus")
    with pytest.raises(DataError, match="corpus.jsonl"):  # load_dataset resolves through the same function
        load_dataset("corpus.jsonl")
    with pytest.raises(ConfigError, match="unknown dataset 'mnsit'"):
        load_dataset("mnsit")


def test_negative_control_a_resolver_that_falls_back_to_names_fails_the_check():
    def falls_back(value):  # the bug the check guards against: a missing path read as a name / "not given"
        return Path(value) if value and Path(value).exists() else None

    with pytest.raises(pytest.fail.Exception):  # "DID NOT RAISE": the check catches the fallback
        check_missing_paths_refused(falls_back)


# ------------------------------------------------------------------------------------------------ formats
def _corpus_files(tmp_path: Path) -> dict[str, Path]:
    import pandas as pd

    docs = sentences(120)
    rows = [{"text": d, "id": i} for i, d in enumerate(docs)]
    files = {"txt": tmp_path / "c.txt", "jsonl": tmp_path / "c.jsonl", "json": tmp_path / "c.json",
             "csv": tmp_path / "c.csv", "parquet": tmp_path / "c.parquet"}
    files["txt"].write_text(TEXT)
    files["jsonl"].write_text("\n".join(json.dumps(r) for r in rows))
    files["json"].write_text(json.dumps(rows))
    pd.DataFrame(rows).to_csv(files["csv"], index=False)
    pd.DataFrame(rows).to_parquet(files["parquet"])
    return files


def test_every_text_format_loads_into_blocks(tmp_path, sp_tok):
    files = _corpus_files(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    for kind, path in files.items():
        b = _load(path, sp_tok, context_length=16)
        assert b.train.tensors[0].shape[1] == 16 and len(b.train) > 5 and len(b.test) >= 1, kind
        assert b.val is b.test and b.num_classes == len(sp_tok) and b.input_shape == (16,)
        x, y = b.train.tensors
        assert x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])  # labels are the inputs shifted by one
        assert "16-token blocks" in b.name and "seed 0" in b.name
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written beside the user's files
    whole = _load(files["txt"], sp_tok, context_length=16, heldout_fraction=0.5)
    ids = sp_tok(TEXT, add_special_tokens=False)["input_ids"]
    blocks = {tuple(r) for r in torch.cat([whole.train.tensors[0], whole.test.tensors[0]]).tolist()}
    assert tuple(ids[:16]) in blocks and len(blocks) == (len(ids) - 1) // 16  # the .txt file is one document


def test_seeded_heldout_fraction_and_user_splits(tmp_path, sp_tok):
    import datasets

    files = _corpus_files(tmp_path)
    a, b = (_load(files["jsonl"], sp_tok, seed=s) for s in (0, 1))
    assert torch.equal(a.test.tensors[0], _load(files["jsonl"], sp_tok, seed=0).test.tensors[0])
    assert not torch.equal(a.test.tensors[0], b.test.tensors[0])
    second = tmp_path / "held.jsonl"
    second.write_text("\n".join(json.dumps({"text": t}) for t in sentences(40, seed=7)))
    c = _load(files["jsonl"], sp_tok, split=str(second))
    assert c.options["held_out"] == str(second) and len(c.train) > len(a.train)
    ds = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": sentences(120)}),
                               "validation": datasets.Dataset.from_dict({"body": sentences(30, seed=3)})})
    ds.save_to_disk(str(tmp_path / "saved"))
    d = _load(tmp_path / "saved", sp_tok, split="validation", text_field="body")
    assert "split 'validation'" in d.name and len(d.test) >= 1
    with pytest.raises(DataError, match=r"no split 'test' \(splits present: train, validation\)"):
        _load(tmp_path / "saved", sp_tok, split="test", text_field="body")


# ------------------------------------------------------------------------------------------------ bad data
def test_bad_text_data_is_refused_naming_the_problem(tmp_path, sp_tok):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty.jsonl: the file is empty"):
        _load(empty, sp_tok)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 cr\u00e8me ".encode("latin-1") * 50)
    with pytest.raises(DataError, match=r"latin.txt: not UTF-8 text .*UTF-8"):
        _load(latin, sp_tok)
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text("\n".join(json.dumps({"body": t, "id": 1}) for t in sentences(5)))
    with pytest.raises(DataError, match=r"nofield.jsonl: no field 'text' \(fields present: body, id\)"):
        _load(nofield, sp_tok)
    short = tmp_path / "short.txt"
    short.write_text("the fox.")
    with pytest.raises(DataError, match="short.txt: .* fewer than one block of context_length=64"):
        _load(short, sp_tok)
    with pytest.raises(ConfigError, match="longer than the model's positions"):
        _load(short, sp_tok, context_length=65)
    with pytest.raises(DataError, match="a single file has none"):
        _load(nofield, sp_tok, split="validation", text_field="body")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0")
    with pytest.raises(DataError, match="neither a text corpus"):
        _load(odd, sp_tok)
    with pytest.raises(ConfigError, match="tokenized with the model's own tokenizer"):
        load_user_dataset(short)


# ------------------------------------------------------------------------------------------------ tokenizers
def test_sentencepiece_and_bpe_file_tokenizers(tmp_path, sp_tok):
    sp = tmp_path / "sp"
    sentencepiece_dir(sp, TEXT)
    assert sorted(p.name for p in sp.iterdir()) == ["tokenizer.model", "tokenizer_config.json"]
    tok = load_checkpoint_tokenizer(sp)
    assert tok("the quick fox", add_special_tokens=False)["input_ids"] == sp_tok("the quick fox",
                                                                                  add_special_tokens=False)["input_ids"]
    assert tok.decode(tok("the quick fox", add_special_tokens=False)["input_ids"]) == "the quick fox"
    from modeconn.data.user_text import load_fast_tokenizer  # what a registered text dataset (austen) encodes with

    fast = load_fast_tokenizer(sp)
    assert fast.encode("the quick fox", add_special_tokens=False).ids == tok("the quick fox",
                                                                              add_special_tokens=False)["input_ids"]
    bpe = load_checkpoint_tokenizer(bpe_files_dir(tmp_path / "bpe", TEXT))
    (tmp_path / "files").mkdir()
    files = _corpus_files(tmp_path / "files")
    b = _load(files["csv"], bpe, context_length=8)
    assert len(b.train) > 10 and int(b.train.tensors[0].max()) < len(bpe)
    (tmp_path / "none").mkdir()
    with pytest.raises(DataError, match="none: no tokenizer AutoTokenizer can read"):
        load_checkpoint_tokenizer(tmp_path / "none")


# ------------------------------------------------------------------------------------------------ images
def _images(n: int = 24, size: int = 8, classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, size, size), dtype=np.uint8), np.arange(n) % classes


def test_image_folder_loads_checks_the_head_and_maps_named_classes(tmp_path):
    x, y = _images()
    root = write_pngs(tmp_path / "imgs", x, y, ["cat", "dog", "emu"])
    b = load_image_folder(root, ImageHead(3), input_shape=(1, 8, 8))
    assert len(b.train) + len(b.test) == 24 and b.train.tensors[0].shape[1:] == (1, 8, 8)
    assert "0.1 of the images, seed 0" in b.name and b.classes == ("cat", "dog", "emu")
    assert torch.allclose(torch.cat([b.train.tensors[0], b.test.tensors[0]]).sum(),
                          torch.tensor(x / 255.0, dtype=torch.float32).sum(), rtol=1e-4)
    named = load_image_folder(root, ImageHead(3, ("emu", "cat", "dog")), input_shape=(1, 8, 8))
    to_head = torch.tensor([1, 2, 0])  # folder cat (sorted 0) is the head's class 1, dog 2, emu 0
    assert torch.equal(named.train.tensors[1], to_head[b.train.tensors[1]]) and named.classes == ("emu", "cat", "dog")
    with pytest.raises(DataError, match=r"3 class folders \(cat, dog, emu\) but the model's head has 10 classes"):
        load_image_folder(root, ImageHead(10), input_shape=(1, 8, 8))
    with pytest.raises(DataError, match=r"do not match the classes of .*\(ant, bee, cow\)"):
        load_image_folder(root, ImageHead(3, ("ant", "bee", "cow")))
    with pytest.raises(DataError, match=r"gives an input of shape \(1, 8, 8\) but the model takes \(1, 28, 28\)"):
        load_image_folder(root, ImageHead(3), input_shape=(1, 28, 28))


def test_image_folder_train_test_layout_and_checkpoint_preprocessing(tmp_path):
    from transformers import ViTImageProcessor

    x, y = _images(18)
    write_pngs(tmp_path / "split" / "train", x[:12], y[:12], ["a", "b", "c"])
    write_pngs(tmp_path / "split" / "val", x[12:], y[12:], ["a", "b", "c"])
    b = load_image_folder(tmp_path / "split", ImageHead(3))
    assert (len(b.train), len(b.test)) == (12, 6) and "val/ folder" in b.name
    hf = tmp_path / "vit"
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(hf)
    config = {"num_labels": 3, "id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}}
    assert head_from_config(config).class_names is None
    assert head_from_config({"num_labels": 2, "id2label": {"1": "dog", "0": "cat"}}).class_names == ("cat", "dog")
    assert head_from_config({"architecture": "resnet18d", "num_classes": 4}).num_classes == 4  # timm's config.json
    assert head_from_config({"architectures": ["LlamaModel"]}) is None
    v = image_folder_for_checkpoint(hf, config, tmp_path / "split", input_shape=(3, 16, 16))
    assert v.train.tensors[0].shape[1:] == (3, 16, 16)
    timm_cfg = {"num_classes": 3, "label_names": ["a", "b", "c"],
                "pretrained_cfg": {"input_size": [1, 12, 12], "mean": [0.5], "std": [0.25], "crop_pct": 1.0,
                                   "interpolation": "bilinear"}}
    t = image_folder_for_checkpoint(None, timm_cfg, tmp_path / "split")
    assert t.train.tensors[0].shape[1:] == (1, 12, 12) and float(t.train.tensors[0].min()) >= -2.0 - 1e-6
    assert "timm pretrained_cfg: input_size (1, 12, 12), bilinear" in t.name and "ViTImageProcessor" in v.name
    with pytest.raises(ConfigError, match="--context-length apply to text corpora"):
        load_user_dataset(tmp_path / "split", head=ImageHead(3), options=UserDataOptions(context_length=8))
