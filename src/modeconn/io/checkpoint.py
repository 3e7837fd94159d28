"""Checkpoint directories in the Hugging Face layout, written atomically and loaded without executing code.

A checkpoint is a directory::

    config.json          {"modeconn_version", "format_version", "architecture", "kwargs",
                          "fixed_structure_digest" (only for models with W-asymmetric layers), ...extra metadata}
    model.safetensors    the state dict (parameters and buffers), metadata {"format": "pt"}
    metrics.json         optional (training history, test metrics)

Writes go to a temporary sibling (file or directory) that is renamed into place with ``os.replace`` /
``os.rename``, so a reader never sees a half-written checkpoint and a crash leaves the target untouched.
Loading only reads safetensors (or, with ``allow_pickle=True``, ``torch.load(weights_only=True)``), so an
untrusted checkpoint cannot run code (:mod:`modeconn.io.safe`). Every failure raises a :mod:`modeconn.errors` exception naming the file.

Fixed random structure (W-asymmetric layers, :mod:`modeconn.models.asymmetric`): their offsets F and
masks D are buffers in ``model.safetensors``; ``config.json`` records ``fixed_structure_digest`` (sha256 over
those buffers, :func:`modeconn.models.fixed_structure_digest`). :func:`load_checkpoint` checks twice:
the loaded buffers must hash to the recorded digest (catches an edited/corrupted weights file or a
config from another run), and they must equal the F, D that rebuilding the model from ``config.json``
(``asymmetric.mask_seed``) generates (catches a config that does not describe the weights, or a PyTorch
whose random streams differ; ``verify_fixed_structure=False`` skips only this second check and keeps the
file's buffers).

Dependency note: ``io`` imports :mod:`modeconn.models` (to rebuild architectures by name); models never
import ``io``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from .._util.atomic import atomic_path, atomic_write_bytes
from .._util.jsonio import to_json
from .._util.outdir import check_output_target, output_directory
from ..checks import check_dtype_kinds, dtype_kind, dtype_kind_mismatches  # noqa: F401  (re-exported)
from ..errors import CheckpointError, ConfigError, StateDictMismatchError
from ..models import MODELS, build_model, fixed_structure_digest, fixed_structure_keys, model_config
from .safe import (
    PICKLE_SUFFIXES,
    load_pickle_state_dict,
    _open_safetensors_header,
    check_in_checkpoint,
    load_state_dict,
    read_json_object,
)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
METRICS_NAME = "metrics.json"
FORMAT_VERSION = 1

DIGEST_KEY = "fixed_structure_digest"
"""config.json entry holding the sha256 of the fixed-structure buffers (asymmetric models only)."""

_RESERVED_KEYS = ("architecture", "kwargs", "modeconn_version", "format_version", DIGEST_KEY)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("modeconn")
    except Exception:  # pragma: no cover - not installed (source checkout on sys.path)
        return "unknown"


# --------------------------------------------------------------------------------------------- helpers


def _prepare_state_dict(state_dict: Mapping[str, Any], where: str) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors; tensors sharing storage with an earlier one are cloned.

    safetensors refuses aliased tensors (tied weights, views); on load each key gets its own copy, and
    ``load_state_dict`` into a model with tied parameters writes the same values twice.
    """
    out: dict[str, torch.Tensor] = {}
    seen_storages: set[int] = set()
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise CheckpointError(f"{where}: state dict key {key!r} is not a string")
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{where}: value for key {key!r} is a {type(value).__name__}, not a tensor")
        t = value.detach().to("cpu")
        if t.numel() > 0:
            ptr = t.untyped_storage().data_ptr()
            if ptr in seen_storages or not t.is_contiguous():
                t = t.clone(memory_format=torch.contiguous_format)
            else:
                seen_storages.add(ptr)
        out[key] = t.contiguous()
    return out


# --------------------------------------------------------------------------------------- state dicts


