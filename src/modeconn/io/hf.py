"""Reading Hugging Face checkpoint directories without building a model: is it one, its side files, its names.

The functions here read files (:func:`with_config` also rewrites a config's dtype in memory) and transformers'
save-time renaming only; building the model and its symmetry spec lives above (:mod:`modeconn.symmetry.hf`,
:func:`modeconn.stream.hf_checkpoint_spec`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, UnsupportedOperationError
from .checkpoint import CONFIG_NAME
from .lazy import INDEX_SUFFIX
from .safe import PICKLE_SUFFIXES, check_in_checkpoint, read_json_object

PathLike = str | os.PathLike

WEIGHT_SUFFIXES = (".safetensors", ".msgpack", ".h5", ".gguf", ".onnx", *PICKLE_SUFFIXES)
"""Files never copied next to streamed weights (the weights are rewritten, other formats would be stale)."""
RECORDS = ("alignment.json", "merge.json")



def is_hf_checkpoint(path: PathLike) -> bool:
    """Whether ``path`` is a Hugging Face checkpoint directory: its ``config.json`` is a JSON object with a
    ``model_type`` and no modeconn ``architecture``. False when there is no readable config.json."""
    file = Path(path) / CONFIG_NAME
    try:
        cfg = read_json_object(file, "config file")
    except CheckpointError:
        return False
    return isinstance(cfg.get("model_type"), str) and "architecture" not in cfg


def checkpoint_tensor_names(model: torch.nn.Module) -> dict[str, str]:
    """Model state-dict key → the name ``save_pretrained`` stores the tensor under (transformers ≥ 5 renames a few,
    e.g. GPT-NeoX's ``lm_head.weight`` is stored as ``embed_out.weight``; the identity before transformers 5).
    Works on a model built on the meta device. Raises UnsupportedOperationError if saving converts (fuses/splits)
    tensors instead of renaming them."""
    sd = model.state_dict()
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers < 5: keys are stored as named
        return {k: k for k in sd}
    saved = revert_weight_conversion(model, dict(sd))
    ids = {id(t): k for k, t in sd.items()}
    names = {ids[id(t)]: k for k, t in saved.items() if id(t) in ids}
    if len(names) != len(sd) or len(saved) != len(sd):
        raise UnsupportedOperationError(
            f"{type(model).__name__}: transformers converts (fuses/splits) some tensors between the checkpoint and "
            f"the model ({sorted(set(sd) - set(names))[:5]}); streaming needs checkpoint tensors that map one to one "
            "to model tensors"
        )
    return names


def side_files(path: PathLike) -> dict[str, Path]:
    """The files of a checkpoint directory that travel with its weights (config.json, generation config, tokenizer
    files …): every top-level regular file except weights (safetensors, index, pickles, other weight formats) and
    modeconn's own alignment/merge records. CheckpointError naming the file and its target if one is a symlink
    leaving the checkpoint's tree (:func:`modeconn.io.check_in_checkpoint`; Hugging Face cache blobs are allowed)."""
    path = Path(path)
    files = {p.name: p for p in sorted(path.iterdir())
             if p.is_file() and not p.name.startswith(".") and p.suffix.lower() not in WEIGHT_SUFFIXES
             and not p.name.endswith(INDEX_SUFFIX) and p.name not in RECORDS}
    for p in files.values():
        check_in_checkpoint(p, path)
    return files


def resolve_checkpoint_path(path: PathLike) -> Path:
    """``path`` itself, or for a Hugging Face hub cache entry (``…/models--ORG--NAME`` with ``snapshots/``) its
    snapshot: the revision ``refs/main`` names, else the only one. CheckpointError naming the entry and its
    revisions when that is ambiguous or the named snapshot is missing."""
    p = Path(path)
    snaps = p / "snapshots"
    if not (p.name.startswith("models--") and snaps.is_dir()):
        return p
    revs = sorted(d.name for d in snaps.iterdir() if d.is_dir())
    ref = p / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text().strip()
        if (snaps / rev).is_dir():
            return snaps / rev
        raise CheckpointError(f"{p}: refs/main names revision {rev!r}, which is not among its snapshots {revs}")
    if len(revs) == 1:
        return snaps / revs[0]
    raise CheckpointError(f"{p}: Hugging Face cache entry with snapshots {revs} and no refs/main; pass one snapshot "
                          f"directory ({snaps}/<revision>)")


def model_names(paths: Sequence[PathLike]) -> list[str]:
    """Names of checkpoint directories for records and model cards, never machine paths: ``ORG/NAME@REVISION`` for
    a Hugging Face cache snapshot, else the directory's name (with its parent's where two names would collide)."""
    def name(p: Path, depth: int) -> str:
        return hub_id(p) or "/".join(p.resolve().parts[-depth:])

    names = [name(Path(p), 1) for p in paths]
    if len(set(names)) < len(names):
        names = [name(Path(p), 2) for p in paths]
    return names


def hub_id(path: PathLike) -> str | None:
    """``ORG/NAME@REVISION`` for a directory inside a Hugging Face hub cache snapshot
    (``…/models--ORG--NAME/snapshots/REVISION``), else None."""
    parts = Path(path).resolve().parts
    for i, part in enumerate(parts[:-2]):
        if part.startswith("models--") and parts[i + 1] == "snapshots":
            return part.removeprefix("models--").replace("--", "/") + "@" + parts[i + 2]
    return None


def with_config(src: PathLike, files: Mapping[str, Any] | None, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """``files`` plus the ``config.json`` of checkpoint directory ``src`` when ``files`` has none (so that
    ``from_pretrained`` reads the real architecture); with ``dtype``, the config's dtype field (``dtype`` /
    ``torch_dtype``) set to it. CheckpointError for an unreadable config that has to be rewritten."""
    files = dict(files or {})
    source = files.get(CONFIG_NAME, Path(src) / CONFIG_NAME)
    if CONFIG_NAME not in files and not Path(source).is_file():
        return files
    files[CONFIG_NAME] = source
    if dtype is None:
        return files
    cfg = dict(source) if isinstance(source, Mapping) else read_json_object(Path(source), "config file")
    fields = [f for f in ("dtype", "torch_dtype") if f in cfg] or ["dtype"]
    files[CONFIG_NAME] = {**cfg, **dict.fromkeys(fields, str(dtype).removeprefix("torch."))}
    return files
