"""Normalization absorption: rewrite a pre-norm transformer so its residual stream has an orthogonal symmetry.

Pre-LN blocks read the stream ``x`` through ``LN(x) = γ ⊙ (x − mean(x)) / std(x) + β``. The per-feature
``γ, β`` and the mean subtraction break every symmetry of the stream but permutations. Absorption (Ashkboos
et al. 2024, "SliceGPT"; Theus et al. 2025, "Generalized LMC for Transformers") removes them without
changing the function, in four steps; after each one the model's outputs on a fixed random input are
compared with the original's and :class:`AbsorptionError` is raised on a mismatch:

0. ``untie``: tied tensors (GPT-2 ``wte``/``lm_head``) get their own copies (the embedding is changed in
   step 1, the head in step 2, differently); ``config.tie_word_embeddings = False``.
1. ``center``: every residual writer is multiplied by ``C = I − 11ᵀ/d`` on its stream axis (embedding
   rows, position embeddings, CLS token, patch projection, attention-output and MLP-output rows and biases),
   so the stream is mean-free. LayerNorm ignores a per-token constant, so the outputs are unchanged.
   Skipped for RMSNorm models (Llama), which subtract no mean.
2. ``fold``: each norm's ``γ`` (and ``β``) is folded into the linear layers reading it:
   ``W ← W diag(γ)``, ``b ← b + W β`` (a reader without a bias gets one: GPT-NeoX/GPT-2/ViT LM heads and
   ``attention_bias=False`` projections); the norm is left with ``γ = 1, β = 0``.
3. ``rms``: each norm becomes :class:`~modeconn.symmetry.hf.ScaleFreeRMSNorm` ``x / sqrt(mean(x²) + eps)``
   (same ``eps``), equal to the affine-free LayerNorm on a mean-free stream.

Afterwards ``RMS(Qx) = Q·RMS(x)`` for every orthogonal ``Q``, so rotating every writer by ``Q`` and every
reader by ``Qᵀ`` keeps the function: the spec of the absorbed model (``hf_symmetry_spec``) can bind the
residual role to an orthogonal group.

Supported: GPT-NeoX (parallel and sequential residual), GPT-2, Llama (RMSNorm: steps 0, 2, 3 only), ViT
image classifiers — task models whose final norm feeds a head. Not supported (UnsupportedOperationError
naming the reason): BERT (post-LN: the norms' scale and shift act on the stream itself), base models whose
final norm output *is* the model output (absorbing it would change ``last_hidden_state``).

What the result is: the same Hugging Face class and config (``tie_word_embeddings=False``; the config gains
``modeconn_absorbed``: paths of the replaced norms and of linears that gained a bias), with every norm module
replaced by a parameter-free ``ScaleFreeRMSNorm`` and some linears given a bias. It does **not** round-trip
through ``save_pretrained``/``from_pretrained`` (which would rebuild affine LayerNorms and drop the new
biases); use :func:`save_absorbed` / :func:`load_absorbed` (the module swaps replayed from ``modeconn_absorbed``
before a strict load).

Absorbed checkpoints on disk (format :data:`ABSORBED_FORMAT`, written by :func:`save_absorbed`,
:func:`~modeconn.symmetry.absorb_stream.stream_absorb` and ``align --groups full``) are marked so that stock
transformers refuses them instead of loading a stock model that computes another function: ``config.json`` has
``model_type`` :data:`ABSORBED_MODEL_TYPE` (``AutoConfig`` / ``AutoModel*`` / ``pipeline`` raise; the original
model type is ``modeconn_absorbed.original_model_type``) and the weights are ``modeconn-absorbed.safetensors`` or
shards listed by ``modeconn-absorbed.safetensors.index.json`` (:data:`~modeconn.io.lazy.ABSORBED_STEM`: a model
class's own ``from_pretrained``, e.g. ``LlamaForCausalLM``, finds no weights). :func:`read_absorbed_config` is the
one reader of such a ``config.json`` (:func:`load_absorbed`, :func:`modeconn.stream.hf_checkpoint_spec`,
:func:`modeconn.checkpoints.open_checkpoint`): every field it reads is checked, a malformed one is a ConfigError
naming the file and the field, and the record must be what absorption writes for the model the config describes.

Tolerance: each check computes, per output tensor (``logits``; else ``last_hidden_state``/``pooler_output``),
``max|y − y_ref| ≤ atol · max(1, max|y_ref|)`` in fp32 with ``atol = 1e-5`` by default. Folding is done in
float64; a bf16/fp16 model is absorbed in fp32 and cast back once at the end (that cast rounds).
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._util.jsonio import write_json
from .._util.modes import eval_mode
from ..errors import AbsorptionError, ConfigError, UnsupportedOperationError
from .hf._common import ScaleFreeRMSNorm
from .hf.registry import _require_hf, adapter_for, describe, example_inputs
from .hf.structure import LinearRef, Structure

ABSORBED_KEY = "modeconn_absorbed"
"""The config field holding the absorption record (``format``, ``original_model_type``, ``norms``: module path →
``[size, eps]``, ``biased``: linears that gained a bias, ``untied``: tied tensors given their own copies, ``atol``,
optionally ``streamed``)."""
ABSORBED_FORMAT = 2
"""The absorbed-checkpoint format written and the only one read (module docstring). Format 1 kept the stock
``model_type`` and ``model.safetensors``, so stock transformers loaded it as a stock model; it is refused by name."""
ABSORBED_MODEL_TYPE = "modeconn-absorbed"
"""``model_type`` of an absorbed checkpoint's ``config.json``: a type transformers does not know."""


