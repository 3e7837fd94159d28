"""Language data ("austen", byte-level BPE, next-token blocks) and small GPT-NeoX models (gpt-neox-tiny):
tokenizer determinism and round trip, fixed disjoint splits, shifted labels, model kwargs and seeded
init, per-token training/evaluation, checkpoint round trip, interpolation paths and the CLI."""

from __future__ import annotations

import gzip
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset
from typer.testing import CliRunner

from modeconn.cli import app
from modeconn.data import load_dataset, load_tokenizer, text_bundle, train_tokenizer
from modeconn.data import text as text_mod
from modeconn.errors import ConfigError, DataError
from modeconn.io import load_checkpoint, save_checkpoint
from modeconn.models import TOKEN_MODELS, build_model
from modeconn.nn_utils import flatten_sequence_logits
from modeconn.path import evaluate_model, evaluate_path
from modeconn.train import evaluate, fit, train_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 512  # small vocabulary for the real-data tests (one tokenizer, cached for the session)
TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def austen_text(shared_data) -> str:
    return text_mod.read_text_file(shared_data / "austen" / "austen.txt.gz", text_mod.AUSTEN_SHA256)


@pytest.fixture(scope="module")
def small(austen_text):
    """A TextBundle of the first 120k characters of the novels (V=300, T=32): fast to train on."""
    return text_bundle(austen_text[:120_000], vocab_size=300, context_length=32)


def _tiny_lm(bundle, seed=0, **kw):
    return build_model("gpt-neox-tiny", seed=seed, in_shape=bundle.input_shape, num_classes=bundle.num_classes,
                       **{**TINY, **kw})


# ------------------------------------------------------------------------------------------ tokenizer


def test_tokenizer_is_deterministic_and_lossless(austen_text):
    text = austen_text[:60_000]
    jsons = set()
    for _ in range(3):  # bypass the cache: fresh trainer, fresh (randomly seeded) hash maps each time
        tok, trainer = text_mod._new_tokenizer_and_trainer(400)
        tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
        jsons.add(tok.to_str())
    assert len(jsons) == 1
    tok = train_tokenizer(text, 400)
    assert tok.to_str() in jsons and tok.get_vocab_size() == 400
    assert tok.token_to_id("<|endoftext|>") == 0
    # pinned ids: the same tokenization in every process and session (checkpoints rely on re-tokenizing)
    assert tok.encode("Elinor and Marianne").ids == [37, 76, 260, 284, 287, 345, 283, 73, 286, 78, 69]
    for s in ("Elinor, £5 — «naïve» 😀\n\n\n  CHAPTER 2\r\n\tend  ", austen_text[200_000:230_000], ""):
        assert tok.decode(tok.encode(s).ids) == s
    # line-by-line stream encoding (used for the splits) equals encoding the text in one piece
    assert text_mod.encode_stream(tok, austen_text[100_000:140_000]).tolist() == \
        tok.encode(austen_text[100_000:140_000]).ids
    with pytest.raises(ConfigError, match="vocab_size"):
        train_tokenizer(text, 100)


def test_splits_are_contiguous_disjoint_fixed_and_labels_shifted(small, austen_text):
    text = austen_text[:120_000]
    spans = small.char_spans
    assert spans["train"][0] == 0 and spans["train"][1] == spans["val"][0] and spans["val"][1] == spans["test"][0]
    assert spans["test"][1] == len(text)
    for a, _ in (spans["val"], spans["test"]):
        assert text[a - 1] == "\n"  # cuts at line starts
    assert abs(spans["test"][0] / len(text) - 0.95) < 0.01 and abs(spans["val"][0] / len(text) - 0.90) < 0.01
    again = text_bundle(text, vocab_size=300, context_length=32)
    for split in ("train", "val", "test"):
        x, y = getattr(small, split).tensors
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape and x.shape[1] == 32
        assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y[:-1, -1], x[1:, 0])  # labels = inputs shifted
        assert all(torch.equal(a, b) for a, b in zip(getattr(again, split).tensors, (x, y), strict=False))  # fixed
        assert int(x.max()) < small.num_classes and int(x.min()) >= 0
        a, b = spans[split]
        assert text[a:b].startswith(small.decode(x[:4]))  # blocks are the split's own text, in order
    assert small.input_shape == (32,) and small.num_classes == small.vocab_size == 300
    assert len(small.classes) == 300 and small.options["vocab_size"] == 300
    assert small.tokenizer_sha256 == text_mod.hashlib.sha256(small.tokenizer_json().encode()).hexdigest()
    # the tokenizer is trained on the training split only
    assert small.tokenizer_json() == train_tokenizer(text[slice(*spans["train"])], 300).to_str()
    lim = text_bundle(text, vocab_size=300, context_length=32, limit_train=5, limit_test=3)
    assert len(lim.train) == 5 and len(lim.test) == 3 and torch.equal(lim.train.tensors[0], x_train_head(small, 5))
    with pytest.raises(ConfigError, match="test_fraction"):
        text_bundle(text, test_fraction=1.2)
    with pytest.raises(ConfigError, match="context_length"):
        text_bundle(text[:500], vocab_size=300, context_length=4096)


