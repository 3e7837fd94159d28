"""The one JSON writer: strict by default (NaN/Inf refused, naming the file and the entry), null on request."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from modeconn._util.jsonio import to_json, write_json
from modeconn.errors import ConfigError, NonFiniteError


def test_nan_refused_naming_file_and_entry(tmp_path):
    target = tmp_path / "r.json"
    with pytest.raises(NonFiniteError, match=r"r\.json: history\[1\]\.loss is nan"):
        write_json(target, {"history": [{"loss": 1.0}, {"loss": float("nan")}]})
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_nan_as_null_on_request_and_values_cleaned(tmp_path):
    obj = {"loss": float("inf"), "t": torch.tensor([2.5]), "a": np.arange(2), "p": tmp_path, 3: "k"}
    text = write_json(tmp_path / "r.json", obj, nan="null").read_text()
    assert json.loads(text) == {"loss": None, "t": 2.5, "a": [0, 1], "p": str(tmp_path), "3": "k"}
    assert text.endswith("}\n")


def test_unserialisable_is_a_config_error_unless_a_default_converts_it():
    with pytest.raises(ConfigError, match="cfg is not JSON-serialisable"):
        to_json({"x": object()}, "cfg")
    assert json.loads(to_json({"d": torch.float32}, "cfg", default=str)) == {"d": "torch.float32"}
