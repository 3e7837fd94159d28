"""``device=`` / ``--device`` (issue #20 item 4), run on the CPU: the option is checked before any work with an error
naming it; ``device="cpu"`` computes exactly what the default computes; the accelerator code paths (products
accumulated on the device, merge arithmetic there) are exercised with the CPU standing in as the device; the LAP
solver policy per device type and size. The GPU itself is measured by benchmarks/gpu_check.py."""

from __future__ import annotations

import pytest
import torch
from cli_runner import run_cli
from hf_tiny import make

import modeconn as mc
from modeconn._util.device import DEVICE_TYPES, is_cpu, resolve_device
from modeconn.errors import ConfigError
from modeconn.io.lazy import LazyCheckpoint
from modeconn.match.lap import LAP_POLICIES, SPARSE_MIN_N, lap_method
from modeconn.match.weight import _Stream
from modeconn.stream import _merge_one, hf_checkpoint_spec, stream_merge, stream_weight_matching
from modeconn.symmetry.hf import hf_symmetry_spec

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("dev")
    dirs = [root / s for s in "ab"]
    models = [make("llama", seed) for seed in (0, 1)]
    for m, d in zip(models, dirs, strict=True):
        m.save_pretrained(d, max_shard_size="20KB")
    return (*dirs, *models)


# ------------------------------------------------------------------------------------------------ the option
def test_resolve_device_accepts_the_cpu_and_keeps_none():
    assert resolve_device(None) is None
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert is_cpu(None) and is_cpu(torch.device("cpu")) and not is_cpu(torch.device("cuda", 0))


@pytest.mark.parametrize(("value", "message"), [
    ("meta", "does not compute on 'meta'"), ("gpu0", "not a device name"), ("cuda:x", "not a device name"),
])
def test_unusable_devices_are_refused_naming_the_option(value, message):
    with pytest.raises(ConfigError, match=rf"--device '{value}'.*{message}"):
        resolve_device(value, "--device")


