"""Reading Hugging Face checkpoint directories without building a model: is it one, its side files, its names.

The functions here read files (:func:`with_config` also rewrites a config's dtype in memory) and transformers'
save-time renaming only; building the model and its symmetry spec lives above (:mod:`modeconn.symmetry.hf`,
:func:`modeconn.stream.hf_checkpoint_spec`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    tensors instead of renaming them (:func:`checkpoint_layout` describes those)."""
    names, stacked = checkpoint_layout(model)
    if stacked:
        raise UnsupportedOperationError(
            f"{type(model).__name__}: transformers converts (fuses/splits) some tensors between the checkpoint and "
            f"the model ({sorted(stacked)[:5]}); streaming needs checkpoint tensors that map one to one "
            "to model tensors"
        )
    return names


def checkpoint_layout(model: torch.nn.Module) -> tuple[dict[str, str], dict[str, Stacking]]:
    """``(names, stacked)``: model key → stored name for the tensors ``save_pretrained`` renames (or keeps), and model
    key → its :class:`Stacking` for the tensors it splits (transformers 5's Mixture-of-Experts banks, one ``(E, R, C)``
    tensor stored as per-expert matrices, e.g. Mixtral's ``mlp.experts.gate_up_proj`` as
    ``block_sparse_moe.experts.{e}.w1`` / ``w3``). Works on a model built on the meta device: the split is found by
    converting index tensors of shape ``(E, R, 1)`` (row ``e·R + r`` holds its own index), so each stored tensor
    names the rows of the bank it holds. UnsupportedOperationError for a conversion that is neither a renaming nor
    such a split of whole rows."""
    sd = model.state_dict()
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers < 5: keys are stored as named
        return {k: k for k in sd}, {}
    saved = revert_weight_conversion(model, dict(sd))
    ids = {id(t): k for k, t in sd.items()}
    names = {ids[id(t)]: k for k, t in saved.items() if id(t) in ids}
    converted = [k for k in sd if k not in names]
    if not converted:
        return names, {}
    return names, _stacked(model, {k: tuple(sd[k].shape) for k in converted}, revert_weight_conversion)


@dataclass(frozen=True)
class Stacking:
    """A bank of shape ``shape`` ``(E, R, C)`` stored as ``parts``, in row order."""

    shape: tuple[int, ...]
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class Part:
    """One stored tensor ``key`` of shape ``shape`` holding rows ``[start, start + rows)`` of a bank ``(E, R, C)``
    flattened to ``(E·R, C)``."""

    key: str
    start: int
    rows: int
    shape: tuple[int, ...]


def _stacked(model, shapes: Mapping[str, tuple[int, ...]], revert) -> dict[str, Stacking]:
    bad = [k for k, s in shapes.items() if len(s) != 3]
    if bad:
        raise UnsupportedOperationError(f"{type(model).__name__}: transformers converts tensors {bad[:5]} between the "
                                        "checkpoint and the model in a way modeconn cannot stream (not a stacked bank)")
    bases, probes, total = {}, {}, 0  # every row of every bank a distinct value: a stored row names its bank and row
    for k, s in shapes.items():
        bases[k], probes[k] = total, torch.arange(total, total + s[0] * s[1], dtype=torch.float64).reshape(s[0], s[1], 1)
        total += s[0] * s[1]
    out: dict[str, list[Part]] = {k: [] for k in shapes}
    for stored, t in revert(model, dict(probes)).items():
        idx = t.reshape(-1).long()
        bank = next((k for k in shapes if bases[k] <= int(idx[0]) < bases[k] + shapes[k][0] * shapes[k][1]), None)
        if bank is None or t.shape[-1] != 1 or not torch.equal(idx, torch.arange(int(idx[0]), int(idx[0]) + idx.numel())):
            raise UnsupportedOperationError(f"{type(model).__name__}: transformers stores {stored!r} as a conversion "
                                            "of model tensors that is not a run of whole rows of one bank")
        out[bank].append(Part(stored, int(idx[0]) - bases[bank], idx.numel(), (*t.shape[:-1], shapes[bank][2])))
    return {k: Stacking(shapes[k], _complete(k, sorted(v, key=lambda p: p.start), shapes[k])) for k, v in out.items()}


def _complete(key: str, parts: list[Part], shape: tuple[int, ...]) -> tuple[Part, ...]:
    """``parts`` if they cover the bank's ``E·R`` rows exactly once, in order; UnsupportedOperationError otherwise."""
    at = 0
    for p in parts:
        if p.start != at:
            break
        at += p.rows
    if at != shape[0] * shape[1]:
        raise UnsupportedOperationError(f"the stored parts of {key!r} do not cover its {shape[0] * shape[1]} rows once")
    return tuple(parts)


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


REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")
"""The JSON files whose ``auto_map`` names Python code shipped with a checkpoint."""


def without_remote_code(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a :data:`REMOTE_CODE_FILES` object) without the ``auto_map`` that names an input's Python code."""
    return {k: v for k, v in config.items() if k != "auto_map"}


def code_free_side_files(path: PathLike) -> dict[str, Path | dict]:
    """:func:`side_files` of ``path`` without its Python files (``*.py``), and those of :data:`REMOTE_CODE_FILES`
    that name code (``auto_map``) given as JSON objects without it: what an output of transformers' own class carries,
    so that loading it with ``trust_remote_code=True`` cannot swap in an input's class. CheckpointError naming a
    file with ``auto_map`` that is not a JSON object."""
    out: dict[str, Path | dict] = {}
    for name, file in side_files(path).items():
        if name.lower().endswith(".py"):
            continue
        if name in REMOTE_CODE_FILES and b"auto_map" in file.read_bytes():
            out[name] = without_remote_code(read_json_object(file, "checkpoint file"))
        else:
            out[name] = file
    return out


def copy_code_free_side_files(source: PathLike | None, out: PathLike) -> None:
    """Copy ``source``'s :func:`side_files` (tokenizer, generation config …) into ``out`` where ``out`` has no file of
    that name yet, except its Python files (``*.py``), then :func:`drop_remote_code` in ``out``: a checkpoint modeconn
    builds from transformers' own classes carries no code it never ran."""
    import shutil

    for name, file in (side_files(source) if source is not None else {}).items():
        if not name.lower().endswith(".py") and not (Path(out) / name).exists():
            shutil.copyfile(file, Path(out) / name)
    drop_remote_code(out)


def drop_remote_code(directory: PathLike) -> None:
    """Remove ``auto_map`` from the :data:`REMOTE_CODE_FILES` modeconn wrote into ``directory``: the model there was
    built and checked with transformers' own class, so loading it with ``trust_remote_code=True`` must not swap in
    an input's custom class (which would get tensors of another architecture, or compute another function)."""
    for name in REMOTE_CODE_FILES:
        file = Path(directory) / name
        if not file.is_file():
            continue
        cfg = json.loads(file.read_text())
        if isinstance(cfg, dict) and "auto_map" in cfg:
            file.write_text(json.dumps(without_remote_code(cfg), indent=2, sort_keys=True) + "\n")


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
