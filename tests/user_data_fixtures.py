"""Tiny user data and tokenizer directories written by the user-data tests (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = ("the quick brown fox jumps over a lazy dog while seven wise owls watch the moon rise above quiet hills "
         "and rivers run to the sea").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` deterministic short sentences of :data:`WORDS`."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 14)))) + "." for _ in range(n)]


def sentencepiece_dir(directory: Path, text: str, vocab_size: int = 60) -> Path:
    """A directory holding only a SentencePiece ``tokenizer.model`` (+ ``tokenizer_config.json`` naming the class,
    as Llama repositories ship it) — no ``tokenizer.json``."""
    import sentencepiece as spm

    directory.mkdir(parents=True, exist_ok=True)
    corpus = directory / "sp_train.txt"
    corpus.write_text(text)
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(directory / "sp"), vocab_size=vocab_size,
                                   model_type="unigram", unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
                                   hard_vocab_limit=False, num_threads=1)
    (directory / "sp.model").rename(directory / "tokenizer.model")
    for extra in ("sp.vocab", "sp_train.txt"):
        (directory / extra).unlink()
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    return directory


def bpe_files_dir(directory: Path, text: str) -> Path:
    """A directory holding GPT-2 style BPE ``vocab.json`` + ``merges.txt`` (+ ``tokenizer_config.json``) only."""
    from tokenizers import ByteLevelBPETokenizer

    directory.mkdir(parents=True, exist_ok=True)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(text.splitlines(), vocab_size=300, min_frequency=2, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    tok.save_model(str(directory))
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    return directory


def write_pngs(root: Path, images: np.ndarray, labels: np.ndarray, names: list[str]) -> Path:
    """``root/<names[label]>/<i>.png`` for uint8 ``images`` (N, H, W) or (N, H, W, 3)."""
    from PIL import Image

    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = root / names[int(label)]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:04d}.png")
    return root


def _causal_config(family: str):
    import transformers as T

    common = dict(num_hidden_layers=2, vocab_size=64, max_position_embeddings=32, bos_token_id=1, eos_token_id=2)
    configs = {
        "llama": lambda: T.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=64, **common),
        "qwen2": lambda: T.Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=64, **common),
        "gpt_neox": lambda: T.GPTNeoXConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64,
                                            rotary_pct=0.5, **common),
    }
    return configs[family]()


def tiny_causal_lms(root: Path, family: str = "llama") -> tuple[list[Path], Path]:
    """Two random tiny causal LMs of ``family`` (llama, qwen2, gpt_neox) sharing a SentencePiece ``tokenizer.model``
    (no ``tokenizer.json``), and a ``.jsonl`` corpus: ``([dir A, dir B], corpus)``."""
    import shutil

    import torch
    import transformers as T

    from hf_tiny import randomize

    sp = sentencepiece_dir(root / "sp", "\n".join(sentences(200)))
    cfg = _causal_config(family)
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        d = root / f"lm{seed}"
        randomize(T.AutoModelForCausalLM.from_config(cfg), seed).save_pretrained(d)
        for f in sp.iterdir():
            shutil.copy(f, d / f.name)
        assert not (d / "tokenizer.json").exists()
        dirs.append(d)
    corpus = root / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t, "n": i}) for i, t in enumerate(sentences(150, seed=5))))
    return dirs, corpus


def tiny_llamas(root: Path) -> tuple[list[Path], Path]:
    """Two random tiny Llamas sharing a SentencePiece ``tokenizer.model`` (no ``tokenizer.json``), and a ``.jsonl``
    corpus: ``([dir A, dir B], corpus)``."""
    return tiny_causal_lms(root, "llama")


ENCODER_LABELS = ("calm", "busy", "odd")


def wordpiece_dir(directory: Path) -> Path:
    """A directory holding a BERT WordPiece ``vocab.txt`` of :data:`WORDS` (+ ``tokenizer_config.json``) only."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *sorted(set(WORDS))]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                                 "do_lower_case": True}))
    return directory


def tiny_berts(root: Path, head: str) -> tuple[list[Path], Path]:
    """Two random tiny BERTs (``head``: ``"masked_lm"`` or ``"classifier"`` — three classes named
    :data:`ENCODER_LABELS`) sharing a WordPiece vocabulary, and a ``.jsonl`` corpus of texts with a ``label`` field
    (class names): ``([dir A, dir B], corpus)``."""
    import shutil

    import torch
    import transformers as T

    from hf_tiny import randomize

    wp = wordpiece_dir(root / "wp")
    n_vocab = len((wp / "vocab.txt").read_text().split())
    cfg = T.BertConfig(vocab_size=n_vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=64, num_labels=len(ENCODER_LABELS),
                       id2label=dict(enumerate(ENCODER_LABELS)), label2id={n: i for i, n in enumerate(ENCODER_LABELS)},
                       pad_token_id=0)
    cls = T.BertForMaskedLM if head == "masked_lm" else T.BertForSequenceClassification
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        d = root / f"{head}{seed}"
        randomize(cls(cfg), seed).save_pretrained(d)
        for f in wp.iterdir():
            shutil.copy(f, d / f.name)
        dirs.append(d)
    corpus = root / "labelled.jsonl"
    texts = sentences(90, seed=7)
    corpus.write_text("\n".join(json.dumps({"text": t, "label": ENCODER_LABELS[len(t.split()) % 3]}) for t in texts))
    return dirs, corpus
