"""``torchvision`` — a torchvision model trained in the user's own script: a directory with ``config.json`` naming the
builder and its arguments, and the weights (``model.safetensors``, or one ``.pth``/``.pt`` state dict)::

    {"torchvision_model": "resnet18",          # a name of torchvision.models.list_models()
     "kwargs": {"num_classes": 10},            # the builder's arguments (optional; no weights= / weights_backbone=)
     "input_size": [3, 32, 32],                # (channels, height, width) of the inputs: traced with it
     "fixed_input_size": false}                # optional: true when height and width must match (e.g. ViT)

Built with ``torchvision.models.get_model(name, weights=None, **kwargs)`` (nothing downloaded), the weights loaded
strictly (a ``.pth``/``.pt`` only with ``torch.load(weights_only=True)``: a pickle that needs code is refused). Outputs
keep this config (modeconn's records under ``"modeconn"``) and write ``model.safetensors``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ConfigError
from .base import CONFIG_NAME, CheckpointKind, register_kind
from .library import example_images, require, image_shape, image_size, load_weights, save_as_source

MODEL_KEY = "torchvision_model"
_DOWNLOADS = ("weights", "weights_backbone")


def _check_config(config: dict[str, Any], file: Path) -> None:
    """ConfigError naming ``file`` and the field: an unknown builder, kwargs that are no object or ask for downloaded
    weights, a missing or malformed input size."""
    torchvision = require("torchvision", file)

    name = config[MODEL_KEY]
    if not isinstance(name, str) or name not in torchvision.models.list_models():
        raise ConfigError(f"{file}: {MODEL_KEY} {name!r} is not a torchvision model (torchvision.models.list_models(), "
                          f"torchvision {torchvision.__version__})")
    kwargs = config.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{file}: kwargs must be an object of the builder's arguments, got {kwargs!r}")
    asked = [k for k in _DOWNLOADS if kwargs.get(k) is not None]
    if asked:
        raise ConfigError(f"{file}: kwargs.{asked[0]} would download pretrained weights; the weights are this "
                          "directory's: leave it out")
    _input_size(config, file)


def _input_size(config: dict[str, Any], file: Any = CONFIG_NAME) -> tuple[int, int, int]:
    return image_size(config.get("input_size"), f"{file}: input_size")


def _load(path: Path) -> nn.Module:
    from ..io import read_json_object

    torchvision = require("torchvision", path)

    config = read_json_object(path / CONFIG_NAME, "config file")
    try:
        model = torchvision.models.get_model(config[MODEL_KEY], weights=None, **config.get("kwargs", {}))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{path / CONFIG_NAME}: torchvision.models.get_model({config[MODEL_KEY]!r}, "
                          f"**kwargs) failed: {err}") from None
    return load_weights(model, path)


KIND = register_kind(CheckpointKind(
    "torchvision", "torchvision", lambda c: MODEL_KEY in c, _load, check_config=_check_config,
    example_input=lambda c: example_images(_input_size(c)),
    input_shape=lambda c: image_shape(_input_size(c), bool(c.get("fixed_input_size"))),
    save=save_as_source,
    architecture=lambda c: {MODEL_KEY: c[MODEL_KEY], "kwargs": c.get("kwargs", {}), "input_size": c["input_size"]}))
