"""The dataset registry and :func:`load_dataset`.

Normalisation constants (``x = (pixel / scale - mean) / std`` per channel; mean/std of the official
training set on the ``[0, 1]`` scale):

============== ===== ========================== ==========================
dataset        scale mean                       std
============== ===== ========================== ==========================
digits         16    0.3054                     0.3761
mnist          255   0.1307                     0.3081
fashion-mnist  255   0.2860                     0.3530
cifar10        255   (0.4914, 0.4822, 0.4465)   (0.2470, 0.2435, 0.2616)
cifar100       255   (0.5071, 0.4865, 0.4409)   (0.2673, 0.2564, 0.2762)
============== ===== ========================== ==========================

(digits: the 1,437 images of its train+val pool; pixel values there run 0–16.)
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Mapping

import numpy as np

from ..errors import ConfigError, DataError
from ..registry import Registry
from .bundle import DatasetBundle, normalize, split_indices, tensor_dataset
from .checksums import KNOWN_SHA256, verify_content_sha256
from .cifar import load_cifar10_dir, load_cifar100_dir
from .idx import parse_idx, read_idx_bytes
from .locate import find_data_dir, idx_file
from .resolve import user_data_path
from .text import TEXT_DATASETS, load_text_dataset
from .user import load_user_dataset

#: Seed of the fixed stratified test split of "digits" (it has no official one).
DIGITS_TEST_SEED = 0
DIGITS_TEST_FRACTION = 0.2

FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


#: ``read(root, download, verify) -> dict`` of raw arrays; see :class:`DatasetSpec`.
Reader = Callable[[Any, bool, bool], dict[str, Any]]


@dataclass(frozen=True)
class DatasetSpec:
    """How to read one dataset: shape, class count, normalisation and a raw reader.

    ``read(root, download, verify)`` returns a dict with ``x_train``/``x_test`` (N, C, H, W) arrays of raw
    pixel values, ``y_train``/``y_test`` integer labels, ``classes`` and ``source``.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, int, int]
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    read: Reader


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def _register(spec: DatasetSpec) -> None:
    DATASETS.register(spec.name)(spec)


def _read_digits(root: Any, download: bool | None, verify: bool) -> dict[str, Any]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    images, y = d.images[:, None, :, :], d.target.astype(np.int64)  # (1797, 1, 8, 8), values 0..16
    pool, test = train_test_split(np.arange(len(y)), test_size=DIGITS_TEST_FRACTION, stratify=y,
                                  random_state=DIGITS_TEST_SEED)
    pool, test = np.sort(pool), np.sort(test)
    return {"x_train": images[pool], "y_train": y[pool], "x_test": images[test], "y_test": y[test],
            "classes": tuple(str(c) for c in d.target_names), "source": "sklearn"}


def _read_idx_split(name: str, directory, images: str, labels: str, verify: bool) -> tuple[np.ndarray, ...]:
    arrays = []
    for stem, want_ndim in ((images, 3), (labels, 1)):
        path = idx_file(directory, stem)
        raw = read_idx_bytes(path)
        if verify:
            verify_content_sha256(raw, KNOWN_SHA256[name, stem], path)
        arr = parse_idx(raw, path)
        if arr.ndim != want_ndim or arr.dtype != np.uint8:
            raise DataError(
                f"{path}: expected a {want_ndim}-D uint8 IDX array, got shape {arr.shape} {arr.dtype}"
            )
        arrays.append(arr)
    x, y = arrays
    if len(x) != len(y):
        raise DataError(f"{directory}: {images} holds {len(x)} images but {labels} holds {len(y)} labels")
    return x[:, None, :, :], y.astype(np.int64)


def _idx_reader(name: str, classes: tuple[str, ...]) -> Reader:
    def read(root: Any, download: bool | None, verify: bool) -> dict[str, Any]:
        directory = find_data_dir(name, root, download=download)
        x_train, y_train = _read_idx_split(name, directory, "train-images-idx3-ubyte",
                                           "train-labels-idx1-ubyte", verify)
        x_test, y_test = _read_idx_split(name, directory, "t10k-images-idx3-ubyte",
                                         "t10k-labels-idx1-ubyte", verify)
        return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test,
                "classes": classes, "source": str(directory)}

    return read


def _cifar_reader(name: str, load: Callable[[Any], dict[str, Any]]) -> Reader:
    def read(root: Any, download: bool | None, verify: bool) -> dict[str, Any]:
        directory = find_data_dir(name, root, download=download)
        return {**load(directory), "source": str(directory)}

    return read


_DIGIT_NAMES = tuple(str(i) for i in range(10))
_register(DatasetSpec("digits", 10, (1, 8, 8), 16.0, (0.3054,), (0.3761,), _read_digits))
_register(DatasetSpec("mnist", 10, (1, 28, 28), 255.0, (0.1307,), (0.3081,),
                      _idx_reader("mnist", _DIGIT_NAMES)))
_register(DatasetSpec("fashion-mnist", 10, (1, 28, 28), 255.0, (0.2860,), (0.3530,),
                      _idx_reader("fashion-mnist", FASHION_CLASSES)))
_register(DatasetSpec("cifar10", 10, (3, 32, 32), 255.0, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616),
                      _cifar_reader("cifar10", load_cifar10_dir)))
_register(DatasetSpec("cifar100", 100, (3, 32, 32), 255.0, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
                      _cifar_reader("cifar100", load_cifar100_dir)))


