"""Datasets as in-memory, normalised float32 image tensors.

``load_dataset(name)`` returns a :class:`DatasetBundle` of train / val / test ``TensorDataset``\\ s
(images ``(N, C, H, W)`` float32, labels int64) for "digits" (scikit-learn's bundled 8×8 digits, the
offline default), "mnist", "fashion-mnist" (IDX files), "cifar10" and "cifar100" (python-pickle batches,
read with a restricted unpickler), and the text dataset "austen" (next-token blocks of a byte-level BPE
tokenization, :mod:`.text`). Files are found by :func:`find_data_dir` (explicit root,
``$MODECONN_DATA`` — by default ``shared/data`` beside the checkout —, system directories, the download cache).
"""

from .bundle import DatasetBundle, make_loader, split_indices
from .checksums import KNOWN_SHA256, sha256_file, verify_sha256
from .cifar import safe_unpickle
from .datasets import DATASETS, DatasetSpec, load_dataset
from .idx import read_idx, write_idx
from .locate import ENV_VAR, downloads_allowed, find_data_dir
from .synthetic import subspace_mixture
from .user import load_user_dataset, user_data_for_checkpoint
from .user_options import UserDataOptions, user_data_options
from .user_text import load_checkpoint_tokenizer
from .image_folder import ImageHead
from .resolve import user_data_path
from .text import TEXT_DATASETS, TextBundle, load_austen, load_tokenizer, text_bundle, train_tokenizer

__all__ = [
    "DATASETS",
    "DatasetBundle",
    "DatasetSpec",
    "ENV_VAR",
    "ImageHead",
    "KNOWN_SHA256",
    "TEXT_DATASETS",
    "TextBundle",
    "UserDataOptions",
    "downloads_allowed",
    "find_data_dir",
    "load_austen",
    "load_checkpoint_tokenizer",
    "load_dataset",
    "load_tokenizer",
    "load_user_dataset",
    "make_loader",
    "read_idx",
    "safe_unpickle",
    "sha256_file",
    "split_indices",
    "subspace_mixture",
    "text_bundle",
    "train_tokenizer",
    "user_data_for_checkpoint",
    "user_data_options",
    "user_data_path",
    "verify_sha256",
    "write_idx",
]
