"""timm and torchvision checkpoint kinds (issue #31 item 1) through the CLI, on tiny real models the test writes:
a timm ``resnet18d`` stored by ``timm.models.save_for_hf`` and a torchvision ``mobilenet_v2`` (×0.25) with a
``config.json`` naming its builder, weights as ``model.safetensors`` or a ``.pth`` state dict. Data: a tiny CIFAR-10
directory the test writes (``--dataset cifar10 --data DIR``) and the shared Fashion-MNIST (1×28×28).

Each output is reloaded by the library itself (``timm.create_model("local-dir:OUT", pretrained=True)``,
``torchvision.models.get_model`` + the state dict) and must compute the function it claims: an aligned B computes
B's logits, a merge with weights (1, 0) computes A's; negative controls check that the aligned weights did move and
that the pickle payload really runs when unpickled without ``weights_only``.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from cli_runner import run_cli
from safetensors.torch import load_file, save_file

from modeconn.checkpoints import open_checkpoint
from modeconn.errors import CheckpointError, StateDictMismatchError
from modeconn.io import load_pickle_state_dict

timm = pytest.importorskip("timm")
torchvision = pytest.importorskip("torchvision")
pytestmark = pytest.mark.usefixtures("one_thread")

TIMM_ARGS = {"num_classes": 10, "channels": (8, 16, 32, 64), "stem_width": 8}


def _trained_like(model):
    """Parameters moved off their initialisation (zero biases, unit norms, a near-zero classifier), so that logits are
    of order one and a wrong permutation shows."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))  # the global RNG, seeded by the caller
    return model.eval()


def _timm_model(seed: int, in_chans: int = 3):
    torch.manual_seed(seed)
    return _trained_like(timm.create_model("resnet18d", in_chans=in_chans, **TIMM_ARGS))


def _tv_model(seed: int):
    torch.manual_seed(seed)
    return _trained_like(torchvision.models.get_model("mobilenet_v2", weights=None, num_classes=10, width_mult=0.25))


def _write_cifar10(root, n_train: int = 24, n_test: int = 16):
    """A CIFAR-10 python-batch directory of random images (5 train batches of ``n_train`` and a test batch)."""
    rng = np.random.default_rng(0)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)

    def dump(name, n):
        with open(d / name, "wb") as fh:
            pickle.dump({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         b"labels": [int(v) for v in rng.integers(0, 10, n)]}, fh, protocol=2)
    for i in range(1, 6):
        dump(f"data_batch_{i}", n_train)
    dump("test_batch", n_test)
    with open(d / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, fh, protocol=2)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write_cifar10(tmp_path_factory.mktemp("cifar"))


@pytest.fixture(scope="module")
def timm_pair(tmp_path_factory):
    """A as model.safetensors, B as timm's default pytorch_model.bin."""
    root = tmp_path_factory.mktemp("timm")
    for name, seed, safe in (("a", 0, True), ("b", 1, False)):
        timm.models.save_for_hf(_timm_model(seed), root / name, safe_serialization=safe)
    return root / "a", root / "b"


def _write_tv(directory, model, weights: str = "model.safetensors"):
    directory.mkdir(parents=True)
    config = {"torchvision_model": "mobilenet_v2", "kwargs": {"num_classes": 10, "width_mult": 0.25},
              "input_size": [3, 32, 32]}
    (directory / "config.json").write_text(json.dumps(config))
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if weights.endswith(".safetensors"):
        save_file(sd, str(directory / weights))
    else:
        torch.save(sd, directory / weights)
    return directory


@pytest.fixture(scope="module")
def tv_pair(tmp_path_factory):
    """A as model.safetensors, B as a model.pth state dict of plain tensors."""
    root = tmp_path_factory.mktemp("tv")
    return _write_tv(root / "a", _tv_model(0)), _write_tv(root / "b", _tv_model(1), "model.pth")


X = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))


def _logits(model, x=X):
    with torch.no_grad():
        return model.eval()(x)


def _timm_reload(path):
    """The directory as timm itself loads it (config and weights, no network)."""
    return timm.create_model(f"local-dir:{path}", pretrained=True).eval()


def _tv_reload(path):
    cfg = json.loads((path / "config.json").read_text())
    model = torchvision.models.get_model(cfg["torchvision_model"], weights=None, **cfg["kwargs"])
    model.load_state_dict(load_file(str(path / "model.safetensors")))
    return model.eval()


# ------------------------------------------------------------------------------------------------ detection, loading


def test_kinds_are_detected_and_load_what_the_libraries_load(timm_pair, tv_pair, tmp_path):
    for path, kind, reload in ((timm_pair[0], "timm", _timm_reload), (tv_pair[0], "torchvision", _tv_reload)):
        ckpt = open_checkpoint(path)
        assert ckpt.kind.name == kind
        assert torch.allclose(_logits(ckpt.load()), _logits(reload(path)))
    b = open_checkpoint(timm_pair[1]).load()  # pytorch_model.bin
    assert torch.equal(_logits(b), _logits(_timm_model(1)))
    b = open_checkpoint(tv_pair[1]).load()  # model.pth of plain tensors
    assert torch.equal(_logits(b), _logits(_tv_model(1)))
    from modeconn.io import save_checkpoint
    from modeconn.models import build_model

    mc = save_checkpoint(tmp_path / "mc", build_model("mlp", in_shape=(1, 4, 4), num_classes=2, depth=1, width=4))
    assert open_checkpoint(mc).kind.name == "modeconn"  # 'architecture' and 'kwargs': never taken for timm


