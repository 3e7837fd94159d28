"""Tutorial: Dual matching (LMC-DM) of two Pythia-shaped language models, from the command line.

Two GPT-NeoX causal LMs shaped like Pythia (4 layers × 256, 8 heads, parallel residual, rotary on a quarter of each
head; the quick size is smaller) are trained from different seeds in a plain PyTorch loop on Jane Austen's novels, with
a byte-level BPE tokenizer trained on the same text, and saved with ``save_pretrained``. The text is written as two
files: the training part and a held-out part (``--split``). Then, from the command line:

1. ``check`` — will they merge? (relationship, identifiability, predicted barriers);
2. ``align --method weight --groups full`` — weight matching with the full transformer group (both endpoints absorbed:
   orthogonal residual, head permutations with per-head QK/OV maps, FFN permutations);
3. ``align --method dual`` — dual learned matching: the continuous transforms learned on the training text;
4. ``barrier`` on the held-out file — naive (the checkpoints as trained), and between the endpoints each alignment
   wrote: how much of the barrier each removes;
5. ``merge --align dual --eval TASK`` — the dual-matched endpoints merged, scored on the held-out text and on a local
   lm-evaluation-harness task (a YAML task over a local ``.jsonl``; no network);
6. ``eval`` of the merge, then ``generate`` with it. GPT-NeoX normalises with LayerNorm, which cannot hold the rotated
   model, so the merge is an *absorbed* checkpoint: ``modeconn.symmetry.load_absorbed`` loads it (stock
   ``from_pretrained`` refuses it); RMSNorm families (Llama, Mistral, Qwen) are written as stock checkpoints instead.

Run it: ``python examples/tutorial_pythia_dual.py OUT_DIR [--quick]`` (``--quick``: the small size the test suite
runs). The full size's measured barriers are in the docs' results (Pythia-shaped dual matching from the command
line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import transformers as T

from cli_helpers import choice_task, modeconn, run_tutorial

SIZES = {"quick": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
         "full": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024)}
TRAINING = {"quick": dict(chars=80_000, vocab=512, steps=40, learn=5),
            "full": dict(chars=4_000_000, vocab=2048, steps=300, learn=100)}
CONTEXT = 128


def austen_text(limit_chars: int) -> str:
    """The bundled Austen text (modeconn's copy), its first ``limit_chars`` characters."""
    from modeconn.data.locate import find_data_dir
    from modeconn.data.text import read_text_file

    return read_text_file(find_data_dir("austen") / "austen.txt.gz", None)[:limit_chars]


def paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in text.split("\n\n") if len(p.split()) > 5]


