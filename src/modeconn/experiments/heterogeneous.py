"""`modeconn experiment heterogeneous`: merging what shares no base — Mixture-of-Experts pairs, experts from dense
models, models of different widths — against the natural baselines, aligned and not.

Three parts, each on the data named (held-out losses in nats per token, accuracies as fractions):

(a) **MoE pair**: two Mixtral-style LMs trained from different seeds on the Austen text, merged by the plain average
    and after weight matching (experts with their router rows, hidden units per expert, residual and attention).
(b) **Dense → MoE** (:func:`modeconn.dense_to_moe`): two Llama-style LMs trained on different halves of the Austen
    text (different novels), in two settings: *branched* (Branch-Train-MiX: a common pre-training on both halves, then
    each branch trained on its half) and *independent* (different initialisations, each trained on its half). Each
    pair becomes a Mixtral (each dense FFN one expert, the rest averaged, the router from the data, then with
    router-only training), unaligned, aligned with permutations and with the full group; baselines: each dense model,
    the plain average of the two and their average after weight matching (permutations).
(c) **Widths** (:func:`modeconn.path.width.merge_widths`): an MLP pair of two widths on MNIST fused into the narrower
    width against the plain average of width-matched truncations (the widths experiment's case).

Writes ``results.json`` and ``report.md``.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..report import markdown_table
from .output import output_directory, write_results
from .registry import Experiment, Log, register_experiment, size_label
from .widths import Case, WidthsSize, run_case


@dataclass(frozen=True)
class LMSize:
    """A tiny causal LM and its training: ``steps`` AdamW steps of ``batch`` × ``context`` tokens; ``common``: of
    them, the steps of the branched setting's common pre-training."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 192
    steps: int = 600
    common: int = 300
    batch: int = 16
    lr: float = 3e-3


@dataclass(frozen=True)
class HeterogeneousSize:
    chars: int = 1_200_000
    vocab: int = 512
    context: int = 64
    eval_blocks: int = 64
    dense: LMSize = LMSize()
    moe: LMSize = LMSize(intermediate=96, steps=400)
    experts: int = 4
    router_steps: int = 100
    shared_steps: int = 200  # training of the MoE's router and averaged tensors, experts frozen (a third of a dense run)
    shared_lr: float = 3e-3
    router_blocks: int | None = 1024  # training windows per model for the router's statistics (None: all)
    within: float = 0.05  # the MoE's held-out loss within this fraction of each half's own dense model
    widths: Case = Case("mlp", "mlp", "mnist", (256, 512), {"depth": 3}, epochs=1, limit_train=20_000)


SIZES = {
    "quick": HeterogeneousSize(chars=40_000, vocab=300, context=32, eval_blocks=8,
                               dense=LMSize(hidden=32, intermediate=48, steps=30, common=15, batch=8),
                               moe=LMSize(hidden=32, intermediate=24, steps=20, batch=8), experts=2, router_steps=3,
                               shared_steps=3,
                               router_blocks=16,
                               widths=Case("mlp", "mlp", "mnist", (32, 64), {"depth": 2}, epochs=1, limit_train=1000,
                                           limit_test=300)),
    "full": HeterogeneousSize(),
}


@dataclass(frozen=True)
class Corpus:
    """The Austen text's two halves as token ids, each split 90 / 10 into training and held-out windows."""

    train: tuple[torch.Tensor, torch.Tensor]
    heldout: tuple[torch.Tensor, torch.Tensor]
    vocab: int


