"""Dense → Mixture-of-Experts (``modeconn moe`` / :func:`modeconn.dense_to_moe`) on tiny models the tests write.

The planted identity: N copies of one dense model give an MoE that computes exactly that model's logits whatever the
router (top-k weights sum to one). The negative control: with the data-initialised router, experts get the tokens of
their own model's data; the same MoE with its router rows swapped computes the wrong expert's function there."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers as T

import modeconn as mc
from modeconn.errors import ConfigError

from cli_runner import run_cli
from hf_tiny import TINY
from user_data_fixtures import tiny_causal_lms

T.logging.set_verbosity_error()


@pytest.mark.parametrize("family,moe_class,align", [("llama", "MixtralForCausalLM", "full"),
                                                    ("qwen2", "Qwen2MoeForCausalLM", "full"),
                                                    ("llama_tied_mqa", "MixtralForCausalLM", "weight")])
def test_copies_of_one_dense_model_compute_it_for_any_router(tmp_path, family, moe_class, align):
    torch.manual_seed(0)
    dense = TINY[family]().eval()
    for name in ("a", "b", "c"):
        dense.save_pretrained(tmp_path / name)
    x = torch.randint(1, 50, (3, 12))
    mc.dense_to_moe([tmp_path / n for n in "abc"], tmp_path / "moe", data=x, top_k=2, align=align)
    moe = T.AutoModelForCausalLM.from_pretrained(tmp_path / "moe").eval()
    assert type(moe).__name__ == moe_class and moe.config.num_experts_per_tok == 2
    with torch.no_grad():
        for name, p in moe.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(std=3.0)
        assert torch.allclose(moe(x).logits, dense(x).logits, atol=1e-5)
        assert moe.generate(x[:1, :4], max_new_tokens=3, do_sample=False).shape == (1, 7)
    record = json.loads((tmp_path / "moe" / "moe.json").read_text())
    assert record["experts_from"] == ["a", "b", "c"] and len(record["alignments"]) == 2
    assert record["groups"] == {"full": "full", "weight": "permutation"}[align]


def test_a_rotated_copy_is_aligned_back_by_the_full_group_and_not_by_permutations(tmp_path):
    """Planted: B is A moved by a random element of the full group (a residual rotation, per-head maps, permutations),
    written as a stock Llama. The full group aligns it back, so the MoE computes A for any router; permutations alone
    cannot undo a rotation, and that MoE does not (the negative control)."""
    from modeconn.symmetry import absorb_normalization
    from modeconn.symmetry.absorb_export import stock_model
    from modeconn.symmetry.hf import FULL_GROUPS, hf_symmetry_spec

    torch.manual_seed(0)
    dense = TINY["llama"]().eval()
    dense.save_pretrained(tmp_path / "a")
    absorbed = absorb_normalization(dense)
    spec = hf_symmetry_spec(absorbed, groups=FULL_GROUPS)
    absorbed.load_state_dict(spec.apply(absorbed.state_dict(), spec.random_element(torch.Generator().manual_seed(1))))
    stock_model(absorbed).save_pretrained(tmp_path / "b")
    x = torch.randint(1, 50, (2, 10))
    gaps = {}
    for align in ("full", "weight"):
        mc.dense_to_moe([tmp_path / "a", tmp_path / "b"], tmp_path / align, data=x, align=align)
        moe = T.AutoModelForCausalLM.from_pretrained(tmp_path / align).eval()
        with torch.no_grad():
            for name, p in moe.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    p.normal_(std=3.0)
            gaps[align] = float((moe(x).logits - dense(x).logits).abs().max())
    assert gaps["full"] < 1e-4 < 0.1 < gaps["weight"], gaps


def _swap_routers(path, out):
    moe = T.AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        for name, p in moe.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.copy_(p.flip(0))
    return moe


def test_the_data_router_sends_each_models_tokens_to_its_expert_and_swapped_rows_do_not(tmp_path):
    """A and B share everything but their FFNs; A's data and B's data use disjoint tokens. With top-1 routing, the
    MoE on A's data is closer to A than to B (and on B's to B); swapping the router rows reverses it."""
    torch.manual_seed(0)
    a = TINY["llama"]().eval()
    b = TINY["llama"]().eval()
    shared = {k: v for k, v in a.state_dict().items() if ".mlp." not in k}
    b.load_state_dict({**b.state_dict(), **shared})
    with torch.no_grad():
        for m in (a, b):
            for layer in m.model.layers:
                layer.mlp.down_proj.weight.mul_(8.0)  # FFNs that matter next to the residual stream
    a.save_pretrained(tmp_path / "a")
    b.save_pretrained(tmp_path / "b")
    gen = torch.Generator().manual_seed(0)
    data = [torch.randint(1, 25, (8, 12), generator=gen), torch.randint(25, 50, (8, 12), generator=gen)]
    mc.dense_to_moe([tmp_path / "a", tmp_path / "b"], tmp_path / "moe", data=data, top_k=1, align="none")
    right = T.AutoModelForCausalLM.from_pretrained(tmp_path / "moe").eval()
    wrong = _swap_routers(tmp_path / "moe", None)
    with torch.no_grad():
        for x, own, other in ((data[0], a, b), (data[1], b, a)):
            gap = [(m(x).logits - ref(x).logits).abs().mean() for m in (right, wrong) for ref in (own, other)]
            assert gap[0] < gap[1] and gap[3] < gap[2]  # the data router: own expert; swapped rows: the other


def test_the_cli_builds_a_mixtral_from_two_llamas_with_per_model_data(tmp_path):
    dirs, corpus = tiny_causal_lms(tmp_path, "llama")
    out = tmp_path / "moe"
    res = run_cli("moe", *dirs, "--out", out, "--dataset", corpus, "--dataset", corpus, "--router-steps", "2",
                  "--shared-steps", "2", "--limit-train", "8")
    assert "written to" in res.output.lower() or str(out) in res.output
    moe = T.AutoModelForCausalLM.from_pretrained(out)
    assert type(moe).__name__ == "MixtralForCausalLM" and moe.config.num_local_experts == 2
    assert (out / "tokenizer.model").exists()
    record = json.loads((out / "moe.json").read_text())
    assert record["router"]["steps"] == 2 and record["align"] == "full" and record["groups"] == "full"
    assert record["shared"]["steps"] == 2 and len(record["shared"]["loss"]) == 2


@pytest.mark.parametrize("case,message", [
    ("family", "gpt_neox models"), ("out-is-input", "--out"), ("datasets", "one per model (2), got 3"),
    ("no-dataset", "pass --dataset")])
def test_bad_inputs_are_refused_before_any_weights_are_read(tmp_path, monkeypatch, case, message):
    dirs, corpus = tiny_causal_lms(tmp_path, "gpt_neox" if case == "family" else "llama")
    out = dirs[0] if case == "out-is-input" else tmp_path / "moe"
    datasets = {"datasets": [str(corpus)] * 3, "no-dataset": []}.get(case, [str(corpus)])
    from modeconn.io.lazy import LazyCheckpoint

    monkeypatch.setattr(LazyCheckpoint, "__getitem__", lambda *a: pytest.fail("weights read"))
    args = ["moe", *map(str, dirs), "--out", str(out)] + [a for d in datasets for a in ("--dataset", d)]
    res = run_cli(*args, ok=False)
    assert res.exit_code != 0 and message in " ".join(res.output.split()), res.output
    assert not (tmp_path / "moe").exists()


@pytest.mark.parametrize("case,message", [
    ("tied", "config.tie_word_embeddings: False vs True (a tied model's output head is its input embedding"),
    ("head-missing", "stores lm_head.weight, {b} does not")], ids=["tied", "head-missing"])
def test_a_tied_and_an_untied_model_are_refused_before_any_data_or_weights(tmp_path, monkeypatch, case, message):
    """B ties its head to its embeddings (no lm_head.weight stored) or claims an untied head it does not store: the
    refusal names tie_word_embeddings or the tensor, and both models, before the datasets or any weights are read."""
    import modeconn.recipes.pair as pair
    from modeconn.io.lazy import LazyCheckpoint

    from hf_tiny import drop_stored, resave

    dirs, corpus = tiny_causal_lms(tmp_path, "llama")
    if case == "tied":
        resave(dirs[1], tie_word_embeddings=True)
    else:
        drop_stored(dirs[1], "lm_head.weight")
    reads = []
    monkeypatch.setattr(pair, "hf_text_data", lambda *a, **k: reads.append("data"))
    monkeypatch.setattr(LazyCheckpoint, "__getitem__", lambda *a: reads.append("weights"))
    res = run_cli("moe", *dirs, "--out", tmp_path / "moe", "--dataset", corpus, ok=False)
    assert res.exit_code == 2 and reads == [], (reads, res.output)
    text = " ".join(res.output.split())
    assert message.format(b=dirs[1]) in text and str(dirs[0]) in text and str(dirs[1]) in text, res.output
    assert not (tmp_path / "moe").exists()


def test_the_api_names_a_tied_and_an_untied_model_in_either_order(tmp_path):
    from hf_tiny import resave

    torch.manual_seed(0)
    for name in ("untied", "tied"):
        TINY["llama"]().save_pretrained(tmp_path / name)
    resave(tmp_path / "tied", tie_word_embeddings=True)
    x = torch.randint(1, 50, (2, 8))
    for first, second in (("untied", "tied"), ("tied", "untied")):
        with pytest.raises(ConfigError, match="tie_word_embeddings.*the heads cannot be paired") as err:
            mc.dense_to_moe([tmp_path / first, tmp_path / second], tmp_path / "m", data=x, align="none")
        assert str(tmp_path / first) in str(err.value) and str(tmp_path / second) in str(err.value)
    assert not (tmp_path / "m").exists()


def test_the_api_refuses_a_data_count_and_top_k_that_do_not_fit(tmp_path):
    torch.manual_seed(0)
    for name in "ab":
        TINY["llama"]().save_pretrained(tmp_path / name)
    x = torch.randint(1, 50, (2, 8))
    with pytest.raises(ConfigError, match="one per model"):
        mc.dense_to_moe([tmp_path / "a", tmp_path / "b"], tmp_path / "m", data=[x, x, x])
    with pytest.raises(ConfigError, match="top_k"):
        mc.dense_to_moe([tmp_path / "a", tmp_path / "b"], tmp_path / "m", data=x, top_k=3)


def _two_copies(root, plant=None):
    torch.manual_seed(0)
    dense = TINY["llama"]().eval()
    for name in ("a", "b"):
        dense.save_pretrained(root / name)
        if plant:
            plant(root / name)
    return [root / "a", root / "b"], dense


def test_the_moe_carries_no_code_of_its_inputs(tmp_path):
    """The inputs' ``auto_map`` (naming a dense class) and ``.py`` files stay behind: loading the Mixtral with
    ``trust_remote_code=True`` must not swap in the planted class (whose import would write a marker)."""
    marker = tmp_path / "imported"

    def plant(d):
        (d / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
        cfg = json.loads((d / "config.json").read_text())
        cfg["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel"}
        (d / "config.json").write_text(json.dumps(cfg))

    dirs, _ = _two_copies(tmp_path, plant)
    mc.dense_to_moe(dirs, tmp_path / "moe", data=torch.randint(1, 50, (2, 8)), align="none")
    assert not (tmp_path / "moe" / "evil.py").exists()
    assert "auto_map" not in json.loads((tmp_path / "moe" / "config.json").read_text())
    moe = T.AutoModelForCausalLM.from_pretrained(tmp_path / "moe", trust_remote_code=True)
    assert type(moe).__name__ == "MixtralForCausalLM" and not marker.exists()


def test_nan_weights_and_token_ids_outside_the_vocabulary_are_named(tmp_path):
    from modeconn.errors import NonFiniteError

    dirs, dense = _two_copies(tmp_path)
    with pytest.raises(ConfigError, match=r"token ids must lie in \[0, "):
        mc.dense_to_moe(dirs, tmp_path / "moe", data=torch.full((2, 8), dense.config.vocab_size))
    with torch.no_grad():
        dense.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    dense.save_pretrained(dirs[1])
    with pytest.raises(NonFiniteError, match="up_proj"):  # the full group: named before absorption's logit check
        mc.dense_to_moe(dirs, tmp_path / "moe", data=torch.randint(1, 50, (2, 8)), align="full")
    assert not (tmp_path / "moe").exists()


def _in_memory_full_group(paths, config, seed):
    """The reference of the streamed full-group alignment: the in-memory path dense → MoE used before it streamed —
    every model loaded in fp32 with transformers, absorbed, matched with the full group and converted back with
    :func:`~modeconn.symmetry.absorb_export.stock_model`."""
    from modeconn.match.weight import WeightMatchingConfig, weight_matching
    from modeconn.moe import Aligned
    from modeconn.symmetry import absorb_normalization
    from modeconn.symmetry.absorb_export import stock_model
    from modeconn.symmetry.hf import FULL_GROUPS, hf_symmetry_spec

    absorbed = [absorb_normalization(T.AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)) for p in paths]
    spec = hf_symmetry_spec(absorbed[0], groups=FULL_GROUPS)
    records = []
    for path, model in zip(paths[1:], absorbed[1:], strict=True):
        res = weight_matching(spec, absorbed[0].state_dict(), model.state_dict(), WeightMatchingConfig(seed=seed))
        model.load_state_dict(spec.apply(model.state_dict(), res.element))
        records.append({"model": path.name, "objective": res.objective})
    stock = [stock_model(m).state_dict() for m in absorbed]
    return Aligned(stock, records, "full", {**config, "tie_word_embeddings": False})


def _three_llamas(root, family="llama"):
    """Three independently initialised tiny models (so the alignment moves every one but the first)."""
    paths = []
    for seed in range(3):
        torch.manual_seed(seed)
        TINY[family]().save_pretrained(root / f"m{seed}")
        paths.append(root / f"m{seed}")
    return paths


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_streamed_full_group_builds_the_moe_the_in_memory_path_built(tmp_path, monkeypatch, family):
    """Three independent models: the streamed alignment (absorbed views, weight matching, stock tensors on lookup)
    and the in-memory reference give the same alignment objectives, the same MoE tensors and the same logits."""
    from safetensors.torch import load_file

    import modeconn.moe as moe

    paths = _three_llamas(tmp_path, family)
    x = torch.randint(1, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    mc.dense_to_moe(paths, tmp_path / "streamed", data=x, align="full")
    monkeypatch.setattr(moe, "_align_full_group", _in_memory_full_group)
    mc.dense_to_moe(paths, tmp_path / "in_memory", data=x, align="full")
    records = [json.loads((tmp_path / d / "moe.json").read_text()) for d in ("streamed", "in_memory")]
    assert [r["groups"] for r in records] == ["full", "full"]
    for got, ref in zip(*(r["alignments"] for r in records), strict=True):
        assert got["model"] == ref["model"] and got["objective"] == pytest.approx(ref["objective"], rel=1e-6)
    streamed, reference = (load_file(tmp_path / d / "model.safetensors") for d in ("streamed", "in_memory"))
    assert streamed.keys() == reference.keys()
    # streamed matching sums its scores in row blocks: the orthogonal solutions agree to the solver's precision (the
    # objectives above to 1e-6), not bit for bit, on these unstructured random models; a missing alignment is O(1e-2)
    for k, t in reference.items():
        assert torch.allclose(streamed[k], t, atol=1e-3), k
    with torch.no_grad():
        logits = [T.AutoModelForCausalLM.from_pretrained(tmp_path / d).eval()(x).logits for d in ("streamed", "in_memory")]
    assert torch.allclose(*logits, atol=1e-3)


def test_the_full_group_loads_no_model_and_keeps_no_aligned_tensor(tmp_path, monkeypatch):
    """Memory: dense → MoE's full-group alignment never builds a model from the inputs (no ``from_pretrained``, no
    absorption in memory); the aligned models it returns compute each tensor when it is looked up and keep none."""
    import modeconn.moe as moe
    import modeconn.symmetry as symmetry
    from modeconn.symmetry.absorb_stream import AbsorbedView
    from modeconn.stream import open_hf_checkpoints

    paths = _three_llamas(tmp_path)
    loads = []
    load, absorb = T.PreTrainedModel.from_pretrained.__func__, symmetry.absorb_normalization
    monkeypatch.setattr(T.PreTrainedModel, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(a) or load(cls, *a, **k)))
    monkeypatch.setattr(symmetry, "absorb_normalization", lambda *a, **k: loads.append(a) or absorb(*a, **k))
    reads = []
    original = AbsorbedView.__getitem__
    monkeypatch.setattr(AbsorbedView, "__getitem__", lambda self, k: reads.append(k) or original(self, k))
    config = json.loads((paths[0] / "config.json").read_text())
    spec, ckpts = open_hf_checkpoints(paths, tmp_path / "moe", False)
    aligned = moe._aligned(paths, ckpts, spec, config, "full", 0, lambda s: None)
    assert aligned.groups == "full" and loads == []
    key = "model.layers.0.mlp.up_proj.weight"
    for sd in aligned.sds:
        before = len(reads)
        assert sd[key].dtype == torch.float32 and sd[key].shape == (64, 32)
        assert reads[before:] == [key, key]  # read from its checkpoint at each lookup: nothing kept


def test_without_a_stock_model_for_the_full_group_moe_aligns_with_permutations(tmp_path, monkeypatch):
    import modeconn.symmetry.absorb_export as export

    paths = _three_llamas(tmp_path)
    monkeypatch.setattr(export, "stock_norm_weights", lambda view: None)
    lines = []
    record = mc.dense_to_moe(paths, tmp_path / "moe", data=torch.randint(1, 50, (2, 8)), log=lines.append)
    assert record["groups"] == "permutation" and len(record["alignments"]) == 2
    assert lines[0] == "llama: the full group's result is no stock checkpoint; aligning with permutations", lines


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_shared_training_moves_the_router_and_averaged_tensors_and_never_an_expert(tmp_path, family):
    """``shared_steps``: against the same MoE without it (same seed, same alignment), every expert tensor (and
    Qwen2-MoE's zero shared expert) is unchanged, the router and the attention moved; ``router_steps`` alone moves the
    router only. Fails if the expert pattern let an expert train or the shared part missed the attention (names as
    the loaded models hold them; Mixtral's files store the experts under other names). Every weight random, norm
    scales included, so the averaged tensors differ from any stock initialisation."""
    from hf_tiny import randomize

    paths = [tmp_path / f"m{seed}" for seed in (0, 1)]
    for seed, path in enumerate(paths):
        randomize(TINY[family](), seed).save_pretrained(path)
    x = torch.randint(1, 50, (4, 10), generator=torch.Generator().manual_seed(0))
    for name, kwargs in (("base", {}), ("router", {"router_steps": 3}), ("shared", {"shared_steps": 3})):
        mc.dense_to_moe(paths, tmp_path / name, data=x, align="weight", **kwargs)
    base, router, shared = (T.AutoModelForCausalLM.from_pretrained(tmp_path / d).state_dict()
                            for d in ("base", "router", "shared"))

    def moved(sd):
        return {k for k, t in base.items() if not torch.equal(sd[k], t)}

    experts = {k for k in base if ".experts." in k or "shared_expert" in k}
    assert experts and not moved(shared) & experts
    assert moved(router) == {k for k in base if k.endswith("mlp.gate.weight")}
    assert moved(router) < moved(shared) and any("self_attn" in k for k in moved(shared))
    assert any("norm" in k for k in moved(shared))
    record = json.loads((tmp_path / "shared" / "moe.json").read_text())
    assert record["shared"]["steps"] == 3 and all(map(math.isfinite, record["shared"]["loss"]))


@pytest.mark.parametrize("kwargs,message", [
    ({"shared_steps": -1}, "shared_steps must be an integer, 0 or more, got -1"),
    ({"shared_steps": 1.5}, "shared_steps must be an integer, 0 or more, got 1.5"),
    ({"router_steps": True}, "router_steps must be an integer, 0 or more, got True"),
    ({"shared_steps": float("inf")}, "shared_steps must be an integer, 0 or more, got inf"),
    ({"router_lr": 0.0}, r"router_lr must be a positive finite number \(float32\), got 0.0"),
    ({"shared_lr": float("nan")}, "shared_lr must be a positive finite number"),
    ({"shared_lr": float("inf")}, "shared_lr must be a positive finite number"),
    ({"shared_lr": 1e39}, "shared_lr must be a positive finite number"),
    ({"shared_lr": "0.01"}, "shared_lr must be a positive finite number"),
    ({"top_k": 1.5}, "top_k must be an integer"),
    ({"shared_steps": 2, "data": torch.randint(1, 50, (3, 1))}, "blocks of at least 2 tokens"),
    ({"shared_steps": 2, "data": [torch.randint(1, 50, (2, 8)), torch.randint(1, 50, (2, 12))]},
     "give blocks of one length, got 8, 12 tokens")])
def test_bad_training_settings_are_named_before_any_weights_are_read(tmp_path, monkeypatch, kwargs, message):
    from modeconn.io.lazy import LazyCheckpoint

    paths, _ = _two_copies(tmp_path)
    monkeypatch.setattr(LazyCheckpoint, "__getitem__", lambda *a: pytest.fail("weights read"))
    kwargs = {"data": torch.randint(1, 50, (2, 8)), **kwargs}
    with pytest.raises(ConfigError, match=message):
        mc.dense_to_moe(paths, tmp_path / "moe", **kwargs)
    assert not (tmp_path / "moe").exists()


def test_blocks_of_other_lengths_build_an_untrained_moe(tmp_path):
    """Only the trainings batch across the datasets: the router's statistics take blocks of any lengths."""
    paths, _ = _two_copies(tmp_path)
    mc.dense_to_moe(paths, tmp_path / "moe", data=[torch.randint(1, 50, (2, 8)), torch.randint(1, 50, (2, 12))],
                    align="none")
    assert (tmp_path / "moe" / "model.safetensors").exists()


def test_a_training_that_diverges_on_its_last_step_writes_nothing(tmp_path, monkeypatch):
    """Each step's loss is taken before its update: the weights after the last step (and the loss after it) are
    checked too. On these models lr 1e30 leaves both steps' losses finite (5.09, 4.16) and the weights not."""
    from modeconn.errors import NonFiniteError

    import modeconn.moe as moe

    dirs, _ = tiny_causal_lms(tmp_path, "llama")
    losses = []
    train = moe.train_part
    monkeypatch.setattr(moe, "train_part", lambda *a, **k: losses.append(train(*a, **k)) or losses[-1])
    data = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(NonFiniteError, match=r"shared training diverged \(loss nan after 2 steps at lr 1e\+30, "
                                             "non-finite weights"):
        mc.dense_to_moe(dirs, tmp_path / "moe", data=data, align="none", shared_steps=2, shared_lr=1e30)
    assert len(losses[0]) == 2 and all(map(math.isfinite, losses[0]))  # what the old check looked at
    assert not (tmp_path / "moe").exists()


def test_a_diverged_training_writes_nothing(tmp_path, monkeypatch):
    import modeconn.moe as moe
    from modeconn.errors import NonFiniteError

    paths, _ = _two_copies(tmp_path)
    monkeypatch.setattr(moe, "train_part", lambda *a, **k: [2.0, float("nan")])
    with pytest.raises(NonFiniteError, match="shared training diverged"):
        mc.dense_to_moe(paths, tmp_path / "moe", data=torch.randint(1, 50, (2, 8)), align="none", shared_steps=2)
    assert not (tmp_path / "moe").exists()


def test_a_torchvision_checkpoint_is_refused_naming_its_kind(tmp_path):
    import torchvision

    for name in "ab":
        d = tmp_path / name
        d.mkdir()
        torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), d / "model.pth")
        (d / "config.json").write_text(json.dumps({"torchvision_model": "resnet18", "kwargs": {"num_classes": 10},
                                                   "input_size": [3, 32, 32]}))
    res = run_cli("moe", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "moe", "--dataset", "austen", ok=False)
    assert res.exit_code == 2, res.output
    assert "Hugging Face causal LM directories" in " ".join(res.output.split()) and "(torchvision)" in res.output
    assert not (tmp_path / "moe").exists()
