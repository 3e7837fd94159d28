"""The alignment methods' seams: configs (``config=`` plus overrides), the method registry, the reference git-re-basin
method the engine is compared against, ``Alignment.objective_sense``, the progress protocol and endless batches."""

from __future__ import annotations

import copy
import itertools
import json

import pytest
import torch
from archs import make
from torch.utils.data import DataLoader, TensorDataset

import modeconn as mc
from modeconn._util.batches import endless
from modeconn.errors import ConfigError
from modeconn.match import (
    ALIGNMENT_METHODS,
    ActivationMatchingConfig,
    DualMatchingConfig,
    LearnedMatchingConfig,
    WeightMatchingConfig,
    reference_weight_matching,
)
from modeconn.match.progress import reporter, step_loss_legacy

pytestmark = pytest.mark.usefixtures("one_thread")


def _pair(arch: str):
    a, x = make(arch, seed=0)
    b, _ = make(arch, seed=1)
    return mc.symmetry_spec(a, x), a, b, x


def _loader(x, n=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, *x.shape[1:], generator=gen), torch.randint(0, 5, (16,), generator=gen)) for _ in range(n)]


# ------------------------------------------------------------------------------------------ configs
def test_weight_matching_config_equals_keywords_and_overrides_win():
    spec, a, b, _ = _pair("mlp")
    sa, sb = a.state_dict(), b.state_dict()
    kw = mc.weight_matching(spec, sa, sb, restarts=2, max_iter=5, seed=3)
    cfg = WeightMatchingConfig(restarts=2, max_iter=5, seed=3)
    assert spec.equal(mc.weight_matching(spec, sa, sb, config=cfg).element, kw.element)
    assert mc.weight_matching(spec, sa, sb, config={"restarts": 2, "max_iter": 5, "seed": 3}).objective == kw.objective
    over = mc.weight_matching(spec, sa, sb, config=cfg, restarts=1)
    assert over.stats["restarts_run"] == 1 and cfg.restarts == 2  # the config itself is frozen, never changed
    with pytest.raises(ConfigError, match="did you mean 'restarts'"):
        mc.weight_matching(spec, sa, sb, restart=2)
    with pytest.raises(ConfigError, match="restarts"):
        WeightMatchingConfig(restarts=True)  # a bool is not a count
    with pytest.raises(ConfigError, match="expected a WeightMatchingConfig"):
        mc.weight_matching(spec, sa, sb, config=LearnedMatchingConfig())


@pytest.mark.parametrize("cls,field,bad", [
    (WeightMatchingConfig, "chunk", 0), (WeightMatchingConfig, "rtol", "1e-9"), (WeightMatchingConfig, "init", "random"),
    (ActivationMatchingConfig, "max_batches", 0), (LearnedMatchingConfig, "steps", 0),
    (LearnedMatchingConfig, "lambda_schedule", "gaussian"), (LearnedMatchingConfig, "init", 3),
    (DualMatchingConfig, "parameterization", "householder"), (DualMatchingConfig, "one_sided", "yes"),
    (DualMatchingConfig, "lambda_value", 1.5),
])
def test_every_config_names_the_bad_field(cls, field, bad):
    with pytest.raises(ConfigError, match=field):
        cls(**{field: bad})


def test_configs_share_option_names_and_meanings():
    learned, dual = LearnedMatchingConfig(), DualMatchingConfig()
    for name in ("lambda_schedule", "lambda_value", "lambda_width", "steps", "lr", "seed", "init"):
        assert name in LearnedMatchingConfig.model_fields and name in DualMatchingConfig.model_fields
    assert (learned.lambda_schedule, learned.lambda_value) == (dual.lambda_schedule, dual.lambda_value) == ("uniform", 0.5)
    assert learned.init == dual.init == "weight" and WeightMatchingConfig().init == "greedy"
    assert LearnedMatchingConfig(init=None).init == "weight"  # the former default spelling
    assert DualMatchingConfig(parameterization="cayley").parameterization == "cayley"
    import numpy as np

    assert WeightMatchingConfig(restarts=np.int64(2)).restarts == 2  # numpy ints are ints


def test_learned_lambda_sampling_is_deprecated_but_works():
    with pytest.warns(DeprecationWarning, match="lambda_sampling"):
        cfg = LearnedMatchingConfig(lambda_sampling="midpoint")
    assert (cfg.lambda_schedule, cfg.lambda_value) == ("fixed", 0.5)
    with pytest.warns(DeprecationWarning):
        assert LearnedMatchingConfig(lambda_sampling="uniform").lambda_schedule == "uniform"
    with pytest.raises(ConfigError, match="unifrom"):
        LearnedMatchingConfig(lambda_sampling="unifrom")
    with pytest.raises(ConfigError, match="not both"):
        LearnedMatchingConfig(lambda_sampling="uniform", lambda_schedule="fixed")