def x_train_head(bundle, n):
    return bundle.train.tensors[0][:n]


@pytest.mark.slow
def test_austen_loader_real_data(shared_data):
    b = load_dataset("austen", vocab_size=VOCAB, context_length=64)
    assert b.name == "austen" and b.num_classes == VOCAB and b.input_shape == (64,)
    assert b.text_sha256 == text_mod.AUSTEN_SHA256 and b.source.endswith("austen")
    assert b.num_tokens["train"] > 10 * b.num_tokens["test"] > 0 and len(b.val) > 0
    assert b.decode(b.train.tensors[0][0]).startswith("SENSE AND SENSIBILITY")
    assert "Anne" in b.decode(b.test.tensors[0][:200])  # the held-out test text is the end of Persuasion
    # options through load_dataset; unknown options and image datasets with options are refused
    with pytest.raises(ConfigError, match="vocab_sise"):
        load_dataset("austen", vocab_sise=100)
    with pytest.raises(ConfigError, match="vocab_size"):
        load_dataset("digits", vocab_size=100)
    with pytest.raises(ConfigError, match="austen"):
        load_dataset("austin")


def test_missing_or_corrupt_austen_file(tmp_path, monkeypatch):
    monkeypatch.delenv("MODECONN_DATA", raising=False)
    with pytest.raises(DataError) as info:
        load_dataset("austen", tmp_path / "nowhere")
    msg = str(info.value)
    assert "austen.txt[.gz]" in msg and "MODECONN_DATA" in msg and "--data" in msg
    d = tmp_path / "austen"
    d.mkdir()
    (d / "austen.txt.gz").write_bytes(gzip.compress(("Some other text.\n" * 400).encode()))
    with pytest.raises(DataError, match="SHA-256 mismatch.*austen.txt.gz"):
        load_dataset("austen", tmp_path)
    b = load_dataset("austen", tmp_path, verify=False, vocab_size=260, context_length=8)
    assert b.decode(b.train.tensors[0][0]).startswith("Some other")
    (d / "austen.txt.gz").write_bytes(b"\x1f\x8b broken")
    with pytest.raises(DataError, match="austen.txt.gz"):
        load_dataset("austen", tmp_path)


# ------------------------------------------------------------------------------------------------ model


def test_model_kwargs_validation_and_seeded_init(small):
    assert "gpt-neox-tiny" in TOKEN_MODELS
    with pytest.raises(ConfigError, match="num_layers"):
        _tiny_lm(small, num_layers=2)
    with pytest.raises(ConfigError, match="divisible"):
        _tiny_lm(small, hidden_size=30, num_attention_heads=4)
    with pytest.raises(ConfigError, match="rotary"):
        _tiny_lm(small, rotary_pct=0.01)
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        _tiny_lm(small, max_position_embeddings=16)
    with pytest.raises(ConfigError, match="in_shape"):
        build_model("gpt-neox-tiny", in_shape=(1, 8, 8), num_classes=10)
    state = torch.random.get_rng_state()
    a, b, c = _tiny_lm(small, 0), _tiny_lm(small, 0), _tiny_lm(small, 1)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is untouched
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["lm.gpt_neox.embed_in.weight"], sc["lm.gpt_neox.embed_in.weight"])
    assert "lm.lm_head.weight" in sa and not a.lm.config.tie_word_embeddings  # untied head
    assert sa["lm.lm_head.weight"].data_ptr() != sa["lm.gpt_neox.embed_in.weight"].data_ptr()
    x = small.train.tensors[0][:2]
    a.eval()
    logits = a(x)
    assert logits.shape == (2, 32, 300) and logits.dtype == torch.float32
    # causal: changing a later token leaves earlier positions' logits unchanged
    x2 = x.clone()
    x2[:, 20] = (x2[:, 20] + 1) % 300
    assert torch.allclose(a(x2)[:, :20], logits[:, :20], atol=1e-6)
    eager = _tiny_lm(small, 0, attn_implementation="eager").eval()
    assert torch.allclose(eager(x), logits, atol=1e-5)
    with pytest.raises(ConfigError, match="input_ids"):
        a(x.float())


# ---------------------------------------------------------------------------------- training / evaluation


def test_per_token_loss_and_accuracy_are_weighted_by_tokens():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, 7, generator=g)
    y = torch.randint(0, 7, (5, 3), generator=g)
    lf, yf = flatten_sequence_logits(logits, y)
    assert lf.shape == (15, 7) and yf.shape == (15,)
    assert flatten_sequence_logits(lf, yf)[0] is lf  # classification shapes pass through

    class Fixed(torch.nn.Module):  # returns the stored logits of the requested rows
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def forward(self, idx):
            return logits[idx[:, 0]] + self.w

    rows = torch.arange(5)[:, None].expand(5, 3)
    batches = [(rows[:2], y[:2]), (rows[2:], y[2:])]  # unequal batches
    m = evaluate_model(Fixed(), batches)
    assert m["n"] == 15
    assert m["loss"] == pytest.approx(F.cross_entropy(lf, yf).item(), rel=1e-6)
    assert m["acc"] == pytest.approx((lf.argmax(1) == yf).float().mean().item())
    assert evaluate(Fixed(), TensorDataset(rows, y), batch_size=2)["loss"] == pytest.approx(m["loss"], rel=1e-6)


