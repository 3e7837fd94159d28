"""Tests of modeconn.data: loaders, IDX/CIFAR readers, checksums, splits and data loaders."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import pickle
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from modeconn.data import (
    DATASETS,
    DatasetBundle,
    find_data_dir,
    load_dataset,
    locate,
    make_loader,
    read_idx,
    safe_unpickle,
    split_indices,
    verify_sha256,
    write_idx,
)
from modeconn.data import download as download_mod
from modeconn.errors import ConfigError, DataError

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture(autouse=True)
def _isolated_search(tmp_path_factory, monkeypatch):
    """No test may find data through the real environment, cache or system directories by accident."""
    monkeypatch.delenv("MODECONN_DATA", raising=False)
    monkeypatch.setattr(locate, "default_data_roots", lambda: [])  # nor through $MODECONN_DATA's default (#16)
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setattr(locate, "cache_dir", lambda: cache)
    fm = locate.LAYOUTS["fashion-mnist"]
    monkeypatch.setitem(locate.LAYOUTS, "fashion-mnist",
                        dataclasses.replace(fm, system_dirs=(str(cache / "no-system-dir"),)))


@pytest.fixture(scope="module")
def mnist(shared_data) -> DatasetBundle:
    return load_dataset("mnist", shared_data, val_fraction=0.1, split_seed=0)


def _idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    """IDX bytes written by hand (independent of modeconn's writer)."""
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def _fake_idx_dir(directory, n_train=6, n_test=4, compress=True, n_train_labels=None):
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train_labels or n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for stem, arr in arrays.items():
        write_idx(directory / (stem + (".gz" if compress else "")), arr, compress=compress)
    return arrays


# ---------------------------------------------------------------- digits


def test_digits_shapes_counts_and_normalisation():
    b = load_dataset("digits")
    x, y = b.train.tensors
    assert b.name == "digits" and b.source == "sklearn"
    assert b.num_classes == 10 and b.input_shape == (1, 8, 8) and b.classes == tuple("0123456789")
    assert (len(b.train), len(b.val), len(b.test)) == (1437 - 144, 144, 360)
    assert len(b.train) + len(b.val) + len(b.test) == 1797
    for ds in (b.train, b.val, b.test):
        assert ds.tensors[0].dtype == torch.float32 and ds.tensors[1].dtype == torch.int64
        assert ds.tensors[0].shape[1:] == (1, 8, 8)
    # Stratified test split: 35-37 of each class.
    counts = torch.bincount(b.test.tensors[1], minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    # The documented constants normalise the train+val pool to mean 0, std 1.
    pool = torch.cat([x, b.val.tensors[0]])
    assert abs(pool.mean().item()) < 1e-3 and abs(pool.std().item() - 1) < 1e-3


def test_digits_deterministic_and_seeded():
    a, b = load_dataset("digits"), load_dataset("digits")
    for sa, sb in ((a.train, b.train), (a.val, b.val), (a.test, b.test)):
        assert all(torch.equal(ta, tb) for ta, tb in zip(sa.tensors, sb.tensors, strict=False))
    c = load_dataset("digits", split_seed=1)
    assert torch.equal(a.test.tensors[0], c.test.tensors[0])  # the test split never depends on split_seed
    assert not torch.equal(a.val.tensors[0], c.val.tensors[0])


def test_limits_and_empty_val():
    full = load_dataset("digits")
    b = load_dataset("digits", limit_train=100, limit_test=50)
    assert (len(b.train), len(b.val), len(b.test)) == (100, 144, 50)
    assert torch.equal(b.train.tensors[0], full.train.tensors[0][:100])
    assert torch.equal(b.test.tensors[1], full.test.tensors[1][:50])
    z = load_dataset("digits", val_fraction=0.0)
    assert len(z.val) == 0 and z.val.tensors[0].shape == (0, 1, 8, 8) and len(z.train) == 1437
    for bad in (dict(val_fraction=1.0), dict(val_fraction=-0.1), dict(limit_train=-1), dict(limit_test=2.5)):
        with pytest.raises(ConfigError):
            load_dataset("digits", **bad)


# ---------------------------------------------------------------- MNIST / Fashion-MNIST (real files)


def test_mnist_counts(mnist, shared_data):
    assert mnist.source == str(shared_data / "mnist")
    assert len(mnist.train) + len(mnist.val) == 60000 and len(mnist.val) == 6000 and len(mnist.test) == 10000
    assert mnist.input_shape == (1, 28, 28) and mnist.train.tensors[0].shape == (54000, 1, 28, 28)
    assert mnist.train.tensors[0].dtype == torch.float32 and mnist.test.tensors[1].dtype == torch.int64
    assert torch.bincount(mnist.test.tensors[1], minlength=10).tolist() == MNIST_TEST_COUNTS
    pool_y = torch.cat([mnist.train.tensors[1], mnist.val.tensors[1]])
    assert torch.bincount(pool_y, minlength=10).tolist() == MNIST_TRAIN_COUNTS
    pool_x = torch.cat([mnist.train.tensors[0], mnist.val.tensors[0]])
    assert abs(pool_x.mean().item()) < 1e-3 and abs(pool_x.std().item() - 1) < 1e-3


def test_fashion_mnist_loads(shared_data):
    b = load_dataset("fashion-mnist", shared_data / "fashion-mnist", val_fraction=0.0, limit_test=100)
    assert b.source == str(shared_data / "fashion-mnist")
    assert len(b.train) == 60000 and len(b.test) == 100 and b.classes[0] == "T-shirt/top"
    assert torch.bincount(b.train.tensors[1], minlength=10).tolist() == [6000] * 10
    x = b.train.tensors[0]
    assert x.shape == (60000, 1, 28, 28) and abs(x.mean().item()) < 1e-3 and abs(x.std().item() - 1) < 1e-3


def test_find_data_dir_resolution(shared_data, tmp_path, monkeypatch):
    assert find_data_dir("mnist", shared_data) == shared_data / "mnist"  # parent
    assert find_data_dir("mnist", shared_data / "mnist") == shared_data / "mnist"  # the directory itself
    monkeypatch.setenv("MODECONN_DATA", str(shared_data))
    assert find_data_dir("fashion-mnist") == shared_data / "fashion-mnist"
    # An explicit root is authoritative: no silent fallback to $MODECONN_DATA.
    with pytest.raises(DataError, match="not found"):
        find_data_dir("mnist", tmp_path)
    with pytest.raises(ConfigError):
        find_data_dir("digits")


def test_missing_dir_lists_every_place(tmp_path, monkeypatch):
    monkeypatch.setenv("MODECONN_DATA", str(tmp_path / "data"))
    (tmp_path / "data" / "fashion-mnist").mkdir(parents=True)  # exists but empty
    with pytest.raises(DataError) as info:
        load_dataset("fashion-mnist")
    msg = str(info.value)
    for place in (tmp_path / "data" / "fashion-mnist", tmp_path / "data" / "FashionMNIST" / "raw",
                  locate.LAYOUTS["fashion-mnist"].system_dirs[0], locate.cache_dir() / "fashion-mnist"):
        assert str(place) in msg
    assert "missing train-images-idx3-ubyte[.gz]" in msg
    assert "MODECONN_DATA" in msg and "root=" in msg and "download=True" in msg

    monkeypatch.delenv("MODECONN_DATA")
    with pytest.raises(DataError) as info:
        load_dataset("mnist", tmp_path / "nowhere")
    msg = str(info.value)
    assert str(tmp_path / "nowhere") in msg and str(tmp_path / "nowhere" / "mnist") in msg


# ---------------------------------------------------------------- IDX format


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_plain_and_gzip(tmp_path, compress):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    data = _idx_bytes(images)
    path = tmp_path / ("x.idx.gz" if compress else "x.idx")  # detection is by content, not name
    path.write_bytes(gzip.compress(data) if compress else data)
    out = read_idx(path)
    assert out.dtype == np.uint8 and out.shape == (2, 3, 4) and np.array_equal(out, images)
    out[0, 0, 0] = 7  # writable


def test_idx_other_dtypes_and_writer_roundtrip(tmp_path):
    a = np.array([[1, -2], [300000, 4]], dtype=np.int32)
    (tmp_path / "a").write_bytes(_idx_bytes(a, code=0x0C))
    assert np.array_equal(read_idx(tmp_path / "a"), a)
    f = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    write_idx(tmp_path / "f.gz", f, compress=True)
    assert np.array_equal(read_idx(tmp_path / "f.gz"), f)


def test_truncated_and_malformed_idx(tmp_path):
    images = np.zeros((5, 28, 28), dtype=np.uint8)
    data = _idx_bytes(images)
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(data[:-100])
    with pytest.raises(DataError) as info:
        read_idx(bad)
    msg = str(info.value)
    assert str(bad) in msg
    assert f"expected {len(data)} bytes" in msg and f"actual {len(data) - 100} bytes" in msg

    gz = tmp_path / "cut.gz"
    gz.write_bytes(gzip.compress(data)[:-20])
    with pytest.raises(DataError, match="cut.gz"):
        read_idx(gz)

    magic = tmp_path / "magic"
    magic.write_bytes(b"\x12\x34" + data[2:])
    with pytest.raises(DataError, match="magic"):
        read_idx(magic)


def test_fake_mnist_dir_checksum_and_consistency(tmp_path):
    root = tmp_path / "data"
    arrays = _fake_idx_dir(root / "mnist", compress=False)
    # verify=True (default): the content hashes of the real MNIST do not match.
    with pytest.raises(DataError) as info:
        load_dataset("mnist", root)
    msg = str(info.value)
    assert "SHA-256 mismatch" in msg and "train-images-idx3-ubyte" in msg
    assert "expected ba891046" in msg and "actual" in msg
    b = load_dataset("mnist", root, verify=False, val_fraction=0.5)
    assert (len(b.train), len(b.val), len(b.test)) == (3, 3, 4)
    pool = torch.cat([b.train.tensors[1], b.val.tensors[1]]).sort().values
    assert pool.tolist() == sorted(arrays["train-labels-idx1-ubyte"].tolist())

    mismatch = tmp_path / "mismatch"
    _fake_idx_dir(mismatch, n_train=6, n_train_labels=5)
    with pytest.raises(DataError, match="6 images but .* 5 labels"):
        load_dataset("mnist", mismatch, verify=False)


def test_verify_sha256(tmp_path):
    path = tmp_path / "file.bin"
    path.write_bytes(b"modeconn")
    good = hashlib.sha256(b"modeconn").hexdigest()
    assert verify_sha256(path, good.upper()) == good
    with pytest.raises(DataError) as info:
        verify_sha256(path, "0" * 64)
    msg = str(info.value)
    assert str(path) in msg and "0" * 64 in msg and good in msg


# ---------------------------------------------------------------- download (network replaced)


def test_download_keeps_only_verified_files(shared_data, tmp_path, monkeypatch):
    def good_fetch(url, output):
        shutil.copyfile(shared_data / "mnist" / url.rsplit("/", 1)[1], output)

    def bad_fetch(url, output):
        output.write_bytes(gzip.compress(b"not mnist"))

    def offline(url, output):
        raise OSError("network unreachable")

    dest = tmp_path / "root"
    monkeypatch.setattr(download_mod, "_fetch", bad_fetch)
    with pytest.raises(DataError) as info:
        find_data_dir("mnist", dest, download=True)
    assert "SHA-256 mismatch" in str(info.value) and "https://" in str(info.value)
    assert list((dest / "mnist").iterdir()) == []  # nothing unverified kept, no temp files left

    monkeypatch.setattr(download_mod, "_fetch", offline)
    with pytest.raises(DataError, match="network unreachable"):
        find_data_dir("mnist", download=True)

    monkeypatch.setattr(download_mod, "_fetch", good_fetch)
    assert find_data_dir("mnist", dest, download=True) == dest / "mnist"
    assert sorted(p.name for p in (dest / "mnist").iterdir()) == sorted(f"{s}.gz" for s in IDX_STEMS)


# ---------------------------------------------------------------- CIFAR (tiny generated files)


def _cifar_images(n, offset):
    """(n, 3072) uint8 with image i, channel c filled with (offset + 3 i + c) % 256."""
    vals = (offset + 3 * np.arange(n)[:, None] + np.arange(3)[None, :]) % 256
    return np.repeat(vals, 1024, axis=1).astype(np.uint8)


def _dump(path, obj, protocol):
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=protocol)


def _write_cifar10(directory, bytes_keys=True, protocol=2):
    directory.mkdir(parents=True)
    k = (lambda s: s.encode()) if bytes_keys else (lambda s: s)
    for i in range(1, 6):
        _dump(directory / f"data_batch_{i}",
              {k("batch_label"): k(f"batch {i}"), k("data"): _cifar_images(3, 10 * i),
               k("labels"): [(i + j) % 10 for j in range(3)], k("filenames"): [k("a.png")] * 3}, protocol)
    _dump(directory / "test_batch", {k("data"): _cifar_images(4, 200), k("labels"): [0, 1, 2, 9]}, protocol)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    _dump(directory / "batches.meta", {k("label_names"): [k(n) for n in names], k("num_vis"): 3072}, protocol)


@pytest.mark.parametrize("bytes_keys,protocol", [(True, 2), (False, pickle.HIGHEST_PROTOCOL)])
def test_cifar10_tiny(tmp_path, bytes_keys, protocol):
    _write_cifar10(tmp_path / "cifar-10-batches-py", bytes_keys, protocol)
    b = load_dataset("cifar10", tmp_path, val_fraction=0.2)
    assert b.source == str(tmp_path / "cifar-10-batches-py")
    assert (len(b.train), len(b.val), len(b.test)) == (12, 3, 4)
    assert b.train.tensors[0].shape == (12, 3, 32, 32) and b.input_shape == (3, 32, 32)
    assert b.classes[1] == "automobile" and b.num_classes == 10
    # Channel layout: un-normalise test image 3 and compare with the generated values.
    spec = DATASETS.get("cifar10")
    x = b.test.tensors[0][3] * torch.tensor(spec.std)[:, None, None] + torch.tensor(spec.mean)[:, None, None]
    expected = torch.tensor([(200 + 9 + c) % 256 for c in range(3)], dtype=torch.float32) / 255
    assert torch.allclose(x.mean(dim=(1, 2)), expected, atol=1e-5)
    assert b.test.tensors[1].tolist() == [0, 1, 2, 9]


def test_cifar100_tiny(tmp_path):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    _dump(d / "train", {b"data": _cifar_images(10, 0), b"fine_labels": list(range(90, 100)),
                        b"coarse_labels": [19] * 10}, 2)
    _dump(d / "test", {b"data": _cifar_images(5, 1), b"fine_labels": [0, 1, 2, 3, 99],
                       b"coarse_labels": [0] * 5}, 2)
    _dump(d / "meta", {b"fine_label_names": [f"c{i}".encode() for i in range(100)],
                       b"coarse_label_names": [f"s{i}".encode() for i in range(20)]}, 2)
    b = load_dataset("cifar100", d, val_fraction=0.0)
    assert b.num_classes == 100 and len(b.classes) == 100 and b.classes[99] == "c99"
    assert b.train.tensors[0].shape == (10, 3, 32, 32) and b.test.tensors[0].shape == (5, 3, 32, 32)
    assert sorted(b.train.tensors[1].tolist()) == list(range(90, 100))


def test_old_numpy_spelling_accepted(tmp_path):
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
    data = pickle.dumps({"data": arr}, protocol=2)
    assert b"numpy._core.multiarray" in data or b"numpy.core.multiarray" in data
    for spelling in (b"numpy._core.multiarray", b"numpy.core.multiarray"):
        path = tmp_path / "p.pkl"
        path.write_bytes(data.replace(b"numpy._core.multiarray", spelling))
        assert np.array_equal(safe_unpickle(path)["data"], arr)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvilEval:
    def __reduce__(self):
        return (eval, ("1 + 1",))


class _Rot13:
    def __reduce__(self):
        import codecs

        return (codecs.encode, ("abc", "rot13"))


def test_malicious_pickles_refused(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    _write_cifar10(d)
    marker = tmp_path / "pwned"
    _dump(d / "data_batch_3", {b"data": _Evil(marker), b"labels": []}, 2)
    with pytest.raises(DataError) as info:
        load_dataset("cifar10", tmp_path)
    msg = str(info.value)
    assert str(d / "data_batch_3") in msg and ".system" in msg and "refused" in msg
    assert not marker.exists()

    for obj, refused in ((_EvilEval(), r"(__builtin__|builtins)\.eval"), (_Rot13(), "rot13")):
        path = tmp_path / "evil.pkl"
        _dump(path, obj, 2)
        with pytest.raises(DataError, match=refused):
            safe_unpickle(path)

    path = tmp_path / "truncated.pkl"
    path.write_bytes(pickle.dumps({b"data": np.zeros(10, np.uint8)}, protocol=2)[:-5])
    with pytest.raises(DataError, match="truncated.pkl"):
        safe_unpickle(path)


# ---------------------------------------------------------------- registry, splits, loaders


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ConfigError) as info:
        load_dataset("cifar-10")
    msg = str(info.value)
    for name in ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100"):
        assert name in msg
    assert set(DATASETS.names()) == {"digits", "mnist", "fashion-mnist", "cifar10", "cifar100"}


@pytest.mark.slow
def test_split_indices_deterministic():
    tr, va = split_indices(100, 0.2, 0)
    tr2, va2 = split_indices(100, 0.2, 0)
    assert np.array_equal(tr, tr2) and np.array_equal(va, va2)
    assert len(va) == 20 and np.array_equal(np.sort(np.concatenate([tr, va])), np.arange(100))
    assert not np.array_equal(va, split_indices(100, 0.2, 1)[1])
    code = ("from modeconn.data import split_indices; "
            "print(split_indices(100, 0.2, 0)[1].tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(va.tolist())


def test_make_loader_deterministic():
    ds = torch.utils.data.TensorDataset(torch.arange(50).float()[:, None], torch.arange(50))
    state = torch.get_rng_state()

    def order(loader):
        return [y.tolist() for _, y in loader]

    a = make_loader(ds, 8, shuffle=True, seed=3)
    b = make_loader(ds, 8, shuffle=True, seed=3)
    epochs_a, epochs_b = [order(a), order(a)], [order(b), order(b)]
    assert epochs_a == epochs_b and epochs_a[0] != epochs_a[1]
    assert order(make_loader(ds, 8, shuffle=True, seed=4)) != epochs_a[0]
    assert sorted(sum(epochs_a[0], [])) == list(range(50))
    assert order(make_loader(ds, 8)) == [list(range(i, min(i + 8, 50))) for i in range(0, 50, 8)]
    assert len(make_loader(ds, 8, drop_last=True)) == 6
    assert torch.equal(torch.get_rng_state(), state)  # global RNG untouched
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ConfigError):
            make_loader(ds, bad)