def test_learned_matching_midpoint_equals_fixed_schedule_and_config():
    spec, a, b, x = _pair("mlp")
    loader = _loader(x)
    common = {"steps": 3, "init": spec.identity(), "wm_iters": 2}
    with pytest.warns(DeprecationWarning):
        old = mc.learned_matching(spec, a, a.state_dict(), b.state_dict(), loader, lambda_sampling="midpoint", **common)
    new = mc.learned_matching(spec, a, a.state_dict(), b.state_dict(), loader,
                              config=LearnedMatchingConfig(lambda_schedule="fixed", lambda_value=0.5), **common)
    assert old.history == new.history and spec.equal(old.element, new.element)
    assert new.objective_sense == "minimize" and new.stats["lambda_schedule"] == "fixed"


# ------------------------------------------------------------------------------------------ reference method
@pytest.mark.parametrize("arch", ["mlp", "mlp-nobias", "mlp-bn", "cnn", "vgg-bn"])
@pytest.mark.parametrize("seed", [0, 1])
def test_engine_equals_the_reference_git_re_basin_on_permutation_specs(arch, seed):
    spec, a, b, _ = _pair(arch)
    sa, sb = a.state_dict(), b.state_dict()
    ref = reference_weight_matching(spec, sa, sb, seed=seed)
    eng = mc.weight_matching(spec, sa, sb, restarts=1, init="identity", rtol=0.0, seed=seed)
    assert spec.equal(eng.element, ref.element)
    assert eng.objective == pytest.approx(ref.objective, rel=1e-5)
    assert len(eng.history[0]) == len(ref.history[0])
    assert eng.history[0] == pytest.approx(ref.history[0], rel=1e-5)
    # the full engine with scratch restarts (greedy start, then that run) is never worse than the plain single run
    full = mc.weight_matching(spec, sa, sb, seed=seed, restarts=2, restart_init="scratch")
    assert full.objective >= ref.objective * (1 - 1e-6)


def test_reference_recovers_a_planted_permutation_and_refuses_continuous_groups():
    spec, a, _, _ = _pair("cnn")
    sd = a.state_dict()
    g = spec.random_element(generator=torch.Generator().manual_seed(4))
    res = reference_weight_matching(spec, sd, spec.apply(sd, g))
    aligned = res.apply(spec.apply(sd, g))
    assert all(torch.allclose(aligned[k], sd[k]) for k in sd if sd[k].is_floating_point())
    assert res.method == "reference" and res.objective_sense == "maximize"
    lm = __import__("hf_tiny").make("gpt_neox", 0)
    cont = mc.symmetry.hf.hf_symmetry_spec(mc.absorb_normalization(lm), groups={"residual": "orthogonal"})
    with pytest.raises(ConfigError, match="permutation"):
        reference_weight_matching(cont, lm.state_dict(), lm.state_dict())


# ------------------------------------------------------------------------------------------ registry
def test_registry_entries():
    assert ALIGNMENT_METHODS.names() == ["activation", "dual", "learned", "one-sided", "reference", "weight"]
    expect = {  # needs_data, streams, objective_sense, config
        "weight": (False, True, "maximize", WeightMatchingConfig),
        "reference": (False, False, "maximize", mc.match.ReferenceMatchingConfig),
        "activation": (True, False, "maximize", ActivationMatchingConfig),
        "learned": (True, False, "minimize", LearnedMatchingConfig),
        "one-sided": (True, False, "minimize", DualMatchingConfig),
        "dual": (True, False, "minimize", DualMatchingConfig),
    }
    for name, (data, streams, sense, cfg) in expect.items():
        m = ALIGNMENT_METHODS.get(name)
        assert (m.name, m.needs_data, m.streams, m.objective_sense, m.config) == (name, data, streams, sense, cfg)
        assert m.paper and m.summary and callable(m.fn)
        assert "permutation" in m.supported_groups()
    assert ALIGNMENT_METHODS.get("activation").supported_groups() == ["permutation"]
    assert "orthogonal" in ALIGNMENT_METHODS.get("weight").supported_groups()
    assert "Ainsworth" in ALIGNMENT_METHODS.get("learned").paper and "Theus" in ALIGNMENT_METHODS.get("one-sided").paper
    with pytest.raises(ConfigError, match="(?i)did you mean 'weight'"):
        ALIGNMENT_METHODS.get("wieght")