def _check_limit(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(f"{name} must be None or a non-negative integer, got {value!r}")


def _check_arrays(spec: DatasetSpec, split: str, x: np.ndarray, y: np.ndarray, source: str) -> None:
    if tuple(x.shape[1:]) != spec.input_shape:
        raise DataError(
            f"{source}: {split} images have shape {tuple(x.shape[1:])}, expected {spec.input_shape}"
        )
    if y.size and (y.min() < 0 or y.max() >= spec.num_classes):
        raise DataError(
            f"{source}: {split} labels run {y.min()}..{y.max()}, expected 0..{spec.num_classes - 1}"
        )


def load_dataset(
    name: str,
    root: str | os.PathLike | None = None,
    *,
    val_fraction: float | None = None,
    split_seed: int = 0,
    limit_train: int | None = None,
    limit_test: int | None = None,
    download: bool | None = None,
    verify: bool = True,
    **options: Any,
) -> DatasetBundle:
    """Load dataset ``name`` as normalised in-memory tensors.

    Args:
        name: one of ``DATASETS.names()``: "digits" (scikit-learn, bundled), "mnist", "fashion-mnist",
            "cifar10", "cifar100"; or a text dataset of ``TEXT_DATASETS.names()`` ("austen", see
            :mod:`modeconn.data.text`), which returns a :class:`~modeconn.data.text.TextBundle`; or the path of the
            user's own data (:func:`modeconn.data.resolve.user_data_path`), read by
            :func:`~modeconn.data.user.load_user_dataset` with ``options`` (``tokenizer=``, ``head=``, …).
        root: directory with the files (the dataset directory or a parent); see
            :func:`modeconn.data.find_data_dir` for the search when omitted. Ignored by "digits".
        val_fraction: share of the official training set held out as ``val`` (seeded, ``[0, 1)``; default
            0.1). Text datasets: the share of the text in the contiguous ``val`` split (default 0.05).
        split_seed: seed of that split; the same seed gives the same split in every process. Text
            datasets ignore it (their splits are fixed and contiguous).
        limit_train, limit_test: keep only the first N examples of ``train`` / ``test`` after splitting
            (text datasets: the first N blocks).
        download: fetch MNIST / Fashion-MNIST if not found (SHA-256 verified); None (default): only inside a
            :func:`~modeconn.data.locate.downloads_allowed` block (the command line's ``--download``).
        verify: check MNIST / Fashion-MNIST / Austen files against the pinned SHA-256 of their
            decompressed content.
        **options: text datasets only, e.g. ``vocab_size=4096, context_length=128, test_fraction=0.05``.

    Returns:
        A :class:`DatasetBundle`; images float32 ``(N, C, H, W)`` normalised as in the module table,
        labels int64. Text datasets: a TextBundle of (input_ids, labels) int64 ``(N, T)`` blocks.

    Raises:
        ConfigError: unknown ``name`` (lists the valid names) or an invalid option value.
        DataError: a path-like ``name`` that does not exist; files missing (lists every place looked),
            truncated, malformed, unsafe (pickles) or failing their checksum.
    """
    user_path = user_data_path(name)
    if user_path is not None:
        return load_user_dataset(user_path, limit_train=limit_train, limit_test=limit_test, **options)
    if name in TEXT_DATASETS:
        if val_fraction is not None:
            options["val_fraction"] = val_fraction
        return load_text_dataset(name, root, limit_train=limit_train, limit_test=limit_test, verify=verify,
                                 **options)
    spec = _image_dataset(name, options)
    if val_fraction is None:
        val_fraction = 0.1
    _check_limit("limit_train", limit_train)
    _check_limit("limit_test", limit_test)
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    raw = spec.read(root, download, verify)
    source = raw["source"]
    for part in ("train", "test"):
        _check_arrays(spec, part, raw[f"x_{part}"], raw[f"y_{part}"], source)
    train_idx, val_idx = split_indices(len(raw["y_train"]), val_fraction, split_seed)

    def split(x: np.ndarray, y: np.ndarray, limit: int | None = None):
        x, y = x[:limit], y[:limit]  # truncate before converting to float32
        return tensor_dataset(normalize(x, spec.scale, spec.mean, spec.std), y)

    x_pool, y_pool = raw["x_train"], raw["y_train"]
    return DatasetBundle(
        name=spec.name,
        train=split(x_pool[train_idx], y_pool[train_idx], limit_train),
        val=split(x_pool[val_idx], y_pool[val_idx]),
        test=split(raw["x_test"], raw["y_test"], limit_test),
        num_classes=spec.num_classes,
        input_shape=spec.input_shape,
        classes=tuple(raw["classes"]),
        source=source,
    )


def _image_dataset(name: str, options: Mapping[str, Any]) -> DatasetSpec:
    """The registered image dataset ``name``; ConfigError for an unknown name (the valid ones listed, the closest
    suggested) or for options (which only text datasets take)."""
    if name not in DATASETS:
        valid = sorted(DATASETS.names() + TEXT_DATASETS.names())
        close = difflib.get_close_matches(str(name), valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown dataset {name!r}; valid datasets: {', '.join(valid)}.{hint}")
    if options:
        raise ConfigError(
            f"dataset {name!r} takes no options {', '.join(map(repr, sorted(options)))}; options such as "
            f"vocab_size are for text datasets ({', '.join(TEXT_DATASETS.names())})"
        )
    return DATASETS.get(name)
