"""Recipe ``train``: one model on a dataset, written as a checkpoint directory."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._util.outdir import check_output_target
from .outcome import Outcome


def train(out: Path, architecture: str, dataset: str, config, *, data: Path | None = None,
          model_kwargs: Mapping[str, Any] | None = None, dataset_options: Mapping[str, Any] | None = None,
          limit_train: int | None = None, overwrite: bool = False) -> Outcome:
    """Train ``architecture`` (``model_kwargs``; input shape and classes from the data) on ``dataset`` with ``config``
    (a :class:`~modeconn.train.TrainConfig`) and write ``out`` (config.json, model.safetensors, metrics.json; text
    datasets also tokenizer.json). Raises ConfigError / DataError before any training for a bad target, option,
    architecture argument or dataset."""
    from ..data import TextBundle, load_dataset, user_data_path
    from ..models import validate_model_kwargs
    from ..train import train_checkpoint

    check_output_target(out, inputs=[data] if data is not None else [], overwrite=overwrite)
    bundle = load_dataset(dataset, data, limit_train=limit_train, **dict(dataset_options or {}))
    kwargs = {"in_shape": bundle.input_shape, "num_classes": bundle.num_classes, **dict(model_kwargs or {})}
    validate_model_kwargs(architecture, kwargs)
    user = user_data_path(dataset)
    extra_config: dict[str, Any] = {"dataset": str(user.resolve()) if user is not None else dataset}
    extra_json = None
    if isinstance(bundle, TextBundle):
        extra_config["dataset_options"] = bundle.options
        extra_config["tokenizer_sha256"] = bundle.tokenizer_sha256
        extra_json = {"tokenizer.json": json.loads(bundle.tokenizer_json())}
    path = train_checkpoint(architecture, kwargs, bundle.train, config, out, val_set=bundle.val, test_set=bundle.test,
                            extra_config=extra_config, extra_json=extra_json, overwrite=overwrite)
    test = json.loads((path / "metrics.json").read_text())["test"]
    if "ppl" in test:
        line = (f"test loss {test['loss']:.4f} nats/token (perplexity {test['ppl']:.2f}), next-token acc "
                f"{100 * test['acc']:.2f}%")
    else:
        line = f"test acc {100 * test['acc']:.2f}%, test loss {test['loss']:.4f}"
    files = "config.json, model.safetensors, metrics.json" + (", tokenizer.json" if extra_json else "")
    return Outcome(path, files, (line,), "checkpoint")