@pytest.mark.slow
def test_fit_lowers_heldout_loss_and_checkpoint_round_trip(small, tmp_path):
    model = _tiny_lm(small)
    before = evaluate(model, small.test)
    assert before["n"] == small.test.tensors[1].numel()
    assert abs(before["loss"] - math.log(300)) < 0.3  # near-uniform at init
    cfg = dict(epochs=2, batch_size=16, optimizer="adamw", lr=1e-2, weight_decay=0.0, warmup_epochs=0.2, seed=0)
    path = train_checkpoint("gpt-neox-tiny", model_config_kwargs(small), small.train, cfg, tmp_path / "ckpt",
                            val_set=small.val, test_set=small.test, extra_config={"dataset": "text"},
                            extra_json={"tokenizer.json": json.loads(small.tokenizer_json())}, progress=False)
    metrics = json.loads((path / "metrics.json").read_text())
    hist = metrics["history"]
    assert hist[-1]["tokens"] == small.train.tensors[1].numel() and hist[-1]["tokens_per_second"] > 0
    assert metrics["test"]["loss"] < before["loss"] - 1.0  # held-out loss clearly lower
    assert metrics["test"]["ppl"] == pytest.approx(math.exp(metrics["test"]["loss"]))
    assert hist[-1]["val_loss"] == pytest.approx(metrics["val"]["loss"], rel=1e-5)
    # the checkpoint rebuilds the same function; the tokenizer decodes
    loaded, cfg_json = load_checkpoint(path)
    assert cfg_json["architecture"] == "gpt-neox-tiny" and cfg_json["kwargs"]["in_shape"] == [32]
    trained = build_model("gpt-neox-tiny", seed=0, **model_config_kwargs(small))
    fit(trained, small.train, cfg, progress=False)  # same seed, same data → same weights (bitwise, CPU)
    x = small.test.tensors[0][:4]
    assert torch.equal(loaded(x), trained.eval()(x))
    tok = load_tokenizer(path)
    assert text_mod.hashlib.sha256(tok.to_str().encode()).hexdigest() == small.tokenizer_sha256
    assert tok.decode(x[0].tolist()) == small.decode(x[0])
    again = save_checkpoint(tmp_path / "again", loaded)
    reloaded, _ = load_checkpoint(again)
    assert torch.equal(reloaded(x), loaded(x))


def model_config_kwargs(bundle):
    return {"in_shape": bundle.input_shape, "num_classes": bundle.num_classes, **TINY}


def test_evaluate_path_between_two_language_models(small):
    ma, mb = _tiny_lm(small, 0), _tiny_lm(small, 1)
    loader = [(x, y) for x, y in zip(small.val.tensors[0][:24].split(8), small.val.tensors[1][:24].split(8), strict=False)]
    curve = evaluate_path(ma, ma.state_dict(), mb.state_dict(), {"val": loader}, lambdas=3)
    assert curve.info["has_batchnorm"] is False and curve.info["bn_batches"] == 0
    loss = curve.metrics["val"]["loss"]
    assert loss[0] == evaluate_model(ma, loader)["loss"] and loss[-1] == evaluate_model(mb, loader)["loss"]
    assert all(math.isfinite(v) for v in loss) and curve.metrics["val"]["acc"].shape == (3,)


# ------------------------------------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_cli_trains_a_language_model_and_writes_the_tokenizer(tmp_path, shared_data):
    out = tmp_path / "lm"
    args = ["train", "--out", out, "--model", "gpt-neox-tiny", "--dataset", "austen", "--data", shared_data,
            "-m", "hidden_size=32", "-m", "num_hidden_layers=1", "-m", "num_attention_heads=2",
            "-m", "intermediate_size=64", "--dataset-arg", f"vocab_size={VOCAB}", "--dataset-arg", "context_length=64",
            "--limit-train", "48", "--epochs", "1", "--batch-size", "16", "--optimizer", "adamw", "--lr", "3e-3"]
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    assert "perplexity" in res.output and str(out.resolve()) in res.output.replace("\n", "")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dataset"] == "austen" and cfg["dataset_options"]["vocab_size"] == VOCAB
    assert cfg["kwargs"]["num_classes"] == VOCAB and cfg["kwargs"]["in_shape"] == [64]
    model, _ = load_checkpoint(out)
    tok = load_tokenizer(out / "tokenizer.json")
    bundle = load_dataset("austen", shared_data, **cfg["dataset_options"])  # cached: same tokenizer
    assert tok.to_str() == bundle.tokenizer_json()
    assert model(bundle.test.tensors[0][:1]).shape == (1, 64, VOCAB)
    bad = CliRunner().invoke(app, [str(a) for a in args[:-2] + ["--dataset-arg", "vocab=3", "--overwrite"]])
    assert bad.exit_code != 0 and "vocab" in bad.output
