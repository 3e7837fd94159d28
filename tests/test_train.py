"""Training loop: learning, determinism, config validation, LR schedule, train_checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from modeconn.errors import CheckpointError, ConfigError, NonFiniteError
from modeconn.io import load_checkpoint
from modeconn.models import build_model
from modeconn.train import TrainConfig, evaluate, fit, lr_factor, make_optimizer, make_scheduler, train_checkpoint


def _separable(n=384, in_shape=(1, 4, 4), k=3, seed=0) -> TensorDataset:
    """Gaussian inputs labelled by a random linear map: linearly separable."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *in_shape, generator=g)
    w = torch.randn(math.prod(in_shape), k, generator=g)
    return TensorDataset(x, (x.flatten(1) @ w).argmax(1))


def _mlp(seed=0, **kw):
    return build_model("mlp", in_shape=(1, 4, 4), num_classes=3, depth=1, width=32, seed=seed, **kw)


QUICK = dict(epochs=6, batch_size=32, lr=0.05, weight_decay=0.0)


def test_loss_decreases_and_accuracy_rises():
    data = _separable()
    model = _mlp()
    before = evaluate(model, data)
    history = fit(model, data, QUICK, val_set=data, progress=False)
    assert len(history) == 6
    assert [h["epoch"] for h in history] == list(range(1, 7))
    assert history[-1]["train_loss"] < 0.6 * history[0]["train_loss"]
    assert history[-1]["val_loss"] < 0.5 * before["loss"]
    assert history[-1]["val_acc"] > 0.85
    for h in history:
        assert set(h) >= {"epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr", "seconds", "samples_per_second"}
        assert h["seconds"] > 0 and h["samples_per_second"] > 0 and h["steps"] == 12 * h["epoch"]


def test_progress_bar_and_other_options_run(capsys):
    data = _separable(n=96)
    model = build_model("mlp", in_shape=(1, 4, 4), num_classes=3, depth=1, width=8, norm="batchnorm", seed=0)
    cfg = TrainConfig(
        epochs=2, batch_size=32, optimizer="adamw", lr=1e-3, label_smoothing=0.1, grad_clip=1.0,
        schedule="linear", warmup_epochs=0.5, eval_every_epoch=False,
    )
    history = fit(model, data, cfg, val_set=data, progress=True)
    assert history[0]["val_loss"] is None and history[1]["val_loss"] is not None
    fit(model, data, dict(epochs=1, batch_size=32, nesterov=True), progress=False)


def test_determinism_same_seed_same_weights():
    data = _separable()
    cfg = TrainConfig(epochs=1, batch_size=32, lr=0.05, seed=7)
    a, b = _mlp(seed=1), _mlp(seed=1)
    fit(a, data, cfg, progress=False)
    fit(b, data, cfg, progress=False)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=False):
        assert torch.equal(va, vb), k
    c = _mlp(seed=1)
    fit(c, data, cfg.model_copy(update={"seed": 8}), progress=False)  # other data order → other weights
    assert not torch.equal(a.head.weight, c.head.weight)


def test_fit_does_not_disturb_global_rng_and_restores_mode():
    data = _separable(n=64)
    model = _mlp().eval()
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    fit(model, data, dict(epochs=1, batch_size=32), progress=False)
    assert torch.equal(torch.rand(2), expected)
    assert not model.training


class _PairDataset(Dataset):
    """A map-style dataset that is not a TensorDataset (exercises the DataLoader path)."""

    def __init__(self, base: TensorDataset) -> None:
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        return self.base[i]


def test_generic_dataset_and_loader_paths_agree():
    data = _separable(n=100)
    model = _mlp()
    fit(model, _PairDataset(data), dict(epochs=1, batch_size=16), progress=False)
    ref = evaluate(model, data, batch_size=7)
    via_ds = evaluate(model, _PairDataset(data))
    via_loader = evaluate(model, torch.utils.data.DataLoader(data, batch_size=33))
    for other in (via_ds, via_loader):
        assert other["n"] == ref["n"] == 100
        assert other["acc"] == ref["acc"]
        assert other["loss"] == pytest.approx(ref["loss"], rel=1e-6)