# ------------------------------------------------------------------------------------------ helpers
def _split(key: str) -> tuple[str, str]:
    path, _, name = key.rpartition(".")
    return path, name


def _param(root: nn.Module, key: str) -> nn.Parameter:
    path, name = _split(key)
    p = getattr(root.get_submodule(path) if path else root, name)
    if not isinstance(p, torch.Tensor):
        raise ConfigError(f"{key!r} is not a tensor of {type(root).__name__}")
    return p


def _set(root: nn.Module, key: str, value: torch.Tensor) -> None:
    p = _param(root, key)
    with torch.no_grad():
        p.copy_(value.to(p.dtype))


def _outputs(model: nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with eval_mode(model), torch.no_grad():
        out = model(**inputs)
    found = {k: out[k].float() for k in ("logits", "last_hidden_state", "pooler_output")
             if k in out and isinstance(out[k], torch.Tensor)}
    if "logits" in found:
        return {"logits": found["logits"]}
    if not found:
        raise ConfigError(f"{type(model).__name__} returned none of logits / last_hidden_state / pooler_output")
    return found


def _check(step: str, hf: nn.Module, inputs: dict, ref: dict[str, torch.Tensor], atol: float) -> float:
    got = _outputs(hf, inputs)
    worst = 0.0
    for k, r in ref.items():
        err = float((got[k] - r).abs().max())
        scale = max(1.0, float(r.abs().max()))
        worst = max(worst, err / scale)
        if not err <= atol * scale:  # also catches NaN
            raise AbsorptionError(
                f"normalization absorption step {step!r} changed {k}: max |Δ| = {err:.3g} > "
                f"atol·max(1, max|ref|) = {atol * scale:.3g}"
            )
    return worst


def _fold(root: nn.Module, reader: LinearRef, gamma: torch.Tensor | None, beta: torch.Tensor | None) -> bool:
    """Fold ``γ, β`` of the norm feeding ``reader`` into it; True if the reader gained a bias."""
    w = _param(root, reader.weight).detach().double()
    added = False
    if beta is not None:
        shift = torch.tensordot(w, beta.double(), dims=([reader.in_axis], [0]))  # (out,)
        if reader.bias is None:
            mod = root.get_submodule(reader.path)
            if not isinstance(mod, nn.Linear):
                raise UnsupportedOperationError(f"cannot add a bias to {reader.path!r} ({type(mod).__name__})")
            mod.bias = nn.Parameter(torch.zeros(mod.out_features, dtype=mod.weight.dtype, device=mod.weight.device))
            added = True
            bias_key = f"{reader.path}.bias"
        else:
            bias_key = reader.bias
        _set(root, bias_key, _param(root, bias_key).detach().double() + shift)
    if gamma is not None:
        shape = [1] * w.ndim
        shape[reader.in_axis] = -1
        _set(root, reader.weight, w * gamma.double().reshape(shape))
    return added


def _replace_module(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, new)


# ------------------------------------------------------------------------------------------ API
def absorb_normalization(
    model: nn.Module,
    *,
    atol: float = 1e-5,
    inputs: dict[str, torch.Tensor] | None = None,
) -> nn.Module:
    """A new, function-preserving model whose norms are parameter-free RMS norms on a mean-free stream.

    Args:
        model: a supported Hugging Face task model (GPT-NeoX, GPT-2, Llama causal LMs and classifiers, ViT
            image classifiers) or a module wrapping exactly one. Never modified (deep-copied).
        atol: relative tolerance of the output check after each step (see module docstring).
        inputs: keyword inputs for the checks (default: the adapter's fixed random example).
    Returns: the absorbed copy (same classes, norms replaced; see module docstring for what it becomes).
    Raises: UnsupportedOperationError (family or model without absorption, naming the reason),
        AbsorptionError (a step changed the outputs: names the step, the error and the tolerance).
    """
    prefix, hf = _require_hf(model)
    adapter = adapter_for(hf)
    if adapter.absorb is not None:
        raise UnsupportedOperationError(f"normalization absorption is not supported for {adapter.family}: {adapter.absorb}")
    st = describe(model)
    check_absorbable(st)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    new = copy.deepcopy(model).float()
    new_hf = new.get_submodule(prefix) if prefix else new
    inputs = inputs if inputs is not None else example_inputs(new_hf)
    ref = _outputs(new_hf, inputs)
    steps: list[tuple[str, Callable[[nn.Module, Structure, dict[str, Any]], None]]] = [
        ("untie", _untie), ("center", _center), ("fold", _fold_norms), ("rms", _to_rms),
    ]
    note: dict[str, Any] = {"format": ABSORBED_FORMAT, "norms": {}, "biased": [], "untied": []}
    for name, step in steps:
        step(new, st, note)
        _check(name, new_hf, inputs, ref, atol)
    cfg = new_hf.config
    cfg.tie_word_embeddings = False
    strip = (prefix + ".") if prefix else ""
    setattr(cfg, ABSORBED_KEY, {
        "format": ABSORBED_FORMAT,
        "norms": {p[len(strip):]: v for p, v in note["norms"].items()},
        "biased": [p[len(strip):] for p in note["biased"]],
        "untied": [k[len(strip):] for k in note["untied"]],
        "atol": atol,
    })
    return new.to(dtype) if dtype != torch.float32 else new


def check_absorbable(st: Structure) -> None:
    s = st.stream
    if s.post_norm:
        raise UnsupportedOperationError(f"{st.model_class} is post-norm: the norms act on the residual stream itself")
    kinds = {n.kind for n in s.norms}
    if kinds == {"rms"}:
        raise UnsupportedOperationError(f"{st.model_class} is already absorbed (every norm is a ScaleFreeRMSNorm)")
    if len(kinds - {"rms"}) > 1:
        raise UnsupportedOperationError(f"{st.model_class} mixes norm kinds {sorted(kinds)}")
    outputs = [n.path for n in s.norms if not n.readers]
    if outputs or s.is_output:
        raise UnsupportedOperationError(
            f"{st.model_class}: the output of {outputs or 'the residual stream'} is the model output (a base model "
            "without a head), so folding its norm would change the output; absorb the task model (…ForCausalLM, "
            "…ForImageClassification) instead"
        )


def _untie(root: nn.Module, st: Structure, note: dict) -> None:
    for alias in st.aliases:
        path, name = _split(alias)
        mod = root.get_submodule(path) if path else root
        old = getattr(mod, name)
        setattr(mod, name, nn.Parameter(old.detach().clone(), requires_grad=old.requires_grad))
        note["untied"].append(alias)
    hf = _require_hf(root)[1]
    if st.aliases:
        hf.config.tie_word_embeddings = False


def _center(root: nn.Module, st: Structure, note: dict) -> None:
    if all(n.kind != "layernorm" for n in st.stream.norms):
        return  # RMSNorm subtracts no mean: nothing to push into the writers
    for s in st.stream.writers:
        t = _param(root, s.key).detach().double()
        if s.offset or (s.size is not None and s.size != t.shape[s.axis]):
            raise UnsupportedOperationError(f"writer {s.key!r} covers only part of axis {s.axis}")
        _set(root, s.key, t - t.mean(dim=s.axis, keepdim=True))


def _fold_norms(root: nn.Module, st: Structure, note: dict) -> None:
    for n in st.stream.norms:
        gamma = n.offset + _param(root, n.weight).detach().double() if n.weight else None  # Gemma: scale 1 + w
        beta = _param(root, n.bias).detach() if n.bias else None
        for r in n.readers:
            if _fold(root, r, gamma, beta):
                note["biased"].append(r.path)
        if n.weight:
            _set(root, n.weight, torch.full_like(gamma, 1.0 - n.offset))  # the identity scale
        if n.bias:
            _set(root, n.bias, torch.zeros_like(beta))


def _to_rms(root: nn.Module, st: Structure, note: dict) -> None:
    for n in st.stream.norms:
        _replace_module(root, n.path, ScaleFreeRMSNorm(n.size, n.eps))
        note["norms"][n.path] = [n.size, n.eps]


# ------------------------------------------------------------------------------------------ save / load
def save_absorbed(model: nn.Module, directory: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write an absorbed HF model as an absorbed checkpoint (format :data:`ABSORBED_FORMAT`, module docstring):
    ``config.json`` (its HF config marked with ``model_type`` :data:`ABSORBED_MODEL_TYPE`, the record, the class in
    ``architectures``, ``_name_or_path`` a name, never a machine path) + ``modeconn-absorbed.safetensors``, assembled
    atomically (:func:`modeconn.io.atomic_directory`: an existing non-empty ``directory`` is replaced only with
    ``overwrite`` and only if modeconn wrote it). Returns the directory.

    Raises ConfigError if the model was not produced by :func:`absorb_normalization`; CheckpointError for a target
    that may not be written.
    """
    from ..io import atomic_directory

    _absorbed_hf(model)  # refused before the directory is touched
    with atomic_directory(directory, overwrite, "absorbed checkpoint", command="save_absorbed") as tmp:
        write_absorbed_files(model, tmp)
    return Path(directory)


def _absorbed_hf(model: nn.Module) -> tuple[nn.Module, Any]:
    """``(the Hugging Face model, its absorption note)``; ConfigError if it was not absorbed."""
    _, hf = _require_hf(model)
    note = getattr(hf.config, ABSORBED_KEY, None)
    if not note:
        raise ConfigError(f"{type(hf).__name__} is not an absorbed model (config has no {ABSORBED_KEY!r}); "
                          "use save_pretrained for ordinary models")
    return hf, note


def write_absorbed_files(model: nn.Module, directory: str | os.PathLike) -> None:
    """The files of an absorbed checkpoint (:func:`save_absorbed`) written into ``directory`` as it is — a staging
    directory the caller made and publishes atomically (e.g. a merge's output). ConfigError if the model was not
    produced by :func:`absorb_normalization`."""
    from ..io import save_state_dict
    from ..io.lazy import ABSORBED_STEM, weight_names

    hf, note = _absorbed_hf(model)
    cfg = absorbed_config_json(hf.config.to_dict(), note, type(hf).__name__, recorded_name(hf.config.name_or_path))
    write_json(Path(directory) / "config.json", cfg, sort_keys=True, default=str)
    save_state_dict(Path(directory) / weight_names(ABSORBED_STEM)[0], hf.state_dict(), {"modeconn": ABSORBED_KEY})


def absorption_record(st: Structure) -> dict[str, Any]:
    """The module swaps absorption makes on a model of structure ``st`` (before absorption): ``norms`` (path →
    ``[size, eps]``), ``biased`` (linears reading a norm with a shift ``β`` and without a bias of their own) and
    ``untied`` (tied aliases)."""
    norms = st.stream.norms
    return {"norms": {n.path: [n.size, n.eps] for n in norms},
            "biased": [r.path for n in norms if n.bias is not None for r in n.readers if r.bias is None],
            "untied": list(st.aliases)}


def absorbed_config_json(config: Mapping[str, Any], note: Mapping[str, Any], architecture: str,
                         name: str) -> dict[str, Any]:
    """The ``config.json`` object of an absorbed checkpoint (format :data:`ABSORBED_FORMAT`) from the stock config
    dict of the model (``config.to_dict()``), its absorption record ``note`` and model class name: ``model_type``
    :data:`ABSORBED_MODEL_TYPE` (the original kept in the record as ``original_model_type``), untied, and
    ``_name_or_path`` ``name`` (:func:`recorded_name`)."""
    record = {**note, "format": ABSORBED_FORMAT, "original_model_type": config["model_type"]}
    return {**config, "model_type": ABSORBED_MODEL_TYPE, "architectures": [architecture], "tie_word_embeddings": False,
            "_name_or_path": name, ABSORBED_KEY: record}


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def recorded_name(name_or_path: Any) -> str:
    """What an absorbed ``config.json`` records as ``_name_or_path``: a Hub id (``org/name``) as given, a local
    directory by its name (:func:`modeconn.io.hf.model_names`: ``ORG/NAME@REV`` for a Hub cache snapshot) — never a
    machine path."""
    from ..io.hf import model_names

    if not isinstance(name_or_path, str) or not name_or_path:
        return ""
    if _HUB_ID.fullmatch(name_or_path) and not Path(name_or_path).exists():
        return name_or_path
    return model_names([name_or_path])[0]


def is_absorbed_config(raw: Mapping[str, Any]) -> bool:
    """Whether a parsed ``config.json`` claims to be an absorbed checkpoint's (either mark: ``model_type``
    :data:`ABSORBED_MODEL_TYPE` or a ``modeconn_absorbed`` field); :func:`read_absorbed_config` checks the rest."""
    return raw.get("model_type") == ABSORBED_MODEL_TYPE or ABSORBED_KEY in raw


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _is_names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


_RECORD_FIELDS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("format", lambda v: _is_int(v, 0) and v == ABSORBED_FORMAT,
     f"unknown format version: this modeconn reads absorbed checkpoints of format {ABSORBED_FORMAT} (format 1 was "
     "loaded by stock transformers as a stock model; re-create it with this version)"),
    ("original_model_type", lambda v: isinstance(v, str) and bool(v), "the model type before absorption (a string)"),
    ("norms", lambda v: isinstance(v, dict) and bool(v), "must map each replaced norm's module path to [size, eps]"),
    ("biased", _is_names, "must be a list of module paths (linears that gained a bias)"),
    ("untied", _is_names, "must be a list of tensor names (tied tensors given their own copies)"),
    ("atol", lambda v: v is None or _is_positive(v), "must be null or the positive tolerance of the output checks"),
    ("streamed", lambda v: isinstance(v, bool), "must be true or false"),
)
_OPTIONAL_FIELDS = {"streamed": False}


def _checked_record(raw: Mapping[str, Any], file: str | os.PathLike) -> dict[str, Any]:
    """The absorption record of an absorbed ``config.json`` object, every field checked (:data:`_RECORD_FIELDS`)."""
    from .hf.config_check import invalid_field

    if raw.get("model_type") != ABSORBED_MODEL_TYPE:
        raise invalid_field(file, "model_type", raw.get("model_type"),
                            f"an absorbed checkpoint ({ABSORBED_KEY}) has model_type {ABSORBED_MODEL_TYPE!r} (format "
                            f"{ABSORBED_FORMAT}; format 1 kept the stock type: re-create it with this version)")
    note = raw.get(ABSORBED_KEY)
    if not isinstance(note, dict):
        raise invalid_field(file, ABSORBED_KEY, note, "must be the absorption record (an object)")
    for field, ok, what in _RECORD_FIELDS:
        if field not in note and field not in _OPTIONAL_FIELDS:
            raise ConfigError(f"{file}: config.{ABSORBED_KEY}.{field} is missing ({what})")
        if not ok(note.get(field, _OPTIONAL_FIELDS.get(field))):
            raise invalid_field(file, f"{ABSORBED_KEY}.{field}", note[field], what)
    for path, entry in note["norms"].items():
        if not (isinstance(entry, list) and len(entry) == 2 and _is_int(entry[0], 1) and _is_positive(entry[1])):
            raise invalid_field(file, f"{ABSORBED_KEY}.norms[{path!r}]", entry, "must be [size ≥ 1, eps > 0]")
    return note


def read_absorbed_config(raw: Mapping[str, Any], file: str | os.PathLike) -> Any:
    """The transformers config of an absorbed checkpoint from its parsed ``config.json`` ``raw``: the config class of
    ``original_model_type`` (transformers' own, :func:`~modeconn.symmetry.hf.config_check.config_class`) built from
    the other fields, with the checked record as ``config.modeconn_absorbed``. The one reader of the format (module
    docstring): :func:`load_absorbed`, :func:`modeconn.stream.hf_checkpoint_spec` and
    :func:`modeconn.checkpoints.open_checkpoint` read absorbed checkpoints through it.

    Raises:
        ConfigError: naming ``file`` and the field — no ``model_type`` :data:`ABSORBED_MODEL_TYPE`, a record that is
            not an object, a missing or ill-typed record field (``format`` other than :data:`ABSORBED_FORMAT`,
            ``original_model_type`` transformers does not implement, ``norms``, ``biased``, ``untied``, ``atol``,
            ``streamed``), ``tie_word_embeddings`` not false, ``architectures`` not a list naming one of
            transformers' classes for the model type, a size field or a value transformers refuses.
    """
    from .hf.config_check import config_class, config_value_errors, invalid_field, model_class, validate_hf_config

    note = _checked_record(raw, file)
    original = note["original_model_type"]
    cls = config_class(original, file, f"{ABSORBED_KEY}.original_model_type", raw.get("auto_map"))
    if raw.get("tie_word_embeddings") is not False:
        raise invalid_field(file, "tie_word_embeddings", raw.get("tie_word_embeddings"),
                            "an absorbed checkpoint stores every tensor untied (false)")
    if not (_is_names(raw.get("architectures")) and raw["architectures"]):
        raise invalid_field(file, "architectures", raw.get("architectures"), "must name the model class (a list of "
                                                                             "class names)")
    fields = {k: v for k, v in raw.items() if k not in ("model_type", ABSORBED_KEY, "transformers_version")}
    validate_hf_config(fields, file)
    try:
        config = cls.from_dict(fields)
    except config_value_errors() as err:
        raise ConfigError(f"{file}: transformers cannot read this config (original model_type {original!r}): "
                          f"{err}") from None
    model_class(config, file, required=True)
    setattr(config, ABSORBED_KEY, note)
    return config


def check_absorbed_weights(ckpt: Any, absorbed: bool, file: str | os.PathLike) -> None:
    """CheckpointError unless the weights' file names (``ckpt``: a :class:`~modeconn.io.lazy.LazyCheckpoint`) agree
    with ``config.json`` (``file``): an absorbed config's weights are named after
    :data:`~modeconn.io.lazy.ABSORBED_STEM` (stock transformers would load ``model.safetensors`` as a stock model),
    a stock config's are not."""
    from ..errors import CheckpointError
    from ..io.lazy import ABSORBED_STEM, weight_names

    if (ckpt.stem == ABSORBED_STEM) != absorbed:
        want = f"{weight_names(ABSORBED_STEM)[0]} (or its index)" if absorbed else "model.safetensors (or its index)"
        raise CheckpointError(f"{ckpt.path}: the weights are stored as {ckpt.stem}.safetensors but {file} describes "
                              f"{'an absorbed' if absorbed else 'a stock'} checkpoint, whose weights are {want}")


def rebuild_absorbed(config: Any, file: str | os.PathLike, device: str = "meta") -> nn.Module:
    """The model of an absorbed checkpoint's config (:func:`read_absorbed_config`) on ``device`` (``"meta"``: no
    memory): its class built, the record checked against the model's structure (it must be the one absorption writes
    for this model: ``norms`` and ``biased`` exactly), then the module swaps replayed (:func:`replay_absorption`).
    Raises ConfigError naming ``file`` and the record field that does not match; as
    :func:`~modeconn.symmetry.hf.config_check.build_model`."""
    from .hf.config_check import build_model

    note = getattr(config, ABSORBED_KEY)
    model = build_model(config, file, device)
    expected = absorption_record(describe(model))
    for field in ("norms", "biased"):
        got, want = (dict.fromkeys(x, "listed") if isinstance(x, list) else x for x in (note[field], expected[field]))
        wrong = sorted(k for k in got.keys() | want.keys() if got.get(k, "absent") != want.get(k, "absent"))
        if wrong:
            raise ConfigError(f"{file}: config.{ABSORBED_KEY}.{field} is not what absorption records for the model "
                              f"config.json describes: at {wrong[:5]} it has "
                              f"{[got.get(k, 'nothing') for k in wrong[:5]]}, absorption records "
                              f"{[want.get(k, 'nothing') for k in wrong[:5]]}")
    replay_absorption(model, note)
    return model


def replay_absorption(model: nn.Module, note: dict[str, Any]) -> None:
    """Replay the module swaps of an absorption record (``config.modeconn_absorbed``) on a freshly built ``model``:
    each norm of ``note["norms"]`` becomes a :class:`ScaleFreeRMSNorm`, each linear of ``note["biased"]`` gains a zero
    bias (on the model's device: the meta device too)."""
    for path, (size, eps) in note["norms"].items():
        _replace_module(model, path, ScaleFreeRMSNorm(size, eps))
    for path in note["biased"]:
        mod = model.get_submodule(path)
        mod.bias = nn.Parameter(torch.zeros(mod.out_features, dtype=mod.weight.dtype, device=mod.weight.device))


def load_absorbed(directory: str | os.PathLike) -> nn.Module:
    """Rebuild a model written by :func:`save_absorbed` (or :func:`~modeconn.symmetry.absorb_stream.stream_absorb`,
    ``align --groups full``): the config read by :func:`read_absorbed_config`, the model rebuilt
    (:func:`rebuild_absorbed`), then a strict load of its ``modeconn-absorbed`` safetensors weights (single file or
    shards; never unpickles).

    Raises CheckpointError (missing/corrupt/symlinked-out file, weights not named as an absorbed checkpoint's, weights
    that do not fit the model), ConfigError (not an absorbed checkpoint; a malformed config or record, naming the file
    and the field), NonFiniteError (a NaN/Inf weight).
    """
    from ..errors import CheckpointError
    from ..io import check_in_checkpoint, read_json_object
    from ..io.lazy import LazyCheckpoint

    d = Path(directory)
    file = d / "config.json"
    if file.is_file():  # not a symlink leaving the checkpoint (the weights: checked by LazyCheckpoint)
        check_in_checkpoint(file, d)
    raw = read_json_object(file, "absorbed model config")
    if not is_absorbed_config(raw):
        raise ConfigError(f"{file}: not an absorbed-model config (model_type {raw.get('model_type')!r}, no "
                          f"{ABSORBED_KEY!r})")
    config = read_absorbed_config(raw, file)
    ckpt = LazyCheckpoint(d)
    check_absorbed_weights(ckpt, True, file)
    model = rebuild_absorbed(config, file, "cpu")
    try:
        model.load_state_dict({k: t.clone() for k, t in ckpt.items()}, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"{d}: the weights do not fit the model {file} describes: {err}") from None
    return model.eval()