def austen_halves(size: HeterogeneousSize, data) -> Corpus:
    """The first ``size.chars`` characters, halved (different novels); one byte-level BPE tokenizer trained on the
    training parts of both."""
    from ..data import train_tokenizer
    from ..data.locate import find_data_dir
    from ..data.text import read_text_file

    text = read_text_file(find_data_dir("austen", data) / "austen.txt.gz", None)[:size.chars]
    halves = (text[:len(text) // 2], text[len(text) // 2:])
    parts = [(h[:int(0.9 * len(h))], h[int(0.9 * len(h)):]) for h in halves]
    tok = train_tokenizer("".join(t for t, _ in parts), size.vocab)

    def ids(s: str) -> torch.Tensor:
        return torch.tensor(tok.encode(s).ids, dtype=torch.long)

    return Corpus(tuple(ids(t) for t, _ in parts), tuple(ids(h) for _, h in parts), tok.get_vocab_size())


def lm_config(kind: str, size: HeterogeneousSize, lm: LMSize, vocab: int):
    import transformers as T

    common = dict(vocab_size=vocab, hidden_size=lm.hidden, num_hidden_layers=lm.layers,
                  num_attention_heads=lm.heads, num_key_value_heads=lm.kv_heads, intermediate_size=lm.intermediate,
                  max_position_embeddings=size.context, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if kind == "mixtral":
        return T.MixtralConfig(num_local_experts=size.experts, num_experts_per_tok=2, output_router_logits=True,
                               router_aux_loss_coef=0.01, **common)
    return T.LlamaConfig(**common)


def train_lm(config, ids: torch.Tensor, lm: LMSize, steps: int, seed: int, context: int, init=None):
    """AdamW (cosine schedule) on random ``context``-token windows of ``ids``, from ``init``'s weights if given."""
    import transformers as T

    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    if init is not None:
        model.load_state_dict(init.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=lm.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        start = torch.randint(0, len(ids) - context - 1, (lm.batch,), generator=gen)
        x = torch.stack([ids[s:s + context] for s in start.tolist()])
        opt.zero_grad()
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        sched.step()
    model.config.output_router_logits = False
    return model.eval()


def windows(ids: torch.Tensor, context: int, count: int | None = None) -> torch.Tensor:
    """Non-overlapping ``context``-token windows of ``ids`` (the first ``count``)."""
    n = len(ids) // context if count is None else min(count, len(ids) // context)
    return ids[:n * context].reshape(n, context)


def heldout_loss(model, blocks: torch.Tensor) -> float:
    """Mean next-token loss (nats per token) of ``model`` (or a checkpoint directory) on ``blocks``."""
    import transformers as T

    if not isinstance(model, torch.nn.Module):
        model = T.AutoModelForCausalLM.from_pretrained(model, trust_remote_code=False).eval()
    with torch.no_grad():
        return sum(float(model(input_ids=blocks[i:i + 16], labels=blocks[i:i + 16]).loss) * len(blocks[i:i + 16])
                   for i in range(0, len(blocks), 16)) / len(blocks)


def _average(paths: list[Path], out: Path, aligned: bool) -> Path:
    """The plain (or weight-matched) average of two Hugging Face checkpoints, written to ``out``."""
    from ..stream import hf_checkpoint_spec, stream_merge, stream_weight_matching

    spec = hf_checkpoint_spec(paths[0])
    element = stream_weight_matching(spec, paths[0], paths[1]).element if aligned else None
    stream_merge(spec, paths, out, elements=[None, element])
    return out


def moe_pair(size: HeterogeneousSize, corpus: Corpus, root: Path, log: Log) -> dict[str, Any]:
    """(a): two Mixtral-style LMs on both halves, their plain and aligned averages, held-out loss on both halves."""
    ids = torch.cat(corpus.train)
    held = torch.cat([windows(h, size.context, size.eval_blocks // 2) for h in corpus.heldout])
    config = lm_config("mixtral", size, size.moe, corpus.vocab)
    paths = []
    for seed in (0, 1):
        paths.append(root / f"mixtral-{seed}")
        train_lm(config, ids, size.moe, size.moe.steps, seed, size.context).save_pretrained(paths[-1])
    loss = {"A": heldout_loss(paths[0], held), "B": heldout_loss(paths[1], held),
            "plain average": heldout_loss(_average(paths, root / "mixtral-avg", False), held),
            "aligned average": heldout_loss(_average(paths, root / "mixtral-wm", True), held)}
    log("MoE pair: " + ", ".join(f"{k} {v:.4f}" for k, v in loss.items()))
    return {"heldout_loss": loss}


def dense_pair(setting: str, size: HeterogeneousSize, corpus: Corpus, root: Path, log: Log) -> list[Path]:
    """Two Llama-style LMs, A on the first half and B on the second: ``branched`` from one common pre-training on
    both halves, or ``independent`` from seeds 0 and 1."""
    lm, config = size.dense, lm_config("llama", size, size.dense, corpus.vocab)
    seed_model = None
    steps = lm.steps
    if setting == "branched":
        seed_model = train_lm(config, torch.cat(corpus.train), lm, lm.common, 100, size.context)
        steps = lm.steps - lm.common
    paths = []
    for i, ids in enumerate(corpus.train):
        paths.append(root / f"{setting}-{'AB'[i]}")
        train_lm(config, ids, lm, steps, i, size.context, init=seed_model).save_pretrained(paths[-1])
    return paths


ALIGNMENTS = {"none": "unaligned", "weight": "permutations", "full": "full group"}
"""The MoE rows' alignments (:func:`modeconn.dense_to_moe`'s ``align``) and their labels."""


def _moe_trainings(size: HeterogeneousSize) -> dict[str, dict[str, int]]:
    """The MoE rows' trainings after the router's initialisation, by label: none, router-only, router and shared
    parts (from the data-initialised router)."""
    return {"router from data": {}, f"router + {size.router_steps} steps": {"router_steps": size.router_steps},
            f"shared + {size.shared_steps} steps": {"shared_steps": size.shared_steps}}


def _trained(path: Path, data: list[torch.Tensor], size: HeterogeneousSize):
    """The dense checkpoint at ``path`` trained on ``data`` as the MoE's shared parts are (every tensor)."""
    import transformers as T

    from ..moe import train_part

    model = T.AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False).float()
    train_part(model, data, size.shared_steps, part="all", lr=size.shared_lr)
    return model


def dense_to_moe_rows(setting: str, size: HeterogeneousSize, corpus: Corpus, root: Path, log: Log) -> dict[str, Any]:
    """(b) for one setting: held-out loss on each half of the dense models, their plain average and the MoEs."""
    from ..moe import dense_to_moe

    paths = dense_pair(setting, size, corpus, root, log)
    held = [windows(h, size.context, size.eval_blocks) for h in corpus.heldout]
    own = [windows(t, size.context, size.router_blocks) for t in corpus.train]
    models = {"A (first half)": paths[0], "B (second half)": paths[1],
              "plain average": _average(paths, root / f"{setting}-avg", False),
              "aligned average": _average(paths, root / f"{setting}-wm", True)}
    for name in ("plain average", "aligned average"):  # the control: as much training, every tensor, no MoE
        models[f"{name} + {size.shared_steps} steps"] = _trained(models[name], own, size)
    for align, label in ALIGNMENTS.items():
        for kind, kwargs in _moe_trainings(size).items():
            out = root / f"{setting}-moe-{align}-{len(models)}"
            dense_to_moe(paths, out, data=own, align=align, shared_lr=size.shared_lr, **kwargs)
            models[f"MoE, {label}, {kind}"] = out
    loss = {name: [heldout_loss(p, h) for h in held] for name, p in models.items()}
    log(f"dense → MoE ({setting}): " + "; ".join(f"{k} {v[0]:.4f} / {v[1]:.4f}" for k, v in loss.items()))
    return {"heldout_loss": loss}


def moe_claims(rows: dict[str, list[float]], within: float) -> dict[str, dict[str, bool]]:
    """Per MoE row: on both halves within ``within`` of that half's own dense model, and below the plain average."""
    own = [rows["A (first half)"][0], rows["B (second half)"][1]]
    avg = rows["plain average"]
    return {name: {f"within {within:.0%} of own dense on both halves": all(v[h] <= (1 + within) * own[h]
                                                                          for h in (0, 1)),
                   "below the plain average on both halves": all(v[h] < avg[h] for h in (0, 1))}
            for name, v in rows.items() if name.startswith("MoE")}


def run_heterogeneous(out: str | Path, *, size: HeterogeneousSize | None = None, data: str | Path | None = None,
                      overwrite: bool = False, log: Log = print) -> dict[str, Any]:
    """Run (a), (b) and (c) (module docstring); writes ``results.json`` and ``report.md`` into ``out``."""
    size = size or SIZES["full"]
    start = time.perf_counter()
    with output_directory(out, overwrite) as tmp, tempfile.TemporaryDirectory(prefix="modeconn-hetero-") as work:
        root = Path(work)
        corpus = austen_halves(size, data)
        results = {"task": "heterogeneous merging", "size": size_label(SIZES, size), "settings": asdict(size),
                   "tokens": {"train": [len(t) for t in corpus.train], "heldout": [len(h) for h in corpus.heldout]},
                   "moe_pair": moe_pair(size, corpus, root, log),
                   "dense_to_moe": {s: dense_to_moe_rows(s, size, corpus, root, log)
                                    for s in ("branched", "independent")},
                   "widths": run_case(size.widths, WidthsSize((size.widths,)), data, log), "ran": ran()}
        return write_results(tmp, results, report, start)


def ran() -> dict[str, str]:
    """The date, library versions and machine of a run, for its report."""
    import os
    import platform
    from datetime import date

    import transformers

    return {"date": date.today().isoformat(), "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores"}


def _windows(count: int | None) -> str:
    return "every window" if count is None else f"the first {count:,} windows"


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def report(r: dict[str, Any]) -> str:
    s = r["settings"]
    pair = r["moe_pair"]["heldout_loss"]
    lines = [f"# {r['task']} ({r['size']} size)", "",
             f"Austen text: the first {s['chars']:,} characters halved (different novels), each half 90 % training "
             f"({r['tokens']['train'][0]:,} / {r['tokens']['train'][1]:,} tokens) and 10 % held out; byte-level BPE "
             f"of {s['vocab']} tokens; held-out loss in nats per token on windows of {s['context']} tokens.", "",
             "## (a) Two Mixture-of-Experts LMs, plain vs aligned average", "",
             f"Mixtral-style, {s['moe']['layers']} layers × {s['moe']['hidden']}, {s['experts']} experts of "
             f"{s['moe']['intermediate']} units (top-2), seeds 0 and 1, {s['moe']['steps']} steps on both halves; "
             "loss on both halves' held-out text.", "",
             markdown_table(["model", "held-out loss"], [[k, _fmt(v)] for k, v in pair.items()]), "",
             f"Alignment {'lowers' if pair['aligned average'] < pair['plain average'] else 'does not lower'} the "
             f"merge's loss ({_fmt(pair['plain average'])} → {_fmt(pair['aligned average'])}); the aligned merge is "
             f"{_fmt(pair['aligned average'] - min(pair['A'], pair['B']))} above the better endpoint.", "",
             "## (b) Dense → MoE", "",
             f"Llama-style, {s['dense']['layers']} layers × {s['dense']['hidden']}, FFN {s['dense']['intermediate']}; "
             f"A trained on the first half, B on the second, {s['dense']['steps']} steps each in all (branched: "
             f"{s['dense']['common']} common steps on both halves, then {s['dense']['steps'] - s['dense']['common']} "
             f"per branch; independent: seeds 0 and 1 from scratch). MoE: Mixtral with 2 experts (top-2), router "
             f"from each model's mean FFN input on {_windows(s.get('router_blocks'))} of its own training half, "
             f"then {s['router_steps']} router-only steps on both halves, or {s.get('shared_steps')} steps training the "
             f"router with the averaged tensors (embeddings, attention, norms, head; experts frozen; lr "
             f"{s.get('shared_lr')}, cosine) on both halves; the MoE's shared parts unaligned, after weight matching "
             "with permutations or with the full group. 'aligned average': the dense models' average after weight "
             f"matching (permutations); '+ {s.get('shared_steps')} steps': the control, that average trained as "
             "long on the same batches, every tensor.", ""]
    for setting, part in r["dense_to_moe"].items():
        rows = part["heldout_loss"]
        own = [rows["A (first half)"][0], rows["B (second half)"][1]]
        lines += [f"### {setting}", "",
                  markdown_table(["model", "first half", "second half", "vs own dense (1st / 2nd)"],
                                 [[k, _fmt(v[0]), _fmt(v[1]), f"{v[0] / own[0] - 1:+.1%} / {v[1] / own[1] - 1:+.1%}"]
                                  for k, v in rows.items()]), "",
                  markdown_table(["MoE", "claim", "holds"],
                                 [[n, c, "yes" if ok else "**no**"] for n, cs in moe_claims(rows, s["within"]).items()
                                  for c, ok in cs.items()]), ""]
    w = r["widths"]
    acc = w["test_acc"]
    lines += ["## (c) Widths", "",
              f"MLP (depth {w['case']['kwargs'].get('depth')}) on MNIST ({w['train_examples']:,} training images, "
              f"{w['case']['epochs']} epoch), widths {w['case']['widths'][0]} and {w['case']['widths'][1]} → "
              f"{w['case']['widths'][0]}; test accuracy.", "",
              markdown_table(["model", "test accuracy"], [[k, _fmt(v)] for k, v in acc.items()]), "",
              "## Where alignment helps", "", *findings(r), "", f"Total {r['seconds']:.0f} s."
              + (" Ran on {date} with torch {torch}, transformers {transformers}, {machine}.".format(**r["ran"])
                 if "ran" in r else ""), ""]
    return "\n".join(lines)


def _change(before: float, after: float, unit: str) -> str:
    return f"{_fmt(before)} → {_fmt(after)} {unit}"


def findings(r: dict[str, Any]) -> list[str]:
    """One line per comparison of an aligned and an unaligned merge, said as measured."""
    pair = r["moe_pair"]["heldout_loss"]
    out = [f"- (a) MoE pair: alignment {'lowers' if pair['aligned average'] < pair['plain average'] else 'does not lower'}"
           f" the average's loss ({_change(pair['plain average'], pair['aligned average'], 'nats/token')})."]
    for setting, part in r["dense_to_moe"].items():
        rows = part["heldout_loss"]
        steps = r["settings"]["router_steps"]
        mean, verdict = _by_alignment(rows, f"router + {steps} steps")
        out.append(f"- (b) {setting}: the MoE (router + {steps} steps, mean loss of both halves): {_listed(mean)} "
                   f"nats/token — {verdict}; the plain "
                   f"average of the dense models {_fmt(sum(rows['plain average']) / 2)}.")
        out.append(_shared_finding(setting, rows, r["settings"].get("shared_steps")))
    acc = r["widths"]["test_acc"]
    out.append(f"- (c) widths: matching the units {'beats' if acc['fused'] > acc['truncation average'] else 'does not beat'}"
               f" truncation ({_change(acc['truncation average'], acc['fused'], 'test accuracy')}).")
    return out


def _by_alignment(rows: dict[str, list[float]], training: str) -> tuple[dict[str, float], str]:
    """The MoE rows of one training: per alignment the mean loss of both halves, and what alignment did."""
    mean = {label: sum(rows[f"MoE, {label}, {training}"]) / 2 for label in ALIGNMENTS.values()
            if f"MoE, {label}, {training}" in rows}
    best = min(mean, key=mean.get)
    verdict = ("alignment makes no difference (within 0.001)" if max(mean.values()) - min(mean.values()) < 1e-3
               else "alignment does not help" if best == "unaligned" else f"best: {best}")
    return mean, verdict


def _listed(values: dict[str, float]) -> str:
    return ", ".join(f"{k} {_fmt(v)}" for k, v in values.items())


def _shared_finding(setting: str, rows: dict[str, list[float]], steps: int | None) -> str:
    """The shared-parts training's line: each alignment's MoE against the averages trained as long."""
    if f"MoE, unaligned, shared + {steps} steps" not in rows:
        return f"- (b) {setting}: no MoE trained its shared parts in this run."
    mean, verdict = _by_alignment(rows, f"shared + {steps} steps")
    controls = {k: sum(rows[f"{k} + {steps} steps"]) / 2 for k in ("plain average", "aligned average")}
    below = min(mean.values()) < min(controls.values())
    return (f"- (b) {setting}, shared parts trained {steps} steps (mean of both halves): {_listed(mean)} nats/token "
            f"— {verdict}; the averages trained as long (every tensor): {_listed(controls)} — the best MoE is "
            f"{'below' if below else 'not below'} both.")


register_experiment(Experiment("heterogeneous", __doc__, SIZES, run_heterogeneous, report, ("report.md", "results.json"),
                               why_not="every part fixes its own models and training"))