def save_state_dict(
    path: str | os.PathLike, state_dict: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``state_dict`` to a ``.safetensors`` file atomically (temp file in the same dir + ``os.replace``).

    Tensors are detached, moved to CPU and made contiguous; aliased tensors are stored as separate copies.
    ``metadata`` (str → str) goes into the safetensors header, with ``{"format": "pt"}`` added.

    Returns:
        The path written.

    Raises:
        CheckpointError: ``path`` is not a ``.safetensors`` file name, a value is not a tensor, or writing fails.
        ConfigError: metadata keys/values are not strings.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise CheckpointError(f"{path}: state dicts are saved as .safetensors files only")
    meta = {"format": "pt"}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ConfigError(f"safetensors metadata must map str to str; got {k!r}: {v!r}")
        meta[k] = v
    tensors = _prepare_state_dict(state_dict, str(path))
    try:
        with atomic_path(path) as tmp:
            save_file(tensors, tmp, metadata=meta)
    except Exception as err:
        if not isinstance(err, CheckpointError):
            raise CheckpointError(f"{path}: writing safetensors failed: {err}") from err
        raise
    return path


# ------------------------------------------------------------------------------------------ checkpoints


def _check_target(path: Path, overwrite: bool, inputs: Iterable[str | os.PathLike] = ()) -> None:
    check_output_target(path, inputs=inputs, overwrite=overwrite, option="checkpoint directory", error=CheckpointError)


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    *,
    config: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    extra_json: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    command: str = "save_checkpoint",
) -> Path:
    """Write a checkpoint directory for ``model`` (built by :func:`modeconn.models.build_model`).

    ``config.json`` holds ``modeconn_version``, ``format_version``, ``architecture`` and ``kwargs`` (from
    :func:`modeconn.models.model_config`) plus the entries of ``config`` (e.g. ``{"training": {...},
    "dataset": "mnist"}``); ``model.safetensors`` holds ``model.state_dict()`` (buffers included);
    ``metrics.json`` is written when ``metrics`` is given; ``extra_json`` maps further file names (e.g.
    ``"alignment.json"``) to JSON payloads written into the same directory before it is renamed into place,
    so the checkpoint appears complete or not at all. Non-finite floats in JSON become ``null``.
    For a model with W-asymmetric layers ``config.json`` also gets ``fixed_structure_digest`` (sha256 of
    the fixed offsets/masks, checked by :func:`load_checkpoint`).

    The directory is assembled in a temporary sibling and renamed into place; an existing non-empty
    target is only replaced with ``overwrite=True`` and only if modeconn wrote it (then swapped in, never partially
    rewritten); a ``path`` that is, contains or lies inside one of ``inputs`` (the checkpoints it was made from) is
    refused. ``command`` is recorded in the directory's ownership marker.

    Returns:
        The checkpoint directory.

    Raises:
        CheckpointError: target exists (non-empty, without ``overwrite``, or not written by modeconn) or is a file;
            target is, contains or lies inside an input; writing fails.
        ConfigError: ``model`` has no modeconn config; ``config`` overrides a reserved key
            (architecture, kwargs, modeconn_version, format_version) or is not JSON-serialisable.
    """
    path = Path(path)
    # Validate everything before touching the disk.
    cfg: dict[str, Any] = {"modeconn_version": _version(), "format_version": FORMAT_VERSION, **model_config(model)}
    for key, value in (config or {}).items():
        if key in _RESERVED_KEYS:
            raise ConfigError(f"save_checkpoint: config key {key!r} is reserved ({', '.join(_RESERVED_KEYS)})")
        cfg[key] = value
    if fixed_structure_keys(model):
        cfg[DIGEST_KEY] = fixed_structure_digest(model)
    return write_model_directory(path, cfg, model.state_dict(), metrics=metrics, extra_json=extra_json,
                                 overwrite=overwrite, inputs=inputs, command=command,
                                 metadata={"modeconn_format_version": str(FORMAT_VERSION)})