# ------------------------------------------------------------------------------------------------ align


@pytest.mark.parametrize("method", ["weight", "activation"])
def test_align_timm_writes_a_timm_directory_computing_b(timm_pair, data, tmp_path, method):
    a, b = timm_pair
    out = tmp_path / "aligned"
    extra = [] if method == "weight" else ["--dataset", "cifar10", "--data", data]
    run_cli("align", a, b, "--method", method, "--out", out, *extra)
    aligned, original = _timm_reload(out), _timm_reload(b)
    assert (_logits(aligned) - _logits(original)).abs().max() < 1e-4
    moved = [k for k, v in aligned.state_dict().items() if not torch.equal(v, original.state_dict()[k])]
    assert moved, "the aligned B equals B: nothing was permuted (the function check would pass vacuously)"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architecture"] == "resnet18d" and cfg["modeconn"]["alignment"] == method
    assert (out / "alignment.json").is_file() and open_checkpoint(out).kind.name == "timm"


def test_align_torchvision_learned_keeps_b_function(tv_pair, data, tmp_path):
    a, b = tv_pair
    out = tmp_path / "aligned"
    run_cli("align", a, b, "--method", "learned", "--steps", "2", "--dataset", "cifar10", "--data", data,
            "--out", out)
    assert (_logits(_tv_reload(out)) - _logits(_tv_reload_pth(b))).abs().max() < 1e-4
    assert json.loads((out / "config.json").read_text())["torchvision_model"] == "mobilenet_v2"


def _tv_reload_pth(path):
    model = torchvision.models.get_model("mobilenet_v2", weights=None, num_classes=10, width_mult=0.25)
    model.load_state_dict(torch.load(path / "model.pth", weights_only=True))
    return model.eval()


