"""The user's images as a :class:`~modeconn.data.bundle.DatasetBundle`: a folder of class sub-folders.

Layout (as torchvision's ``ImageFolder`` and ``datasets``' "imagefolder"): ``DIR/<class>/<image>``, or
``DIR/train/<class>/…`` with ``DIR/test/<class>/…`` (or ``val``/``validation``) giving the held-out split; without
those a seeded ``heldout_fraction`` of the images is held out (``--seed``). ``test`` and ``val`` are both the held-out
part (one held-out set: training's per-epoch validation and the final test read the same images).

Classes must agree with the model's head (:class:`ImageHead`): as many folders as outputs, and when the head names
its classes (``id2label`` other than ``LABEL_0``…), the folder names must be those names — the label of a folder is
then the head's index of its name, not its sorted position. Otherwise labels follow the sorted folder names.

Preprocessing is the model's own where the checkpoint states one (:mod:`modeconn.data.image_preprocess`); otherwise
each image becomes a float tensor in ``[0, 1]`` at its own size (grayscale when the model takes one channel),
normalised with ``mean``/``std`` when given, and must have the model's input shape.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from .bundle import DatasetBundle, split_indices, tensor_dataset
from .user_options import UserDataOptions

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})
HELDOUT_DIRS = ("test", "val", "validation")

#: ``PIL.Image → (C, H, W) float32 tensor``; a ``description`` attribute, when set, is stated in the bundle's name.
Transform = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class ImageHead:
    """What the model's classifier head says about the classes: ``num_classes`` outputs, their names when the
    checkpoint gives real ones (else None), and ``where`` (e.g. "config.json num_labels") for error messages."""

    num_classes: int
    class_names: tuple[str, ...] | None = None
    where: str = "the model's head"


def _class_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _images(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def is_image_folder(path: Path) -> bool:
    """True for a directory whose sub-folders (or whose ``train`` sub-folder's sub-folders) hold images."""
    if not path.is_dir():
        return False
    root = path / "train" if (path / "train").is_dir() else path
    return any(_images(d) for d in _class_dirs(root))


def split_layout(path: Path) -> tuple[Path, Path | None]:
    """``(train root, held-out root or None)``: ``train`` + ``test``/``val``/``validation`` sub-folders, else the
    folder itself and no held-out root."""
    if (path / "train").is_dir():
        held = next((path / d for d in HELDOUT_DIRS if (path / d).is_dir()), None)
        if held is not None:
            return path / "train", held
    return path, None


def class_labels(root: Path, head: ImageHead) -> dict[str, int]:
    """``{folder name: label}``; DataError naming the folders and the head when they disagree."""
    names = [d.name for d in _class_dirs(root)]
    if not names:
        raise DataError(f"{root}: no class sub-folders (an image folder holds one folder of images per class)")
    if len(names) != head.num_classes:
        raise DataError(f"{root}: {len(names)} class folders ({', '.join(names)}) but {head.where} has "
                        f"{head.num_classes} classes")
    if head.class_names is None:
        return {n: i for i, n in enumerate(names)}
    if set(names) != set(head.class_names):
        raise DataError(f"{root}: class folders ({', '.join(names)}) do not match the classes of {head.where} "
                        f"({', '.join(head.class_names)})")
    return {n: head.class_names.index(n) for n in names}


def folder_head(path: Path) -> ImageHead:
    """The classes an image folder defines itself (for training a new model on it): one per class folder."""
    root, _ = split_layout(path)
    return ImageHead(len(_class_dirs(root)), None, f"the class folders of {path}")


def default_transform(channels: int | None, mean: Sequence[float] | None = None,
                      std: Sequence[float] | None = None) -> Transform:
    """PIL image → float32 ``(C, H, W)`` in ``[0, 1]`` at its own size (``channels`` 1: grayscale, 3: RGB, None: as
    stored), then ``(x − mean) / std`` per channel when given."""
    def transform(image) -> torch.Tensor:
        if channels is not None or image.mode not in ("L", "RGB"):
            image = image.convert("L" if channels == 1 else "RGB")
        x = torch.from_numpy(np.array(image, dtype=np.float32, copy=True) / 255.0)
        x = x[None] if x.ndim == 2 else x.permute(2, 0, 1)
        if mean is not None and std is not None:
            x = (x - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
        return x.contiguous()

    transform.description = "[0, 1] pixels at their own size" + (
        f", normalised with mean {tuple(mean)} / std {tuple(std)}" if mean is not None and std is not None else "")
    return transform


def _read(root: Path, labels: dict[str, int], transform: Transform,
          input_shape: tuple[int, ...] | None) -> tuple[torch.Tensor, np.ndarray]:
    from PIL import Image, UnidentifiedImageError

    xs, ys = [], []
    for name, label in labels.items():
        for file in _images(root / name):
            try:
                with Image.open(file) as image:
                    x = transform(image)
            except (UnidentifiedImageError, OSError) as err:
                raise DataError(f"{file}: not a readable image ({err})") from None
            if input_shape is not None and tuple(x.shape) != tuple(input_shape):
                raise DataError(f"{file}: gives an input of shape {tuple(x.shape)} but the model takes "
                                f"{tuple(input_shape)}")
            xs.append(x)
            ys.append(label)
    if not xs:
        raise DataError(f"{root}: the class folders hold no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return torch.stack(xs).to(torch.float32), np.asarray(ys, dtype=np.int64)


def load_image_folder(path: str | os.PathLike, head: ImageHead, *, transform: Transform | None = None,
                      input_shape: tuple[int, ...] | None = None, options: UserDataOptions | None = None,
                      limit_train: int | None = None) -> DatasetBundle:
    """The image folder at ``path`` as a DatasetBundle (module docstring).

    Args:
        head: the model's classes (count, names) the folders must match.
        transform: the model's preprocessing (PIL image → ``(C, H, W)`` tensor); None: :func:`default_transform`
            with ``input_shape``'s channel count.
        input_shape: ``(C, H, W)`` the model takes; every image must come out in that shape (None: not checked).
        options: the held-out fraction and seed (a ``train``/``test`` layout needs neither).

    Raises:
        DataError: no class folders, folders that disagree with ``head``, an unreadable image, an image of the wrong
            shape, or no images.
    """
    path, opts = Path(path), options or UserDataOptions()
    transform = transform or default_transform(input_shape[0] if input_shape else None)
    train_root, held_root = split_layout(path)
    labels = class_labels(train_root, head)
    x, y = _read(train_root, labels, transform, input_shape)
    if held_root is not None:
        xt, yt = _read(held_root, class_labels(held_root, head), transform, input_shape)
        heldout = f"the {held_root.name}/ folder"
    else:
        train_idx, test_idx = split_indices(len(y), opts.heldout_fraction, opts.seed)
        if len(test_idx) == 0:
            raise DataError(f"{path}: {len(y)} image(s), too few to hold out {opts.heldout_fraction:g} of them")
        x, xt, y, yt = x[train_idx], x[test_idx], y[train_idx], y[test_idx]
        heldout = f"{opts.heldout_fraction:g} of the images, seed {opts.seed}"
    x, y = x[:limit_train], y[:limit_train]
    ordered = sorted(labels, key=labels.get)
    held = tensor_dataset(xt, yt)
    how = getattr(transform, "description", "the given transform")
    return DatasetBundle(name=f"{path.name} (held out: {heldout}; preprocessing: {how})", train=tensor_dataset(x, y),
                         val=held, test=held, num_classes=head.num_classes,
                         input_shape=tuple(x.shape[1:]), classes=tuple(ordered), source=str(path))