def test_unavailable_and_out_of_range_accelerators_are_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"--device 'cuda': CUDA is not available.*--device cpu"):
        resolve_device("cuda", "--device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match=r"index 2 .* only 2 cuda"):
        resolve_device("cuda:2")
    assert set(DEVICE_TYPES) >= {"cpu", "cuda", "mps"}


def test_every_public_entry_point_checks_the_device_before_work(hf_pair, tmp_path):
    da, db, ma, mb = hf_pair
    spec = hf_checkpoint_spec(da)
    with pytest.raises(ConfigError, match="device 'meta'"):
        mc.weight_matching(hf_symmetry_spec(ma), ma.state_dict(), mb.state_dict(), device="meta")
    with pytest.raises(ConfigError, match="device 'meta'"):
        stream_merge(spec, [da, db], tmp_path / "m", device="meta")
    assert not (tmp_path / "m").exists()
    for cmd in (["merge", da, db, "--align", "none"], ["align", da, db]):
        res = run_cli(*cmd, "--out", tmp_path / "o", "--device", "meta", ok=False)
        assert res.exit_code != 0 and "--device 'meta'" in res.output, res.output
        assert not (tmp_path / "o").exists()
    res = run_cli("check", da, "--out", tmp_path / "c", "--device", "nowhere", ok=False)
    assert res.exit_code != 0 and "--device 'nowhere'" in res.output, res.output
    for cmd in ("align", "merge", "check"):
        assert "--device" in run_cli(cmd, "--help").output


# ----------------------------------------------------------------------------------- cpu equals the default
def test_device_cpu_equals_the_default_bit_for_bit(hf_pair, tmp_path):
    da, db, ma, mb = hf_pair
    spec_m = hf_symmetry_spec(ma)
    ref = mc.weight_matching(spec_m, ma.state_dict(), mb.state_dict(), restarts=2, max_iter=20)
    cpu = mc.weight_matching(spec_m, ma.state_dict(), mb.state_dict(), restarts=2, max_iter=20, device="cpu")
    assert cpu.objective == ref.objective and all(torch.equal(cpu.element[s], ref.element[s]) for s in ref.element)
    spec = hf_checkpoint_spec(da)
    s_ref = stream_weight_matching(spec, da, db, restarts=1, max_iter=10)
    s_cpu = stream_weight_matching(spec, da, db, restarts=1, max_iter=10, device="cpu")
    assert s_cpu.objective == s_ref.objective and all(torch.equal(s_cpu.element[s], s_ref.element[s])
                                                      for s in s_ref.element)
    stream_merge(spec, [da, db], tmp_path / "ref", weights=[0.3, 0.7], elements=[None, s_ref.element])
    stream_merge(spec, [da, db], tmp_path / "cpu", weights=[0.3, 0.7], elements=[None, s_ref.element], device="cpu")
    for shard in LazyCheckpoint(tmp_path / "ref").shards:
        assert (tmp_path / "ref" / shard).read_bytes() == (tmp_path / "cpu" / shard).read_bytes(), shard


# ------------------------------------------------------------------- accelerator paths, the CPU standing in
def test_streamed_scores_accumulated_on_a_device_equal_the_host_path(hf_pair):
    da, db, ma, _ = hf_pair
    spec = hf_checkpoint_spec(da)
    keys = [k for k, b in spec.tensors.items() if b]
    host = _Stream(spec, LazyCheckpoint(da), LazyCheckpoint(db), keys, chunk=37)
    dev = _Stream(spec, LazyCheckpoint(da), LazyCheckpoint(db), keys, chunk=37, device=torch.device("cpu"))
    g = spec.random_element(seed=3)
    terms_by_space: dict = {}
    for k in keys:
        for bd in spec.tensors[k]:
            terms_by_space.setdefault(bd.space, []).append((k, bd, None))
    for s, terms in terms_by_space.items():
        n = spec.spaces[s].size
        a, b = host.score(terms, g, n), dev.score(terms, g, n)
        assert b.dtype == torch.float64 and torch.equal(a, b), s  # same fp32 products in the same order
    assert dev.objective(g, True, 0.0) == host.objective(g, True, 0.0)


def test_merge_arithmetic_on_a_device_returns_the_same_tensor():
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(33, 17, generator=g).half() for _ in range(3)]
    kw = dict(names=["a", "b", "c"], weights=[0.2, 0.3, 0.5], rule="linear", settings=None, dtype=None, out_dtype=None)
    host = _merge_one("w", xs, device=None, **kw)
    dev = _merge_one("w", xs, device=torch.device("cpu"), **kw)
    assert dev.dtype == torch.float16 and torch.equal(host, dev)


# ------------------------------------------------------------------------------------------------ LAP policy
def test_lap_policy_keeps_todays_solvers_on_the_cpu_and_chooses_by_size_on_accelerators():
    for n in (1, 64, SPARSE_MIN_N - 1, SPARSE_MIN_N, 50_000):
        assert lap_method(None, n) == "auto" and lap_method("cpu", n, batch=16) == "auto"
    assert lap_method("cuda", SPARSE_MIN_N - 1) == "dense" and lap_method("cuda:1", SPARSE_MIN_N) == "sparse"
    assert lap_method("mps", 8, batch=32) == "dense"
    assert all(p.why for p in LAP_POLICIES.values())
    with pytest.raises(ConfigError, match="no LAP policy for scores on 'meta'"):
        lap_method("meta", 10)


@pytest.mark.slow
def test_gpu_check_runs_on_the_cpu(tmp_path, monkeypatch):
    """benchmarks/gpu_check.py is ready for a GPU machine: its code paths run here (small sizes, results in tmp)."""
    import json
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))
    import _common
    import gpu_check

    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    monkeypatch.setattr(gpu_check, "SIZES", {"quick": {"score": [(64, 512)], "lap": [64], "heads": (4, 8),
                                                       "merge": [4096], "pair": (0.01, 1)}})
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu", "--quick", "--tmp", str(tmp_path)])
    gpu_check.main()
    res = json.loads((tmp_path / "gpu_check_cpu.json").read_text())
    assert res["device"] == "cpu" and res["score_products"][0]["max_rel_difference"] == 0.0
    assert res["lap"][0]["sparse_objective_minus_dense"] == pytest.approx(0.0, abs=1e-6)
    assert all(r["bit_identical"] for r in res["merge_arithmetic"])
    assert res["aligned_merge"]["cpu"]["recovered"]["min_fraction"] == 1.0  # the planted permutation, end to end
