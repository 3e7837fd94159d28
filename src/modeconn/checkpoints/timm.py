"""``timm`` — a timm model directory as ``timm.models.save_for_hf`` (and the Hugging Face Hub) stores it:
``config.json`` with ``architecture``, ``num_classes``, ``pretrained_cfg`` (and ``model_args``), weights in
``model.safetensors`` or ``pytorch_model.bin``.

Loaded the way ``timm.create_model("local-dir:DIR")`` does — timm's own reading of the config, ``pretrained=False``
(nothing downloaded) — then the weights loaded strictly by modeconn (a ``.bin`` only with
``torch.load(weights_only=True)``). Traced with an input of ``pretrained_cfg.input_size``; a dataset must match its
channels (and its height and width when ``pretrained_cfg.fixed_input_size``). Outputs keep the config as timm wrote it
(modeconn's records under ``"modeconn"``) and write ``model.safetensors``: they load with
``timm.create_model("local-dir:OUT", pretrained=True)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ConfigError
from .base import CONFIG_NAME, CheckpointKind, register_kind
from .library import example_images, require, image_shape, image_size, load_weights, save_as_source


def _detect(config: dict[str, Any]) -> bool:
    return (isinstance(config.get("architecture"), str) and isinstance(config.get("pretrained_cfg"), dict)
            and "kwargs" not in config)


def _check_config(config: dict[str, Any], file: Path) -> None:
    """ConfigError naming ``file``: an architecture timm does not have, or no input size to trace with."""
    timm = require("timm", file)

    if not timm.is_model(config["architecture"]):
        raise ConfigError(f"{file}: timm has no model {config['architecture']!r} (timm {timm.__version__})")
    _input_size(config, file)


def _input_size(config: dict[str, Any], file: Any = CONFIG_NAME) -> tuple[int, int, int]:
    return image_size(config["pretrained_cfg"].get("input_size"), f"{file}: pretrained_cfg.input_size")


def _load(path: Path) -> nn.Module:
    timm = require("timm", path)

    model = timm.create_model(f"local-dir:{path}", pretrained=False)
    return load_weights(model, path)


KIND = register_kind(CheckpointKind(
    "timm", "timm", _detect, _load, check_config=_check_config,
    example_input=lambda c: example_images(_input_size(c)),
    input_shape=lambda c: image_shape(_input_size(c), bool(c["pretrained_cfg"].get("fixed_input_size"))),
    save=save_as_source,
    architecture=lambda c: {"architecture": c["architecture"], "num_classes": c.get("num_classes"),
                            "model_args": c.get("model_args"), "input_size": c["pretrained_cfg"].get("input_size")}))
