"""A checkpoint's own image preprocessing and head, read from its directory and ``config.json`` (passed in: this
layer does not know checkpoint kinds), and :func:`image_folder_for_checkpoint`, which checkpoint kinds call.

Preprocessing, first that applies:

1. a Hugging Face ``preprocessor_config.json`` in the directory: ``transformers.AutoImageProcessor`` (local files
   only, no remote code), ``pixel_values`` per image;
2. timm's ``pretrained_cfg`` in ``config.json`` (as ``timm.models.save_for_hf`` writes it):
   ``timm.data.resolve_data_config`` + ``create_transform`` (evaluation transform: resize, centre crop, normalise).
   Its ``input_size`` is the one the checkpoint states (``save_for_hf`` keeps the architecture's default, e.g.
   224 × 224, even for a model trained on 28 × 28 images): edit it in ``config.json`` to the size the model was trained
   at. The bundle's name states the preprocessing used;
3. otherwise :func:`~modeconn.data.image_folder.default_transform`: ``[0, 1]`` tensors at the images' own size.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import DataError
from .image_folder import ImageHead, Transform, default_transform, load_image_folder
from .user_options import UserDataOptions
from .bundle import DatasetBundle

_GENERIC_LABEL = re.compile(r"LABEL_\d+")


def head_from_config(config: Mapping[str, Any]) -> ImageHead | None:
    """The classifier head a ``config.json`` states: timm's ``num_classes`` (+ ``label_names``), Hugging Face's
    ``id2label`` / ``num_labels``, or modeconn's ``kwargs.num_classes``; None when it states none. Names of the
    ``LABEL_<i>`` placeholder kind are not names."""
    id2label = config.get("id2label") or {}
    names = config.get("label_names") or [id2label[k] for k in sorted(id2label, key=int)]
    names = tuple(str(n) for n in names) or None
    if names is not None and all(_GENERIC_LABEL.fullmatch(n) for n in names):
        names = None
    for key, count in (("num_classes", config.get("num_classes")), ("num_labels", config.get("num_labels")),
                       ("kwargs.num_classes", (config.get("kwargs") or {}).get("num_classes"))):
        if count is not None:
            return ImageHead(int(count), names, f"the model's head (config.json {key} = {count})")
    if names is not None:
        return ImageHead(len(names), names, "the model's head (config.json id2label)")
    return None


def hf_image_transform(directory: str | os.PathLike) -> Transform:
    """The ``AutoImageProcessor`` of ``directory`` as a PIL image → ``(C, H, W)`` transform.

    Raises:
        DataError: the processor cannot be read locally (named).
    """
    from transformers import AutoImageProcessor

    try:
        processor = AutoImageProcessor.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except Exception as err:  # transformers raises OSError / ValueError / KeyError here
        raise DataError(f"{Path(directory) / 'preprocessor_config.json'}: not readable by AutoImageProcessor: "
                        f"{type(err).__name__}: {err}") from None

    def transform(image):
        return processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"][0]

    transform.description = f"{type(processor).__name__} of preprocessor_config.json"
    return transform


def timm_image_transform(pretrained_cfg: Mapping[str, Any]) -> Transform:
    """timm's evaluation transform for ``pretrained_cfg`` (``input_size``, ``interpolation``, ``mean``, ``std``,
    ``crop_pct``, ``crop_mode``); images are converted to grayscale for one input channel, else to RGB."""
    from timm.data import create_transform, resolve_data_config

    data_config = resolve_data_config(pretrained_cfg=dict(pretrained_cfg))
    channels = int(data_config["input_size"][0])
    inner = create_transform(**data_config, is_training=False)

    def transform(image):
        return inner(image.convert("L" if channels == 1 else "RGB"))

    transform.description = (f"timm pretrained_cfg: input_size {tuple(data_config['input_size'])}, "
                             f"{data_config['interpolation']}, crop_pct {data_config['crop_pct']}")
    return transform


def checkpoint_transform(directory: str | os.PathLike | None, config: Mapping[str, Any],
                         input_shape: Sequence[int] | None, mean: Sequence[float] | None = None,
                         std: Sequence[float] | None = None) -> Transform:
    """The checkpoint's own preprocessing (module docstring), else the default with ``input_shape``'s channels and
    ``mean``/``std``."""
    if directory is not None and (Path(directory) / "preprocessor_config.json").is_file():
        return hf_image_transform(directory)
    if isinstance(config.get("pretrained_cfg"), Mapping):
        return timm_image_transform(config["pretrained_cfg"])
    return default_transform(input_shape[0] if input_shape else None, mean, std)


def image_folder_for_checkpoint(directory: str | os.PathLike | None, config: Mapping[str, Any],
                                path: str | os.PathLike, *, input_shape: Sequence[int] | None = None,
                                mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                                options: UserDataOptions | None = None, limit_train: int | None = None) -> DatasetBundle:
    """The image folder at ``path`` prepared for the checkpoint in ``directory`` with ``config`` (its config.json):
    the checkpoint's own preprocessing, the classes checked against its head.

    Args:
        input_shape: ``(C, H, W)`` the model takes, when known: every image must come out in it.
        mean, std: normalisation for the default preprocessing (e.g. of the dataset a modeconn checkpoint records).

    Raises:
        DataError: the config states no classifier head, or the folder disagrees with it (see
            :func:`~modeconn.data.image_folder.load_image_folder`).
    """
    head = head_from_config(config)
    if head is None:
        raise DataError(f"{path}: an image folder needs a classifier to check its class folders against, and the "
                        "checkpoint's config.json states no head (num_classes, num_labels or id2label)")
    transform = checkpoint_transform(directory, config, input_shape, mean, std)
    return load_image_folder(path, head, transform=transform, input_shape=tuple(input_shape) if input_shape else None,
                             options=options, limit_train=limit_train)