def test_evaluate_matches_manual_and_restores_mode():
    data = _separable(n=50)
    model = build_model("mlp", in_shape=(1, 4, 4), num_classes=3, depth=1, width=8, norm="batchnorm", seed=0)
    model.train()
    x, y = data.tensors
    res = evaluate(model, data, batch_size=16)
    assert model.training
    with torch.no_grad():
        logits = model.eval()(x)
    assert res["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
    assert res["acc"] == (logits.argmax(1) == y).sum().item() / 50
    with pytest.raises(ConfigError, match="empty"):
        evaluate(model, TensorDataset(torch.zeros(0, 1, 4, 4), torch.zeros(0, dtype=torch.long)))


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"lrr": 0.1}, "lrr"),
        ({"warmup_epoch": 1}, "warmup_epochs"),
        ({"optimizer": "adam"}, "optimizer"),
        ({"schedule": "step"}, "schedule"),
        ({"lr": -1.0}, "lr"),
        ({"epochs": 0}, "epochs"),
        ({"device": "gpu"}, "device"),
        ({"nesterov": True, "momentum": 0.0}, "nesterov"),
        ({"label_smoothing": 1.0}, "label_smoothing"),
    ],
)
def test_train_config_rejects_typos_and_bad_values(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        TrainConfig(**kwargs)
    with pytest.raises(ConfigError, match=needle):
        fit(_mlp(), _separable(n=8), kwargs, progress=False)


def test_typo_message_lists_valid_fields():
    with pytest.raises(ConfigError) as err:
        TrainConfig(lrr=0.1)
    assert "did you mean 'lr'" in str(err.value) and "batch_size" in str(err.value)


def test_lr_factor_values():
    # 10 steps, 4 warm-up: 1/4, 2/4, 3/4, 1, then decay over 6 steps
    warm = [lr_factor(s, 10, 4, "cosine") for s in range(4)]
    assert warm == [0.25, 0.5, 0.75, 1.0]
    cos = [lr_factor(s, 10, 4, "cosine") for s in range(4, 10)]
    assert cos == pytest.approx([0.5 * (1 + math.cos(math.pi * i / 6)) for i in range(6)])
    lin = [lr_factor(s, 10, 4, "linear") for s in range(4, 10)]
    assert lin == pytest.approx([1 - i / 6 for i in range(6)])
    assert [lr_factor(s, 10, 0, "constant") for s in range(10)] == [1.0] * 10
    assert all(a > b for a, b in zip(cos, cos[1:], strict=False))
    with pytest.raises(ConfigError, match="cosine"):
        lr_factor(5, 10, 0, "step")


def test_scheduler_follows_lr_factor_with_fractional_warmup():
    model = _mlp()
    cfg = TrainConfig(epochs=2, batch_size=8, lr=0.4, warmup_epochs=0.5, schedule="linear")
    opt = make_optimizer(model, cfg)
    sched = make_scheduler(opt, cfg, steps_per_epoch=4)  # 8 steps, 2 warm-up
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.2, 0.4, 0.4, 0.4 * 5 / 6, 0.4 * 4 / 6, 0.4 * 3 / 6, 0.4 * 2 / 6, 0.4 / 6])


def test_fit_reports_lr_of_last_step():
    data = _separable(n=64)
    history = fit(_mlp(), data, dict(epochs=2, batch_size=16, lr=0.1, schedule="linear"), progress=False)
    assert history[0]["lr"] == pytest.approx(0.1 * (1 - 3 / 8))
    assert history[1]["lr"] == pytest.approx(0.1 * (1 - 7 / 8))


def test_non_finite_loss_raises():
    data = _separable(n=64)
    x, y = data.tensors
    x = x.clone()
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="epoch 1"):
        fit(_mlp(), TensorDataset(x, y), dict(epochs=1, batch_size=16), progress=False)


def test_train_checkpoint_writes_loadable_dir(tmp_path):
    train, test = _separable(n=128, seed=0), _separable(n=64, seed=1)
    cfg = TrainConfig(epochs=2, batch_size=32, lr=0.05, seed=3)
    kwargs = {"in_shape": (1, 4, 4), "num_classes": 3, "depth": 1, "width": 16}
    out = train_checkpoint(
        "mlp", kwargs, train, cfg, tmp_path / "run", val_set=test, test_set=test,
        extra_config={"dataset": "synthetic"}, progress=False,
    )
    model, config = load_checkpoint(out)
    assert config["dataset"] == "synthetic"
    assert config["training"] == cfg.model_dump(mode="json")
    assert config["kwargs"]["width"] == 16
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["history"]) == 2 and metrics["final"]["epoch"] == 2
    assert metrics["test"] == pytest.approx(evaluate(model, test))

    # the same call reproduces the same weights (built with seed=config.seed, deterministic fit)
    again = train_checkpoint("mlp", kwargs, train, cfg, tmp_path / "run2", progress=False)
    model2, _ = load_checkpoint(again)
    for k, v in model.state_dict().items():
        assert torch.equal(v, model2.state_dict()[k]), k

    # validation happens before training: existing dir, bad kwargs, reserved key
    with pytest.raises(CheckpointError, match="overwrite"):
        train_checkpoint("mlp", kwargs, train, cfg, out, progress=False)
    with pytest.raises(ConfigError, match="widht"):
        train_checkpoint("mlp", {**kwargs, "widht": 3}, train, cfg, tmp_path / "x", progress=False)
    with pytest.raises(ConfigError, match="training"):
        train_checkpoint("mlp", kwargs, train, cfg, tmp_path / "x", extra_config={"training": 1}, progress=False)
    assert not (tmp_path / "x").exists()
