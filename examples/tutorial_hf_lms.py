"""Tutorial: two Hugging Face causal LMs of your own, your own text, through modeconn's command line.

Two small Llama-style causal LMs are trained from different seeds in a plain PyTorch loop on Jane Austen's novels,
with a SentencePiece tokenizer trained on the same text, and saved with ``save_pretrained`` — what a user holds. The
text is written as a ``.jsonl`` corpus (one paragraph per line). Then, from the command line:

1. ``check`` — will they merge? (relationship, identifiability, predicted barriers);
2. ``barrier`` — naive vs weight-matched vs activation-matched loss barriers on the held-out text;
3. ``align --method dual`` — dual learned matching (LMC-DM): both endpoints transformed; Llama's RMSNorm lets
   them be written as stock checkpoints, and ``barrier`` on them measures the dual-matched barrier;
4. ``merge --align activation`` — the merge, scored on the held-out text;
5. ``eval`` — perplexity, and a local lm-evaluation-harness task (a YAML task over a local ``.jsonl``; no network);
6. ``from_pretrained`` + ``generate`` on the merged model.

Run it: ``python examples/tutorial_hf_lms.py OUT_DIR [--quick]`` (``--quick``: the small size the test suite runs).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import transformers as T

from cli_helpers import choice_task, modeconn, run_tutorial


def austen_paragraphs(limit_chars: int) -> list[str]:
    """Paragraphs of the bundled Austen text (modeconn's copy), at most ``limit_chars`` characters in all."""
    from modeconn.data.locate import find_data_dir
    from modeconn.data.text import read_text_file

    text = read_text_file(find_data_dir("austen") / "austen.txt.gz", None)[:limit_chars]
    return [" ".join(p.split()) for p in text.split("\n\n") if len(p.split()) > 5]


def tokenizer_dir(directory: Path, paragraphs: list[str], vocab_size: int) -> T.PreTrainedTokenizerBase:
    """A SentencePiece tokenizer trained on the text, in the layout Llama repositories ship it (``tokenizer.model`` and
    ``tokenizer_config.json``; no ``tokenizer.json``)."""
    import sentencepiece as spm

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.txt").write_text("\n".join(paragraphs))
    spm.SentencePieceTrainer.train(input=str(directory / "train.txt"), model_prefix=str(directory / "sp"),
                                   vocab_size=vocab_size, model_type="unigram", unk_id=0, bos_id=1, eos_id=2,
                                   pad_id=-1, minloglevel=2, num_threads=1)
    (directory / "sp.model").rename(directory / "tokenizer.model")
    for extra in ("sp.vocab", "train.txt"):
        (directory / extra).unlink()
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    return T.AutoTokenizer.from_pretrained(directory)


def train(seed: int, ids: torch.Tensor, vocab: int, steps: int) -> T.LlamaForCausalLM:
    """A plain PyTorch loop: AdamW on random 64-token windows of the token stream."""
    torch.manual_seed(seed)
    cfg = T.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                        num_hidden_layers=2, vocab_size=vocab, max_position_embeddings=64, bos_token_id=1,
                        eos_token_id=2, tie_word_embeddings=False)
    model = T.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, len(ids) - 65, (16,), generator=gen)
        batch = torch.stack([ids[s:s + 64] for s in start.tolist()])
        opt.zero_grad()
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
    return model.eval()


def main(out: Path, quick: bool) -> dict:
    paragraphs = austen_paragraphs(60_000 if quick else 600_000)
    corpus = out / "austen.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    corpus.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs))
    tok = tokenizer_dir(out / "tokenizer", paragraphs, 300 if quick else 1000)
    ids = torch.tensor(tok("\n".join(paragraphs))["input_ids"])
    for seed, name in ((0, "lm-a"), (1, "lm-b")):
        train(seed, ids, len(tok), 30 if quick else 600).save_pretrained(out / name)
        for f in (out / "tokenizer").iterdir():  # the SentencePiece files travel with each model
            shutil.copy(f, out / name / f.name)
    a, b = out / "lm-a", out / "lm-b"
    limit = ["--limit-train", "64"] if quick else []
    modeconn("check", a, b, "--dataset", corpus, "--max-batches", "2", *limit, "--out", out / "check")
    modeconn("barrier", a, b, "--dataset", corpus, "--method", "naive", "--method", "weight", "--method", "activation",
             "--lambdas", "5", *limit, "--out", out / "barrier")
    modeconn("align", a, b, "--method", "dual", "--dataset", corpus, "--steps", "5" if quick else "100", *limit,
             "--out", out / "dual")
    modeconn("barrier", out / "dual" / "a", out / "dual" / "b", "--dataset", corpus, "--method", "naive",
             "--lambdas", "5", *limit, "--out", out / "barrier-dual")
    modeconn("merge", a, b, "--align", "activation", "--dataset", corpus, *limit, "--out", out / "merged")
    tasks = choice_task(out / "tasks", "austen_choice", paragraphs)
    modeconn("eval", out / "merged", "--dataset", corpus, "--tasks", "austen_choice", "--include-path", tasks,
             "--out", out / "eval")
    merged = T.AutoModelForCausalLM.from_pretrained(out / "merged")
    tokenizer = T.AutoTokenizer.from_pretrained(out / "merged")
    prompt = tokenizer("It is a truth universally", return_tensors="pt")
    text = tokenizer.decode(merged.generate(**prompt, max_new_tokens=12, do_sample=False)[0])
    print("merged model:", text)
    return {name: json.loads((out / name / "results.json").read_text())
            for name in ("check", "barrier", "barrier-dual", "eval")} | {"generated": text}


if __name__ == "__main__":
    run_tutorial(main, __doc__)