def tokenizer(text: str, vocab: int) -> T.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the text (``tokenizers``), as a transformers fast tokenizer."""
    from modeconn.data import train_tokenizer

    tok = train_tokenizer(text, vocab)
    eos = tok.id_to_token(0)
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos)


def train(seed: int, ids: torch.Tensor, vocab: int, size: dict, steps: int) -> T.GPTNeoXForCausalLM:
    """A plain PyTorch loop: AdamW (cosine schedule) on random 128-token windows of the token stream."""
    torch.manual_seed(seed)
    cfg = T.GPTNeoXConfig(vocab_size=vocab, max_position_embeddings=CONTEXT, rotary_pct=0.25,
                          use_parallel_residual=True, bos_token_id=0, eos_token_id=0, pad_token_id=0, **size)
    model = T.GPTNeoXForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, len(ids) - CONTEXT - 1, (32,), generator=gen)
        batch = torch.stack([ids[s:s + CONTEXT] for s in start.tolist()])
        opt.zero_grad()
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
        sched.step()
    return model.eval()


def barrier_of(out: Path) -> float:
    return json.loads((out / "results.json").read_text())["barriers"]["naive"]["test"]["barrier_mean_loss"]


def main(out: Path, quick: bool) -> dict:
    size = "quick" if quick else "full"
    budget = TRAINING[size]
    out.mkdir(parents=True, exist_ok=True)
    text = austen_text(budget["chars"])
    cut = int(0.9 * len(text))
    train_text, held_text = text[:cut], text[cut:]
    (out / "train.txt").write_text(train_text)
    (out / "heldout.txt").write_text(held_text)
    tok = tokenizer(train_text, budget["vocab"])
    ids = torch.tensor(tok(train_text)["input_ids"])
    for seed, name in ((0, "pythia-a"), (1, "pythia-b")):
        train(seed, ids, len(tok), SIZES[size], budget["steps"]).save_pretrained(out / name)
        tok.save_pretrained(out / name)
    a, b = out / "pythia-a", out / "pythia-b"
    data = ["--dataset", out / "train.txt", "--split", out / "heldout.txt", "--context-length", str(CONTEXT)]
    limit = ["--limit-train", "64"] if quick else []
    learn = ["-o", f"steps={budget['learn']}"]
    modeconn("check", a, b, *data, "--max-batches", "2", *limit, "--out", out / "check")
    modeconn("align", a, b, "--method", "weight", "--groups", "full", "--out", out / "wm")
    modeconn("align", a, b, "--method", "dual", *data, "--steps", str(budget["learn"]), *limit, "--out", out / "dual")
    for name, (x, y) in {"naive": (a, b), "wm": (out / "wm" / "a", out / "wm" / "b"),
                         "dual": (out / "dual" / "a", out / "dual" / "b")}.items():
        modeconn("barrier", x, y, *data, "--method", "naive", "--lambdas", "3" if quick else "11", *limit,
                 "--eval-limit", "200", "--out", out / f"barrier-{name}")
    tasks = choice_task(out / "tasks", "austen_next", paragraphs(held_text))
    modeconn("merge", a, b, "--align", "dual", *data, *learn, *limit, "--eval", "austen_next", "--include-path", tasks,
             "--out", out / "merged")
    modeconn("eval", out / "merged", *data, "--out", out / "eval")

    from modeconn.symmetry import load_absorbed

    merged = load_absorbed(out / "merged").eval()
    prompt = tok("It is a truth universally", return_tensors="pt")
    text = tok.decode(merged.generate(**prompt, max_new_tokens=12, do_sample=False)[0])
    print("merged model:", text)
    barriers = {name: barrier_of(out / f"barrier-{name}") for name in ("naive", "wm", "dual")}
    print("held-out barrier_mean (nats/token):", json.dumps(barriers))
    return {"barriers": barriers, "merge": json.loads((out / "merged" / "merge.json").read_text()),
            "eval": json.loads((out / "eval" / "results.json").read_text()), "generated": text}


def summary(out: Path) -> dict:
    """The numbers of a finished run in ``out``: held-out barriers through the command line, their ratios, the
    endpoints' held-out loss, the merge's scores, and what ran."""
    import platform
    from datetime import date

    barriers = {name: barrier_of(out / f"barrier-{name}") for name in ("naive", "wm", "dual")}
    naive = json.loads((out / "barrier-naive" / "results.json").read_text())["barriers"]["naive"]["test"]
    merge = json.loads((out / "merged" / "merge.json").read_text())
    config = json.loads((out / "pythia-a" / "config.json").read_text())
    return {"date": date.today().isoformat(), "torch": torch.__version__, "transformers": T.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
            "model": {k: config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                             "intermediate_size", "vocab_size")},
            "training": TRAINING["full"], "barrier_mean": barriers,
            "dual_over_wm": barriers["dual"] / barriers["wm"], "dual_over_naive": barriers["dual"] / barriers["naive"],
            "endpoint_loss": naive["endpoint_loss"], "merge": {"test": merge["test"], "format": merge["format"],
                                                               "lm_eval": merge.get("lm_eval", {}).get("tasks", {})}}


def report(s: dict) -> str:
    """A markdown report of :func:`summary`."""
    m = s["model"]
    shape = (f"{m['num_hidden_layers']} layers × {m['hidden_size']}, {m['num_attention_heads']} heads, MLP "
             f"{m['intermediate_size']}, vocabulary {m['vocab_size']}")
    rows = "\n".join(f"| {name} | {b:.4f} | {b / s['barrier_mean']['naive']:.3f} |"
                     for name, b in s["barrier_mean"].items())
    scores = ", ".join(f"{t}: " + ", ".join(f"{k} {v:.4f}" for k, v in met.items())
                       for t, met in s["merge"]["lm_eval"].items())
    test = s["merge"]["test"]
    return (f"# Dual matching of two Pythia-shaped language models, from the command line\n\n"
            f"GPT-NeoX pair ({shape}; parallel residual, rotary on a quarter of each head), trained from seeds 0 and 1 "
            f"for {s['training']['steps']} AdamW steps of 32 × 128 tokens on the first 90 % of 4 M characters of the "
            f"Austen text, saved with `save_pretrained` (`examples/tutorial_pythia_dual.py`, full size). Held-out loss "
            f"of the endpoints: {s['endpoint_loss'][0]:.4f} / {s['endpoint_loss'][1]:.4f} nats per token.\n\n"
            f"Barriers: `modeconn barrier --method naive` on the held-out file (`--split`, 200 blocks of 128 tokens, "
            f"11 points), test-loss `barrier_mean` in nats per token, between the checkpoints as trained (naive), the "
            f"endpoints `align --method weight --groups full` wrote (wm) and those `align --method dual` wrote "
            f"({s['training']['learn']} steps; dual).\n\n| pair | barrier_mean | ÷ naive |\n|---|---|---|\n{rows}\n\n"
            f"dual ÷ wm: {s['dual_over_wm']:.3f}.\n\n`merge --align dual` (weights ½, ½; written as an "
            f"{s['merge']['format']} checkpoint): held-out loss {test['loss']:.4f} nats per token, perplexity "
            f"{test['perplexity']:.2f}; lm-eval (a local task: a held-out sentence's next three words against another "
            f"paragraph's) {scores}.\n\nRan on {s['date']} with torch {s['torch']}, transformers "
            f"{s['transformers']}, {s['machine']}.\n")


if __name__ == "__main__":
    run_tutorial(main, __doc__)