def test_registry_align_runs_every_permutation_method_with_its_sense():
    spec, a, b, x = _pair("mlp")
    sa, sb = a.state_dict(), b.state_dict()
    loader = _loader(x)
    for name in ("weight", "reference", "activation", "learned"):
        m = ALIGNMENT_METHODS.get(name)
        m.check_spec(spec)
        opts = {"steps": 2, "wm_iters": 1} if name == "learned" else {}
        res = m.align(spec, sa, sb, model=a, loader=loader, **opts)
        assert res.objective_sense == m.objective_sense
        assert all(torch.equal(sa[k], a.state_dict()[k]) for k in sa)
    with pytest.raises(ConfigError, match="needs a model and a data loader"):
        ALIGNMENT_METHODS.get("activation").align(spec, sa, sb)
    with pytest.raises(ConfigError, match="continuous"):
        ALIGNMENT_METHODS.get("dual").check_spec(spec)


# ------------------------------------------------------------------------------------------ objective_sense
def test_objective_sense_in_results_and_json():
    spec, a, b, x = _pair("mlp")
    wm = mc.weight_matching(spec, a.state_dict(), b.state_dict(), restarts=1)
    am = mc.activation_matching(spec, a, b, _loader(x))
    assert wm.objective_sense == am.objective_sense == "maximize"
    js = json.loads(json.dumps(wm.to_json()))
    assert js["objective_sense"] == "maximize"
    assert wm.better(wm.objective + 1, wm.objective)
    with pytest.raises(ValueError, match="objective_sense"):
        mc.Alignment("x", spec, wm.element, 0.0, objective_sense="up")


def test_dual_result_is_a_loss_and_progress_gets_metrics():
    import hf_tiny

    ma = mc.absorb_normalization(hf_tiny.make("gpt_neox", 0))
    mb = mc.absorb_normalization(hf_tiny.make("gpt_neox", 1))
    spec = mc.symmetry.hf.hf_symmetry_spec(ma, groups={"residual": "orthogonal", "heads": "permutation",
                                                       "qk": "head_invertible", "vo": "head_invertible",
                                                       "ffn": "permutation"})
    xs = torch.randint(0, 50, (2, 4, 8), generator=torch.Generator().manual_seed(0))
    loader = [(x, x) for x in xs]
    wm = mc.weight_matching(spec, ma.state_dict(), mb.state_dict(), restarts=1, max_iter=2)
    calls = []
    res = mc.dual_matching(spec, ma, ma.state_dict(), mb.state_dict(), loader, config=DualMatchingConfig(steps=3),
                           weight_alignment=wm, progress=lambda stage, done, total, **m: calls.append((stage, done, total, m)))
    assert res.objective_sense == "minimize" and res.to_json()["objective_sense"] == "minimize"
    assert [c[:3] for c in calls] == [("dual matching", i, 3) for i in (1, 2, 3)]
    assert [c[3]["loss"] for c in calls] == res.history[0] and [c[3]["lam"] for c in calls] == res.stats["lambdas"]
    one = ALIGNMENT_METHODS.get("one-sided").align(spec, ma.state_dict(), mb.state_dict(), model=ma, loader=loader,
                                                   steps=1, weight_alignment=wm, verify=False)
    assert one.stats["one_sided"] is True and one.objective_sense == "minimize"


# ------------------------------------------------------------------------------------------ progress protocol
def test_progress_protocol_and_its_legacy_form():
    got = []
    new = reporter(lambda stage, done, total, **m: got.append((stage, done, total, m)), step_loss_legacy, what="x")
    new("x", 1, 2, loss=0.5)
    assert got == [("x", 1, 2, {"loss": 0.5})]
    old = []
    with pytest.warns(DeprecationWarning, match="deprecated"):
        legacy = reporter(lambda step, steps, loss: old.append((step, steps, loss)), step_loss_legacy, what="x")
    legacy("x", 1, 2, loss=0.5)
    assert old == [(1, 2, 0.5)]
    plain = []
    reporter(lambda stage, done, total: plain.append((stage, done, total)))("run 1/1 sweep 1", 3, 4, objective=1.0)
    assert plain == [("run 1/1 sweep 1", 3, 4)]
    reporter(None)("x", 1, 1)  # no callback: a no-op


