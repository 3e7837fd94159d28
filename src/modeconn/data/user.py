"""The user's own data, one entry point: :func:`load_user_dataset` reads a text corpus or an image folder.

What the data is checked and prepared against — the checkpoint's tokenizer, its positions, its classifier head and
preprocessing — is passed in by the caller (the checkpoint kinds), so this layer knows no checkpoint kind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError
from .bundle import DatasetBundle
from .corpus import BUILDERS, is_text_corpus
from .image_folder import ImageHead, Transform, folder_head, is_image_folder, load_image_folder
from .image_preprocess import image_folder_for_checkpoint
from .user_options import UserDataOptions, current_user_data_options
from .user_text import load_checkpoint_tokenizer, max_positions, user_text_bundle


def check_image_options(path: Path, opts: UserDataOptions) -> None:
    """ConfigError naming the text-only options given (``--split``, ``--text-field``, ``--context-length``) for an
    image folder."""
    if opts.given():
        raise ConfigError(f"{', '.join(opts.given())} apply to text corpora; {path} is an image folder (its held-out "
                          "part is a test/ or val/ sub-folder, else a seeded share)")


def load_user_dataset(path: str | os.PathLike, *, tokenizer: Any = None, max_positions: int | None = None,
                      head: ImageHead | None = None, transform: Transform | None = None,
                      input_shape: Sequence[int] | None = None, options: UserDataOptions | None = None,
                      limit_train: int | None = None, limit_test: int | None = None) -> DatasetBundle:
    """The data at ``path``: a text corpus (needs ``tokenizer``, a ``transformers`` tokenizer) or an image folder
    (checked against the model's ``head``; None: the folder defines the classes, as for training a new model), with
    ``options`` (default: those of the innermost
    :func:`~modeconn.data.user_options.user_data_options` block).

    Raises:
        DataError: ``path`` is neither a text corpus nor an image folder, or its data is bad (see
            :func:`~modeconn.data.user_text.user_text_bundle`, :func:`~modeconn.data.image_folder.load_image_folder`).
        ConfigError: text without a tokenizer, or an option that does not apply to images.
    """
    path, opts = Path(path), options or current_user_data_options()
    if is_text_corpus(path):
        if tokenizer is None:
            raise ConfigError(f"{path} is a text corpus: it is tokenized with the model's own tokenizer, and these "
                              "models have none modeconn reads (a Hugging Face causal LM's directory has one)")
        return user_text_bundle(path, tokenizer, max_positions=max_positions, options=opts, limit_train=limit_train,
                                limit_test=limit_test)
    if is_image_folder(path):
        check_image_options(path, opts)
        return load_image_folder(path, head or folder_head(path), transform=transform,
                                 input_shape=tuple(input_shape) if input_shape else None,
                                 options=opts, limit_train=limit_train)
    raise DataError(f"{path}: neither a text corpus (files {', '.join(BUILDERS)}, or a save_to_disk directory) nor an "
                    "image folder (one sub-folder of images per class)")


def recorded_normalization(config: Mapping[str, Any]) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """``(mean, std)`` of the registered image dataset a modeconn checkpoint records having been trained on (on the
    ``[0, 1]`` scale), or ``(None, None)``."""
    from .datasets import DATASETS

    name = config.get("dataset")
    if name not in DATASETS:
        return None, None
    spec = DATASETS.get(name)
    return spec.mean, spec.std


def user_data_for_checkpoint(directory: str | os.PathLike | None, config: Mapping[str, Any], path: str | os.PathLike,
                             *, input_shape: Sequence[int] | None = None, options: UserDataOptions | None = None,
                             limit_train: int | None = None, limit_test: int | None = None) -> DatasetBundle:
    """The user's data at ``path`` prepared for the checkpoint in ``directory`` (None: no directory to read a tokenizer
    or processor from) whose ``config.json`` is ``config`` — what every checkpoint kind calls.

    Text: tokenized with the directory's own tokenizer (:func:`~modeconn.data.user_text.load_checkpoint_tokenizer`),
    blocks of at most ``max_position_embeddings`` (or ``n_positions``) tokens. Images: the checkpoint's own
    preprocessing and head (:func:`~modeconn.data.image_preprocess.image_folder_for_checkpoint`), normalised for a
    modeconn checkpoint with the statistics of the dataset it records, each image checked against ``input_shape``.

    Raises:
        DataError, ConfigError: as :func:`load_user_dataset`; DataError also for a directory without a tokenizer.
    """
    path, opts = Path(path), options or current_user_data_options()
    if is_text_corpus(path):
        if directory is None:
            raise ConfigError(f"{path} is a text corpus, tokenized with the model's own tokenizer; modeconn's own "
                              "language-model checkpoints are evaluated on the dataset they record")
        return load_user_dataset(path, tokenizer=load_checkpoint_tokenizer(directory),
                                 max_positions=max_positions(config), options=opts, limit_train=limit_train,
                                 limit_test=limit_test)
    if is_image_folder(path):
        check_image_options(path, opts)
        mean, std = recorded_normalization(config)
        return image_folder_for_checkpoint(directory, config, path, input_shape=input_shape, mean=mean, std=std,
                                           options=opts, limit_train=limit_train)
    return load_user_dataset(path, options=opts)  # the "neither text nor images" DataError