def test_align_refuses_language_model_methods_by_name(timm_pair, tmp_path):
    res = run_cli("align", *timm_pair, "--method", "dual", "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "not offered for timm checkpoints" in res.output, res.output


# ------------------------------------------------------------------------------------------------ merge


@pytest.mark.parametrize("align", ["weight", "activation", "none"])
def test_merge_timm_reloads_identically(timm_pair, data, tmp_path, align):
    out = tmp_path / "merged"
    run_cli("merge", *timm_pair, "--align", align, "--dataset", "cifar10", "--data", data, "--out", out)
    ours, theirs = open_checkpoint(out).load(), _timm_reload(out)
    assert torch.equal(_logits(ours), _logits(theirs))
    assert json.loads((out / "config.json").read_text())["modeconn"]["align"] == align
    assert (out / "metrics.json").is_file()  # evaluated on the test split


def test_merge_timm_by_a_rule_with_a_base(timm_pair, data, tmp_path):
    out = tmp_path / "ties"
    run_cli("merge", *timm_pair, "--rule", "ties", "--base", timm_pair[0], "--param", "density=0.5", "--dataset",
            "cifar10", "--data", data, "--out", out)
    record = json.loads((out / "config.json").read_text())["modeconn"]
    assert record["rule"] == "ties" and record["params"] == {"density": 0.5}
    assert torch.equal(_logits(open_checkpoint(out).load()), _logits(_timm_reload(out)))


def test_merge_with_weights_one_zero_computes_a(tv_pair, tmp_path):
    out = tmp_path / "merged"
    run_cli("merge", *tv_pair, "--align", "none", "--weights", "1,0", "--bn", "interpolate", "--out", out)
    assert (_logits(_tv_reload(out)) - _logits(_tv_model(0))).abs().max() < 1e-5
    assert (_logits(_tv_reload(out)) - _logits(_tv_model(1))).abs().max() > 1e-3  # negative control: not B


def test_merge_refuses_what_does_not_apply(timm_pair, tmp_path):
    res = run_cli("merge", *timm_pair, "--align", "activation", "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "need a dataset" in res.output, res.output
    res = run_cli("merge", *timm_pair, "--out", tmp_path / "o", ok=False)  # --bn reset (the default) without data
    assert res.exit_code == 2 and "--bn reset re-estimates" in res.output and "pass --dataset" in res.output, res.output
    res = run_cli("merge", *timm_pair, "--dtype", "bf16", "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "--dtype does not apply to merging timm checkpoints" in res.output, res.output
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------------ barrier, path, check


def test_barrier_and_path_on_timm(timm_pair, data, tmp_path):
    run_cli("barrier", *timm_pair, "--dataset", "cifar10", "--data", data, "--lambdas", "3", "--method", "naive",
            "--method", "weight", "--out", tmp_path / "bar")
    r = json.loads((tmp_path / "bar" / "results.json").read_text())
    assert r["dataset"]["name"] == "cifar10" and r["models"] == [str(p) for p in timm_pair]
    run_cli("path", *timm_pair, "--method", "linear", "--dataset", "cifar10", "--data", data, "--out",
            tmp_path / "path")
    assert (tmp_path / "path" / "results.json").is_file()
    run_cli("path", *timm_pair, "--method", "bezier", "--budget", "20", "--dataset", "cifar10", "--data", data,
            "--out", tmp_path / "bezier")
    assert json.loads((tmp_path / "bezier" / "results.json").read_text())


def test_check_on_torchvision(tv_pair, data, tmp_path):
    run_cli("check", *tv_pair, "--dataset", "cifar10", "--data", data, "--max-batches", "1", "--out", tmp_path / "c")
    assert (tmp_path / "c" / "report.md").is_file()


def test_fashion_mnist_fits_a_one_channel_timm_model_and_not_a_three_channel_one(timm_pair, tmp_path):
    for name, seed in (("a", 0), ("b", 1)):
        timm.models.save_for_hf(_timm_model(seed, in_chans=1), tmp_path / name)
    run_cli("check", tmp_path / "a", tmp_path / "b", "--dataset", "fashion-mnist", "--limit-train", "64",
            "--eval-limit", "64", "--max-batches", "1", "--out", tmp_path / "c")
    res = run_cli("barrier", *timm_pair, "--dataset", "fashion-mnist", "--out", tmp_path / "bar", ok=False)
    assert res.exit_code == 2 and "(1, 28, 28)" in res.output and "(3, 'any', 'any')" in res.output, res.output
    assert not (tmp_path / "bar").exists()
    res = run_cli("barrier", *timm_pair, "--out", tmp_path / "bar", ok=False)
    assert res.exit_code == 2 and "pass --dataset" in res.output, res.output


# ------------------------------------------------------------------------------------------------ .pth policy


class _Payload:
    """Unpickling this runs ``open(marker, "w")``: what a malicious .pth does."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pth_that_needs_code_is_refused_and_never_runs(tv_pair, tmp_path):
    marker = tmp_path / "pwned"
    d = tmp_path / "evil"
    d.mkdir()
    (d / "config.json").write_text((tv_pair[0] / "config.json").read_text())
    sd = {k: v.contiguous() for k, v in _tv_model(0).state_dict().items()}
    torch.save({**sd, "extra": _Payload(marker)}, d / "model.pth")
    with pytest.raises(CheckpointError, match="model.pth"):
        open_checkpoint(d).load()
    res = run_cli("check", d, d, "--dataset", "cifar10", "--out", tmp_path / "c", ok=False)
    assert res.exit_code != 0 and "model.pth" in res.output and "weights_only" in res.output, res.output
    assert not marker.exists(), "the pickle's code ran"
    torch.load(d / "model.pth", weights_only=False)  # negative control: the payload is real
    assert marker.exists()


def test_pth_of_plain_tensors_loads_and_key_errors_name_the_key(tmp_path):
    sd = {k: v.contiguous() for k, v in _tv_model(0).state_dict().items()}
    torch.save(sd, tmp_path / "ok.pth")
    assert load_pickle_state_dict(tmp_path / "ok.pth").keys() == sd.keys()
    cases = {"missing": {k: v for k, v in sd.items() if k != "classifier.1.bias"},
             "unexpected": {**sd, "head.extra": torch.zeros(1)},
             "shape": {**sd, "classifier.1.bias": torch.zeros(3)}}
    for name, state in cases.items():
        d = _write_tv(tmp_path / name, _tv_model(0))
        (d / "model.safetensors").unlink()
        torch.save(state, d / "model.pt")
        with pytest.raises(StateDictMismatchError, match="classifier.1.bias" if name != "unexpected" else "head.extra"):
            open_checkpoint(d).load()


def test_barrier_and_eval_on_torchvision_and_eval_on_timm(tv_pair, timm_pair, data, tmp_path):
    run_cli("barrier", *tv_pair, "--dataset", "cifar10", "--data", data, "--lambdas", "3", "--method", "naive",
            "--out", tmp_path / "bar")
    assert json.loads((tmp_path / "bar" / "results.json").read_text())["barriers"]["naive"]
    res = run_cli("path", *tv_pair, "--method", "linear", "--dataset", "cifar10", "--data", data, "--eval-limit", "50",
                  "--out", tmp_path / "p", ok=False)
    assert res.exit_code in (0, 3) and (tmp_path / "p" / "results.json").is_file(), res.output  # 3: incomplete path
    for name, ckpt in (("tv", tv_pair[0]), ("timm", timm_pair[0])):
        run_cli("eval", ckpt, "--dataset", "cifar10", "--data", data, "--out", tmp_path / name)
        r = json.loads((tmp_path / name / "results.json").read_text())
        assert r["dataset"]["name"] == "cifar10" and 0 <= r["test"]["acc"] <= 1 and "perplexity" not in r["test"]
