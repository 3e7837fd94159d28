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
biases); use :func:`save_absorbed` / :func:`load_absorbed` (``config.json`` + ``model.safetensors``, the
module swaps replayed from ``modeconn_absorbed`` before a strict load).

Tolerance: each check computes, per output tensor (``logits``; else ``last_hidden_state``/``pooler_output``),
``max|y − y_ref| ≤ atol · max(1, max|y_ref|)`` in fp32 with ``atol = 1e-5`` by default. Folding is done in
float64; a bf16/fp16 model is absorbed in fp32 and cast back once at the end (that cast rounds).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._util.modes import eval_mode
from ..errors import AbsorptionError, ConfigError, UnsupportedOperationError
from .hf._common import ScaleFreeRMSNorm
from .hf.registry import _require_hf, adapter_for, describe, example_inputs
from .hf.structure import LinearRef, Structure

ABSORBED_KEY = "modeconn_absorbed"
ABSORBED_FORMAT = 1


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
    """Write an absorbed HF model as ``config.json`` (its HF config incl. ``modeconn_absorbed`` and
    ``architectures``) + ``model.safetensors``, assembled atomically (:func:`modeconn.io.atomic_directory`: an
    existing non-empty ``directory`` is replaced only with ``overwrite`` and only if modeconn wrote it). Returns the
    directory.

    Raises ConfigError if the model was not produced by :func:`absorb_normalization`; CheckpointError for a target
    that may not be written.
    """
    from ..io import atomic_directory, save_state_dict

    _, hf = _require_hf(model)
    if not getattr(hf.config, ABSORBED_KEY, None):
        raise ConfigError(f"{type(hf).__name__} is not an absorbed model (config has no {ABSORBED_KEY!r}); "
                          "use save_pretrained for ordinary models")
    cfg = hf.config.to_dict()
    cfg["architectures"] = [type(hf).__name__]
    with atomic_directory(directory, overwrite, "absorbed checkpoint", command="save_absorbed") as tmp:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str))
        save_state_dict(tmp / "model.safetensors", hf.state_dict(), {"modeconn": ABSORBED_KEY})
    return Path(directory)


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
    """Rebuild a model written by :func:`save_absorbed`: the HF class from ``architectures``, the module swaps
    from ``modeconn_absorbed``, then a strict load of ``model.safetensors`` (never unpickles).

    Raises CheckpointError (missing/corrupt file), ConfigError (not an absorbed checkpoint, unknown class).
    """
    import transformers

    from ..io import check_in_checkpoint, load_state_dict, read_json_object

    d = Path(directory)
    for name in ("config.json", "model.safetensors"):  # neither may be a symlink leaving the checkpoint
        if (d / name).is_file():
            check_in_checkpoint(d / name, d)
    raw = read_json_object(d / "config.json", "absorbed model config")
    note = raw.get(ABSORBED_KEY)
    if not note or note.get("format") != ABSORBED_FORMAT:
        raise ConfigError(f"{d / 'config.json'}: not an absorbed-model config (no {ABSORBED_KEY!r} of format {ABSORBED_FORMAT})")
    arch = (raw.get("architectures") or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        raise ConfigError(f"{d / 'config.json'}: unknown architecture {arch!r}")
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in raw.items() if k != "transformers_version"})
    model = cls(cfg)
    replay_absorption(model, note)
    if (d / "model.safetensors").is_file():
        sd = load_state_dict(d / "model.safetensors")
    else:  # sharded (stream_absorb of a large model): safetensors shards + index, read without unpickling
        from ..io_stream import LazyCheckpoint

        sd = {k: t.clone() for k, t in LazyCheckpoint(d).items()}
    model.load_state_dict(sd, strict=True)
    setattr(model.config, ABSORBED_KEY, note)
    return model.eval()
