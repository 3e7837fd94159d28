"""Digests recorded in files (LLPF resume state, path manifests, W-asymmetric checkpoints, dual-matching
checkpoints) pinned to their values: a refactor of the digest helpers must not change a single byte of them."""

from __future__ import annotations

import hashlib
import types

import torch
from torch.utils.data import TensorDataset

import modeconn as mc
from modeconn._util.jsonio import to_json
from modeconn.match.dual import _fingerprint
from modeconn.models import build_model, fixed_structure_digest
from modeconn._util.digest import tensors_sha256
from modeconn.path._stream import dataset_sha256
from modeconn.path.pathobj import keys_digest


def _fixed() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(3, 4, generator=g), "b": torch.arange(5, dtype=torch.int64),
            "h": torch.randn(2, 2, generator=g).to(torch.bfloat16), "m": torch.tensor([True, False, True]),
            "s": torch.tensor(2.5, dtype=torch.float64), "e": torch.zeros(0, 3),
            "t": torch.randn(4, 3, generator=g).t()}


def _mlp(seed: int, **kw):
    return build_model("mlp", in_shape=(1, 2, 2), num_classes=2, depth=1, width=3, seed=seed, **kw)


def test_state_dict_content_digest_pinned():
    sd = _fixed()
    assert tensors_sha256(sd) == "b58524a370706633c86d0ebb76bed4674cd9bd292fe6d3cb279203fb82a785db"
    assert tensors_sha256(None) == "none"


def test_dataset_digest_pinned():
    sd = _fixed()
    assert dataset_sha256(TensorDataset(sd["w"], torch.arange(3))) == \
        "12cd9b2a2bb9c7e14ef2046b5549dae8ef64ec5b260fcc844465ae213bcf91bd"
    assert dataset_sha256([(sd["w"][i], i) for i in range(3)]) == \
        "b45127ed1189757f25b5ffa42b327de0e6ebb2bbd58f71f626cdad3640d56c2d"


def test_path_keys_digest_pinned():
    keys = {k: tuple(v.shape) for k, v in _fixed().items()}
    assert keys_digest(keys) == "b86afbf81020793bca1684314a132662a9fdcf086910409e732c9cfb38420f7e"


def test_fixed_structure_digest_pinned():
    assert fixed_structure_digest(_fixed(), keys=["w", "h", "m", "t"]) == \
        "56e171da981f581f52b3fe3da448f35214dc6852adf89e812cb202c2a2423c23"
    model = build_model("mlp", in_shape=(1, 6, 6), num_classes=5, seed=0, asymmetric={"mask_seed": 1})
    assert fixed_structure_digest(model) == "35bc90a3e2d1180fcd81e1e1f2f36129ae3928acacc6200262d0d77fa943f250"


def test_dual_checkpoint_fingerprint_pinned():
    model = _mlp(0)
    spec = mc.symmetry_spec(model, torch.zeros(1, 1, 2, 2))
    opts = {"lr": 0.1, "parameterization": types.SimpleNamespace(name="cayley"), "seed": 0}
    assert _fingerprint(spec, model.state_dict(), _mlp(1).state_dict(), opts) == \
        "ba66bb479e9fd615dea2a1860e0bf3761374254bfff32dec6e010703830ca5d4"


def test_json_text_hashed_by_llpf_pinned():
    """LLPF's fingerprint is the sha256 of this JSON text (NaN written as null)."""
    parts = {"mode": "bezier", "settings": {"lr": 0.05, "steps": 3, "x": float("nan")}, "A": "ab",
             "data": {"examples": 2}}
    text = to_json(parts, "LLPF fingerprint", nan="null")
    assert hashlib.sha256(text.encode()).hexdigest() == \
        "00421f202a061c742d1472d3c74c053cc57a1a786c3e9b13d4a9455e623d8a48"
