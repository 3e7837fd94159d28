"""CIFAR-10 / CIFAR-100 in the standard python-pickle batch format, read without executing code.

Layouts (as distributed by the CIFAR authors)::

    cifar-10-batches-py/  data_batch_1 .. data_batch_5, test_batch, batches.meta
    cifar-100-python/     train, test, meta

Each batch is a pickled dict with ``data`` (uint8 array (N, 3072): 1024 red, 1024 green, 1024 blue values
of a 32×32 image in row-major order) and ``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100). Keys may be
``bytes`` (the original Python 2 pickles, read with ``encoding="bytes"``) or ``str``.

SECURITY: pickles can run arbitrary code. :func:`safe_unpickle` only lets a pickle build builtin values
(containers, str, bytes, numbers) and numpy arrays/dtypes; any other global is refused with a DataError
before it is looked up, so nothing in the file is executed.
"""

from __future__ import annotations

import codecs
import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError

CIFAR10_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
                 "test_batch", "batches.meta")
CIFAR100_FILES = ("train", "test", "meta")

_BUILTINS = frozenset({"dict", "list", "tuple", "set", "frozenset", "str", "bytes", "bytearray",
                       "int", "float", "complex", "bool"})
try:  # numpy >= 2 (importing numpy.core there only emits a DeprecationWarning)
    from numpy._core.multiarray import _reconstruct
    from numpy._core.numeric import _frombuffer
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct
    from numpy.core.numeric import _frombuffer

# The only non-builtin globals a dataset pickle may reference, under both numpy spellings. They build
# arrays and dtypes only: ``_reconstruct`` (protocols 0-4), ``_frombuffer`` (protocol 5, plain dtypes).
_NUMPY: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


def _latin1_encode(obj: str, encoding: str = "latin1") -> bytes:
    # Protocol-2 pickles written by Python 3 store bytes as _codecs.encode(text, "latin1").
    if codecs.lookup(encoding).name != "iso8859-1":
        raise pickle.UnpicklingError(f"refused _codecs.encode with encoding {encoding!r}")
    return obj.encode("latin1")


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BufferedIOBase, source: str) -> None:
        super().__init__(file, encoding="bytes")
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if module in ("builtins", "__builtin__") and name in _BUILTINS:
            return super().find_class(module, name)
        if (module, name) in _NUMPY:
            return _NUMPY[module, name]
        if (module, name) == ("_codecs", "encode"):
            return _latin1_encode
        raise DataError(
            f"{self.source}: refused to unpickle global {module}.{name}; only builtin containers, "
            "str/bytes/numbers and numpy arrays are allowed in dataset pickles (the file may be malicious)"
        )


def safe_unpickle(path: str | os.PathLike) -> Any:
    """Unpickle ``path`` allowing only builtin values and numpy arrays (``encoding="bytes"``).

    Raises:
        DataError: the file is unreadable, not a valid pickle, or references any other global (the message
            names the file and the refused ``module.name``).
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            return _RestrictedUnpickler(fh, str(path)).load()
    except DataError:
        raise
    except Exception as exc:  # UnpicklingError, EOFError, ValueError, ... from a corrupt file
        raise DataError(f"cannot unpickle {path}: {type(exc).__name__}: {exc}") from exc


def _field(d: Any, key: str, path: Path) -> Any:
    if isinstance(d, dict):
        for k in (key, key.encode()):
            if k in d:
                return d[k]
    raise DataError(f"{path}: expected a pickled dict with key {key!r}")


def _batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    d = safe_unpickle(path)
    data = _field(d, "data", path)
    labels = np.asarray(_field(d, label_key, path))
    if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        shape = getattr(data, "shape", type(data).__name__)
        raise DataError(f"{path}: 'data' must be a uint8 array of shape (N, 3072), got {shape}")
    bad_dtype = labels.size > 0 and labels.dtype.kind not in "iu"
    if labels.ndim != 1 or labels.shape[0] != data.shape[0] or bad_dtype:
        raise DataError(
            f"{path}: {label_key!r} must hold {data.shape[0]} integer labels, got shape {labels.shape} "
            f"of {labels.dtype}"
        )
    images = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32)
    return images, labels.astype(np.int64)


def _names(path: Path, key: str, count: int) -> tuple[str, ...]:
    names = _field(safe_unpickle(path), key, path)
    out = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
    if len(out) != count:
        raise DataError(f"{path}: expected {count} class names under {key!r}, got {len(out)}")
    return out


def load_cifar10_dir(directory: str | os.PathLike) -> dict[str, Any]:
    """Read a ``cifar-10-batches-py`` directory.

    Returns dict ``x_train`` uint8 (50000, 3, 32, 32), ``y_train`` int64 (50000,), ``x_test``
    (10000, 3, 32, 32), ``y_test``, ``classes`` (10 names); counts are whatever the files hold.
    Raises DataError on unsafe, corrupt or malformed files.
    """
    d = Path(directory)
    train = [_batch(d / f"data_batch_{i}", "labels") for i in range(1, 6)]
    x_test, y_test = _batch(d / "test_batch", "labels")
    return {
        "x_train": np.concatenate([x for x, _ in train]),
        "y_train": np.concatenate([y for _, y in train]),
        "x_test": x_test,
        "y_test": y_test,
        "classes": _names(d / "batches.meta", "label_names", 10),
    }


def load_cifar100_dir(directory: str | os.PathLike) -> dict[str, Any]:
    """Read a ``cifar-100-python`` directory (fine labels, 100 classes).

    Same keys as :func:`load_cifar10_dir`: 50000 train and 10000 test images for the real files.
    """
    d = Path(directory)
    x_train, y_train = _batch(d / "train", "fine_labels")
    x_test, y_test = _batch(d / "test", "fine_labels")
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test,
            "classes": _names(d / "meta", "fine_label_names", 100)}