def test_learned_and_weight_progress_use_the_protocol():
    spec, a, b, x = _pair("mlp")
    calls = []
    mc.learned_matching(spec, a, a.state_dict(), b.state_dict(), _loader(x), steps=2, wm_iters=1,
                        progress=lambda stage, done, total, **m: calls.append((stage, done, total, sorted(m))))
    assert calls == [("learned matching", 1, 2, ["lam", "loss"]), ("learned matching", 2, 2, ["lam", "loss"])]
    stages = []
    mc.weight_matching(spec, a.state_dict(), b.state_dict(), restarts=1,
                       progress=lambda stage, done, total, **m: stages.append(stage))
    assert stages[0].startswith("run 1/1 greedy start") and any("sweep 1" in s for s in stages)
    am = []
    mc.activation_matching(spec, a, b, _loader(x, n=2), progress=lambda stage, done, total, **m: am.append((stage, done, total)))
    assert am[:2] == [("activation statistics", 1, 2), ("activation statistics", 2, 2)]
    assert am[-1] == ("assignment", len(spec.spaces), len(spec.spaces))


def test_cli_progress_adapters_take_the_protocol(monkeypatch):
    from rich.console import Console

    from modeconn.cli import _app as cli

    console = Console(record=True, force_terminal=True, width=120)
    monkeypatch.setattr(cli, "console", console)
    with cli.progress_bar() as progress:
        for step in range(1, 4):
            progress("dual matching", step, 3, loss=2.0 / step, lam=0.5)
    text = console.export_text()
    assert "3/3" in text and "loss 0.6667" in text
    with cli.progress_bar() as progress:
        progress("run 1/1 sweep 1", 2, 2, objective=1.0)


# ------------------------------------------------------------------------------------------ endless batches
def test_endless_reiterates_the_loader_each_epoch_so_it_reshuffles():
    ds = TensorDataset(torch.arange(12))
    loader = DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    it = endless(loader)
    epochs = [torch.cat([next(it)[0] for _ in range(3)]) for _ in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(12))  # every example once per epoch
    assert not torch.equal(epochs[0], epochs[1]) or not torch.equal(epochs[1], epochs[2])  # a fresh order
    cyc = itertools.cycle(DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)))
    replay = [torch.cat([next(cyc)[0] for _ in range(3)]) for _ in range(2)]
    assert torch.equal(replay[0], replay[1])  # what endless avoids: cycle replays the first epoch's order


def test_endless_skips_and_names_empty_or_exhausted_loaders():
    it = endless([1, 2, 3], skip=4)
    assert [next(it) for _ in range(4)] == [2, 3, 1, 2]
    with pytest.raises(ConfigError, match="dual matching got an empty loader"):
        next(endless([], what="dual matching"))
    one_shot = endless(iter([1, 2]), what="learned_matching")
    assert [next(one_shot), next(one_shot)] == [1, 2]
    with pytest.raises(ConfigError, match="one-shot iterator"):
        next(one_shot)
    with pytest.raises(ConfigError, match="skip"):
        next(endless([1], skip=-1))


def test_learned_matching_draws_a_fresh_order_every_epoch():
    spec, a, b, x = _pair("mlp")
    seen = []

    class Recording:
        """A re-iterable loader recording which epoch each batch came from."""

        def __init__(self):
            self.epoch = 0

        def __iter__(self):
            self.epoch += 1
            for i, batch in enumerate(_loader(x, n=2, seed=self.epoch)):
                seen.append((self.epoch, i))
                yield batch

    loader = Recording()
    mc.learned_matching(spec, a, a.state_dict(), copy.deepcopy(b).state_dict(), loader, steps=5, wm_iters=1)
    assert loader.epoch == 3 and seen[:5] == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]


def test_cli_one_sided_is_its_own_method_name(tmp_path):
    from cli_runner import run_cli

    from modeconn.io import save_checkpoint
    from modeconn.models import build_model

    dirs = []
    for seed in (0, 1):
        m = build_model("mlp", in_shape=(1, 4, 4), num_classes=3, seed=seed, depth=2, width=8)
        dirs.append(save_checkpoint(tmp_path / f"m{seed}", m))
    res = run_cli("align", *dirs, "--method", "one-sided", "--out", tmp_path / "out", ok=False)
    assert res.exit_code != 0 and "--method one-sided needs language-model checkpoints" in res.output
    res = run_cli("align", *dirs, "--method", "sideways", "--out", tmp_path / "out", ok=False)
    assert "one-sided" in res.output  # listed among the choices