def write_model_directory(
    path: str | os.PathLike,
    config: Mapping[str, Any],
    state_dict: Mapping[str, torch.Tensor],
    *,
    metrics: Mapping[str, Any] | None = None,
    extra_json: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    command: str = "save_checkpoint",
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write a model directory atomically (:func:`atomic_directory`): ``config.json`` (``config``),
    ``model.safetensors`` (``state_dict``, ``metadata`` in its header), ``metrics.json`` when ``metrics`` is given and
    each ``extra_json`` file name → payload — every checkpoint kind modeconn writes (:func:`save_checkpoint`, the timm
    and torchvision kinds). JSON is serialised (non-finite floats become ``null``) before the disk is touched.

    Raises:
        CheckpointError: as :func:`atomic_directory` (target not modeconn's, inside an input …), writing fails.
        ConfigError: an ``extra_json`` name that is not a plain ``*.json`` other than config/metrics; a payload that
            is not JSON-serialisable.
    """
    path = Path(path)
    config_text = to_json(dict(config), f"{path / CONFIG_NAME}", nan="null")
    metrics_text = to_json(metrics, f"{path / METRICS_NAME}", nan="null") if metrics is not None else None
    extra_text = {}
    for name, payload in (extra_json or {}).items():
        if Path(name).name != name or name in (CONFIG_NAME, METRICS_NAME, WEIGHTS_NAME) or not name.endswith(".json"):
            raise ConfigError(f"save_checkpoint: extra_json file name {name!r} must be a plain *.json name other than "
                              f"{CONFIG_NAME} / {METRICS_NAME}")
        extra_text[name] = to_json(payload, f"{path / name}", nan="null")
    with atomic_directory(path, overwrite, inputs=inputs, command=command) as tmp:
        atomic_write_bytes(tmp / CONFIG_NAME, config_text.encode())
        save_state_dict(tmp / WEIGHTS_NAME, state_dict, metadata=metadata)
        if metrics_text is not None:
            atomic_write_bytes(tmp / METRICS_NAME, metrics_text.encode())
        for name, text in extra_text.items():
            atomic_write_bytes(tmp / name, text.encode())
    return path


@contextmanager
def atomic_directory(path: str | os.PathLike, overwrite: bool = False, what: str = "checkpoint", *,
                     inputs: Iterable[str | os.PathLike] = (), command: str = "") -> Iterator[Path]:
    """Assemble a directory atomically (:func:`modeconn._util.outdir.output_directory`): yields an empty temporary
    sibling of ``path`` to write into; when the block ends without an exception it replaces ``path`` in one atomic
    swap; on an exception it is deleted and ``path`` is left as it was.

    Raises:
        CheckpointError: ``path`` is a file; is, contains or lies inside one of ``inputs``; is a non-empty directory
            without ``overwrite``, or one modeconn did not write (checked before the block runs and again before the
            swap); an OSError while writing or renaming (``what`` names the output).
    """
    with output_directory(path, inputs=inputs, overwrite=overwrite, command=command or what,
                          option="checkpoint directory", error=CheckpointError, os_error=CheckpointError,
                          what=what) as tmp:
        yield tmp


def config_differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """The keys where two (nested) configs differ, as ``(dotted key, value in a, value in b)`` in ``a``'s key order
    then ``b``'s extra keys; a key absent on one side has the value ``"<absent>"`` there. Lists compare whole."""
    out: list[tuple[str, Any, Any]] = []
    for key in list(a) + [k for k in b if k not in a]:
        va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out += config_differences(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append((f"{prefix}{key}", va, vb))
    return out


def describe_config_mismatch(path_a: Any, cfg_a: Mapping[str, Any], path_b: Any, cfg_b: Mapping[str, Any]) -> str:
    """"``B`` differs from ``A`` in kwargs.width (32 vs 16), …" — the differing keys of two configs first (values of
    ``cfg_b`` then ``cfg_a``), for error messages about checkpoints that must match."""
    diffs = config_differences(cfg_b, cfg_a)
    listed = ", ".join(f"{k} ({vb!r} vs {va!r})" for k, vb, va in diffs)
    return f"{path_b} differs from {path_a} in {listed}" if diffs else f"{path_b} and {path_a} have the same config"


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint directory (or the path of a config.json file itself).

    Raises:
        CheckpointError: missing file, invalid JSON, not a JSON object, or missing/ill-typed
            ``architecture`` (str) / ``kwargs`` (object); a config.json symlinked out of its checkpoint directory
            (:func:`check_in_checkpoint`).
        ConfigError: ``format_version`` newer than this modeconn reads (:data:`FORMAT_VERSION`) or not an integer.
    """
    path = Path(path)
    cfg_path = path / CONFIG_NAME if path.is_dir() or path.suffix != ".json" else path
    if cfg_path.is_file():
        check_in_checkpoint(cfg_path, cfg_path.parent)
    cfg = read_json_object(cfg_path, "config file")
    check_format_version(cfg, cfg_path)
    if not isinstance(cfg.get("architecture"), str):
        raise CheckpointError(
            f"{cfg_path}: missing or non-string 'architecture'; valid architectures: {', '.join(MODELS.names())}"
        )
    if not isinstance(cfg.get("kwargs"), dict):
        raise CheckpointError(f"{cfg_path}: missing 'kwargs' object (the architecture's constructor arguments)")
    return cfg


def check_format_version(cfg: Mapping[str, Any], file: str | os.PathLike) -> None:
    """ConfigError naming ``file`` and the field unless ``cfg["format_version"]`` (when present) is an integer
    1 … :data:`FORMAT_VERSION` (a newer checkpoint format may mean something this modeconn would misread)."""
    version = cfg.get("format_version", FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigError(f"{file}: format_version must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise ConfigError(f"{file}: format_version {version} is newer than this modeconn supports "
                          f"({FORMAT_VERSION}); upgrade modeconn to read this checkpoint")


def check_state_dict_compatible(
    expected: Mapping[str, tuple[int, ...]], found: Mapping[str, tuple[int, ...]], where: str, *,
    dtypes: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None,
) -> None:
    """Compare key → shape maps, and with ``dtypes=(expected_dtypes, found_dtypes)`` (key → dtype or tensor) also
    the dtype kinds (:func:`dtype_kind`: an integer tensor where the model has a floating one is refused; floating
    precisions may differ).

    Raises:
        StateDictMismatchError: listing missing keys, unexpected keys, every shape difference
            (``key: expected (a, b) vs found (c, d)``) and every dtype-kind difference (both dtypes), naming ``where``.
    """
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = [
        f"{k}: model expects {tuple(expected[k])}, file has {tuple(found[k])}"
        for k in sorted(set(expected) & set(found))
        if tuple(expected[k]) != tuple(found[k])
    ]
    kinds = dtype_kind_mismatches(*dtypes, "model expects", "file has") if dtypes is not None else []
    if missing or unexpected or shapes or kinds:
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected)}")
        if shapes:
            parts.append("shape mismatches: " + "; ".join(shapes))
        if kinds:
            parts.append("dtype kind mismatches (the bytes would be reinterpreted, not converted): " + "; ".join(kinds))
        raise StateDictMismatchError(f"{where}: weights do not match the model: " + " | ".join(parts))


def _check_fixed_structure(
    where: Path, cfg: Mapping[str, Any], state: Mapping[str, torch.Tensor], keys: list[str]
) -> None:
    """The loaded fixed-structure buffers hash to the digest recorded in config.json.

    Raises:
        CheckpointError: naming ``where`` and both digests on a mismatch; a digest without fixed buffers in
            the model, or fixed buffers without a recorded digest.
    """
    recorded = cfg.get(DIGEST_KEY)
    if not keys:
        if recorded is not None:
            raise CheckpointError(
                f"{where}: config.json records a {DIGEST_KEY} but architecture {cfg['architecture']!r} with these "
                "kwargs has no fixed-structure (W-asymmetric) layers; config.json was edited or belongs elsewhere"
            )
        return
    if not isinstance(recorded, str):
        raise CheckpointError(
            f"{where}: the model has fixed-structure buffers ({len(keys)}, e.g. {keys[0]!r}) but config.json "
            f"records no {DIGEST_KEY}; cannot verify the fixed offsets/masks"
        )
    actual = fixed_structure_digest(state, keys)
    if actual != recorded:
        raise CheckpointError(
            f"{where}: {DIGEST_KEY} mismatch: config.json records {recorded}, the fixed buffers in the weights "
            f"file hash to {actual} (fixed offsets/masks modified, corrupted or from another run; keys: "
            f"{', '.join(keys)})"
        )


def load_checkpoint(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    *,
    allow_pickle: bool = False,
    verify_fixed_structure: bool = True,
) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model of a checkpoint directory and load its weights; returns ``(model, config)``.

    Checks run before any tensor is read: the directory and ``config.json`` exist and parse, the
    architecture is registered and its kwargs validate, ``model.safetensors`` exists and its header is
    complete, and its keys/shapes match the rebuilt model. The model is returned on ``device`` in eval mode.

    Args:
        allow_pickle: if there is no ``model.safetensors`` but a pickle weights file (``pytorch_model.bin``,
            ``model.pt`` ...), load it with ``torch.load(weights_only=True)`` (which refuses arbitrary
            objects). Default False: pickles are refused.
        verify_fixed_structure: for W-asymmetric models, also require the file's fixed offsets/masks to
            equal those regenerated from config.json's ``asymmetric.mask_seed`` (default True). The digest
            check always runs. With False a mismatch is accepted and the file's buffers are used.

    Raises:
        CheckpointError: missing directory/config/weights, invalid JSON, pickle weights (without
            ``allow_pickle``), truncated or corrupt safetensors (the file is named); for W-asymmetric
            models: ``fixed_structure_digest`` mismatch (both digests given) or missing, or fixed buffers
            that differ from those the config regenerates (keys named).
        ConfigError: unknown architecture or invalid kwargs in config.json (valid choices listed), sizes beyond
            the bounds of :func:`modeconn.models.build_model`, a ``format_version`` newer than supported (file and
            field named).
        StateDictMismatchError: missing/unexpected keys, shape differences (both shapes given) or a tensor of
            another dtype kind than the model's (e.g. int32 where the model has float32: both dtypes given).
        CheckpointError (also): config.json or a weights file that is a symlink leaving the checkpoint directory
            (:func:`check_in_checkpoint`).
        NonFiniteError: a floating parameter or buffer in the weights file holds NaN/Inf (file and tensor named),
            before the model is built.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint directory not found")
    if not path.is_dir():
        raise CheckpointError(f"{path}: a checkpoint is a directory with {CONFIG_NAME} and {WEIGHTS_NAME}")
    cfg = read_config(path)
    expected, expected_dtypes, fixed_keys = _expected_layout(path, cfg)
    weights_file, state = _read_weights(path, device, expected, expected_dtypes, allow_pickle)
    _check_fixed_structure(weights_file, cfg, state, fixed_keys)

    # seed=0: initial values are overwritten anyway; fork_rng keeps the caller's global RNG untouched
    model = build_model(cfg["architecture"], seed=0, **cfg["kwargs"]).to(device)
    if verify_fixed_structure and fixed_keys:
        _check_regenerated_buffers(path, cfg, model, state, fixed_keys)
    model.load_state_dict(state, strict=True)
    model.eval()
    return model, cfg


def _expected_layout(path: Path, cfg: dict[str, Any]) -> tuple[dict[str, tuple], dict[str, torch.dtype], list[str]]:
    """``(shapes, dtypes, fixed-structure keys)`` of the model ``cfg`` describes, built on the meta device (validates
    the architecture and kwargs without allocating memory; ConfigError naming ``config.json``)."""
    try:
        MODELS.get(cfg["architecture"])
        with torch.device("meta"):
            probe = build_model(cfg["architecture"], **cfg["kwargs"])
    except ConfigError as err:
        raise ConfigError(f"{path / CONFIG_NAME}: {err}") from None
    sd = probe.state_dict()
    return ({k: tuple(v.shape) for k, v in sd.items()}, {k: v.dtype for k, v in sd.items()},
            fixed_structure_keys(probe))


def _read_weights(path: Path, device: str | torch.device, expected: dict[str, tuple],
                  expected_dtypes: dict[str, torch.dtype], allow_pickle: bool) -> tuple[Path, dict[str, torch.Tensor]]:
    """``(weights file, state dict)`` of checkpoint directory ``path``: ``model.safetensors`` (its header checked
    against ``expected`` before any tensor is read), else a pickle weights file when ``allow_pickle``."""
    weights = path / WEIGHTS_NAME
    pickles = sorted(p for p in path.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    for file in (weights, *pickles):  # weights symlinked out of the checkpoint are refused before any read
        if file.is_file():
            check_in_checkpoint(file, path)
    if weights.is_file():
        header = _open_safetensors_header(weights)
        check_state_dict_compatible(expected, {k: s for k, (s, _) in header.items()}, str(weights),
                                    dtypes=(expected_dtypes, {k: d for k, (_, d) in header.items()}))
        return weights, load_state_dict(weights, device=device)
    if pickles and not allow_pickle:
        raise CheckpointError(
            f"{path}: no {WEIGHTS_NAME}, only pickle weights ({', '.join(p.name for p in pickles)}); pickles are "
            "not loaded because unpickling can execute arbitrary code. Convert to safetensors, or pass "
            "allow_pickle=True to load with torch.load(weights_only=True)"
        )
    if pickles:
        state = load_pickle_state_dict(pickles[0], device)
        check_state_dict_compatible(expected, {k: tuple(v.shape) for k, v in state.items()}, str(pickles[0]),
                                    dtypes=(expected_dtypes, state))
        return pickles[0], state
    raise CheckpointError(f"{path}: weights file {WEIGHTS_NAME} not found")


def load_weights_into(model: nn.Module, path: Path, *, allow_pickle: bool = True) -> Path:
    """Load the weights of directory ``path`` into ``model`` strictly; returns the weights file read.

    ``model.safetensors`` (header checked before any tensor is read), else the one pickle weights file
    (``pytorch_model.bin``, ``*.pth``, ``*.pt`` …) read by :func:`~modeconn.io.safe.load_pickle_state_dict` when
    ``allow_pickle``. Raises CheckpointError (no weights, several pickles, a pickle needing code — file named),
    StateDictMismatchError naming every missing, unexpected or mis-shaped key, NonFiniteError."""
    pickles = sorted(p.name for p in path.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if not (path / WEIGHTS_NAME).is_file() and len(pickles) > 1:
        raise CheckpointError(f"{path}: several weights files ({', '.join(pickles)}) and no {WEIGHTS_NAME}; keep one")
    sd = model.state_dict()
    file, state = _read_weights(path, "cpu", {k: tuple(v.shape) for k, v in sd.items()},
                                {k: v.dtype for k, v in sd.items()}, allow_pickle)
    model.load_state_dict(state, strict=True)
    return file


def _check_regenerated_buffers(path: Path, cfg: dict[str, Any], model: nn.Module, state: Mapping[str, torch.Tensor],
                               fixed_keys: list[str]) -> None:
    """CheckpointError when the fixed buffers of ``state`` differ from those the fresh ``model`` (its config's F, D)
    holds; compared before the state is loaded over them."""
    fresh = model.state_dict()
    differ = [k for k in fixed_keys if not torch.equal(fresh[k].cpu(), state[k].cpu())]
    if differ:
        raise CheckpointError(
            f"{path}: fixed buffers {', '.join(differ)} differ from those config.json regenerates "
            f"(asymmetric={cfg['kwargs'].get('asymmetric')!r}): the config does not describe these weights, "
            "or this PyTorch draws different random numbers; pass verify_fixed_structure=False to use the "
            "file's buffers"
        )
