"""The module tree of a Hugging Face checkpoint rebuilt from its tensor names and shapes and its config alone, for
the table families (:mod:`.prenorm`) whose spec from it is tested equal to the spec of the real model class.

A streamed checkpoint needs only its spec, and a table describes a family by tensor names: which linear layers,
norms and embeddings sit where. Building transformers' model class on the meta device for that imports its modeling
code (``torch._dynamo``, ``torch.distributed.tensor`` …: about a fifth of a GiB resident for the whole run). The
skeleton instead holds one meta-device module per module path of the checkpoint: a 2-D ``weight`` (with or without a
``bias``) is an ``nn.Linear``, a 1-D ``weight`` a norm (``nn.LayerNorm`` with a bias, an RMSNorm look-alike
without), and the facts no tensor tells come from the config: the class name (``architectures``, one of the table's
classes), the rotary width (``head_dim · partial_rotary_factor``, as an ``inv_freq`` buffer where the model keeps
it) and tied embeddings (``tie_word_embeddings``: one tensor object under both names).

The norms' kind and epsilon are the module's look, not the model's: they do not enter a permutation spec (only the
orthogonal residual group reads them, and it needs an absorbed checkpoint, which is rebuilt from its record). Where
the skeleton cannot stand in for the model — a family not in :data:`SKELETON_FAMILIES`, an orthogonal residual, a
tie the skeleton cannot place, a tensor the table does not name, a non-floating tensor — :func:`skeleton`
returns ``None`` and the caller builds the model class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ._common import join
from ...errors import SpecError, StateDictMismatchError, UnsupportedOperationError
from .builder import Groups, HFSymmetrySpec, build_spec, resolve_groups
from .prenorm import TABLES, Table, _resolve, describe
from .registry import tied_aliases

SKELETON_FAMILIES = frozenset({"gemma", "gpt_neox", "llama", "mistral", "olmo2", "phi", "phi3", "qwen2", "qwen3", "stablelm",
                               "starcoder2"})
"""Table families whose skeleton spec equals the model class's (tests/test_hf_skeleton.py builds each on a tiny
checkpoint and compares)."""


class _RMSNormLike(nn.Module):
    """A norm with a scale and no shift, as the table's walker recognises an RMSNorm (``weight`` + ``eps``)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, device="meta"), requires_grad=False)
        self.eps = eps


class _Root(nn.Module):
    """The skeleton's top module: the config, and the base model's attribute name (``base_model_prefix``)."""

    def __init__(self, config: Any, base: str) -> None:
        super().__init__()
        self.config = config
        self.base_model_prefix = base


def table_of(config: Any) -> Table | None:
    """The table of the config's family if the skeleton route covers it and the config names one of its causal-LM
    classes (the classes the equality test builds)."""
    t = TABLES.get(str(getattr(config, "model_type", "")))
    names = getattr(config, "architectures", None) or ()
    if (t is None or t.family not in SKELETON_FAMILIES or len(names) != 1 or names[0] not in t.classes
            or not names[0].endswith("ForCausalLM")):
        return None
    return t


def skeleton(config: Any, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, torch.dtype]) -> nn.Module | None:
    """The meta-device module tree of a checkpoint of ``config`` storing ``shapes`` (see the module docstring), or
    ``None`` where only the model class can tell (the caller builds it then)."""
    t = table_of(config)
    if t is None or not all(d.is_floating_point for d in dtypes.values()):
        return None
    modules: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, shape in shapes.items():
        path, _, name = key.rpartition(".")
        modules.setdefault(path, {})[name] = tuple(shape)
    base = _base(t, modules)
    if base is None:
        return None
    root = type(config.architectures[0], (_Root,), {})(config, base)
    for path, params in modules.items():
        mod = _module(params, _eps(config))
        if mod is None:
            return None
        _attach(root, path, mod)
    if _resolve(t.rotary, config):
        rot = nn.Module()
        rot.register_buffer("inv_freq", torch.empty(math.ceil(_rotary_width(config) / 2), device="meta"),
                            persistent=False)
        _attach(root, join(base, "rotary_emb"), rot)
    return root if _tie(t, root, base, config) else None


def _base(t: Table, modules: Mapping[str, Any]) -> str | None:
    """The base model's path: the one whose ``<layers>.0`` holds tensors (``""`` for a base model class)."""
    mark = f".{t.layers}.0."
    found = {f".{p}."[1:f".{p}.".find(mark) + 1].strip(".") for p in modules if mark in f".{p}."}
    return found.pop() if len(found) == 1 else None


def _eps(config: Any) -> float:
    for field in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"):
        if isinstance(getattr(config, field, None), float):
            return getattr(config, field)
    return 1e-5


def _module(params: Mapping[str, tuple[int, ...]], eps: float) -> nn.Module | None:
    """An ``nn.Linear`` (2-D weight), ``nn.LayerNorm`` (1-D weight and bias) or RMSNorm look-alike (1-D weight) on the
    meta device; ``None`` for anything else (a tensor the tables do not describe by name)."""
    weight, bias = params.get("weight"), params.get("bias")
    if weight is None or set(params) - {"weight", "bias"} or (bias is not None and bias != weight[:1]):
        return None
    if len(weight) == 2:
        return nn.Linear(weight[1], weight[0], bias=bias is not None, device="meta")
    if len(weight) == 1:
        return nn.LayerNorm(weight[0], eps, device="meta") if bias is not None else _RMSNormLike(weight[0], eps)
    return None


def _attach(root: nn.Module, path: str, mod: nn.Module) -> None:
    parent = root
    *parents, leaf = path.split(".")
    for name in parents:
        if not hasattr(parent, name) or not isinstance(getattr(parent, name), nn.Module):
            parent.add_module(name, nn.Module())
        parent = getattr(parent, name)
    if isinstance(getattr(parent, leaf, None), nn.Module):  # a container made for a child first: keep its children
        for name, child in getattr(parent, leaf).named_children():
            mod.add_module(name, child)
    parent.add_module(leaf, mod)


def _rotary_width(config: Any) -> int:
    """``head_dim · partial_rotary_factor``: the dims transformers' default RoPE initialisation gives frequencies."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None)
    factor = rope.get("partial_rotary_factor") if isinstance(rope, Mapping) else None
    factor = factor if factor is not None else getattr(config, "partial_rotary_factor", None)
    return int(head_dim * (factor if factor is not None else 1.0))


def _tie(t: Table, root: nn.Module, base: str, config: Any) -> bool:
    """Tied embeddings (``tie_word_embeddings``): the head shares the input embedding's tensor object (the model's
    tie, which the spec turns into an alias). A causal LM's head that the checkpoint does not store (as
    ``save_pretrained`` writes a tie) is added under the table's first head name, the name it is stored under. False
    where no head fits."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(text, "tie_word_embeddings", False):
        return True
    path = join(base, t.embeddings[0].path) if t.embeddings else ""
    embed = getattr(root.get_submodule(path), "weight", None) if path and _has(root, path) else None
    head = next((getattr(root, h) for h in t.heads if isinstance(getattr(root, h, None), nn.Linear)), None)
    if head is None and embed is not None and type(root).__name__.endswith("ForCausalLM"):
        head = nn.Linear(embed.shape[1], embed.shape[0], bias=False, device="meta")
        root.add_module(t.heads[0], head)
    if head is None or embed is None or tuple(head.weight.shape) != tuple(embed.shape):
        return False
    head.weight = embed
    return True


def _has(root: nn.Module, path: str) -> bool:
    try:
        root.get_submodule(path)
    except AttributeError:
        return False
    return True


def skeleton_spec(config: Any, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, torch.dtype],
                  groups: Groups = "permutation") -> HFSymmetrySpec | None:
    """The spec of a checkpoint of ``config`` (tensor ``shapes`` and ``dtypes`` as stored) from its :func:`skeleton`,
    as :func:`~modeconn.symmetry.hf.hf_symmetry_spec` gives it for the model class; ``None`` where the skeleton cannot
    stand in for the model (see the module docstring: the model class then builds the spec, and raises what is
    wrong). Raises ConfigError for ``groups`` as :func:`~modeconn.symmetry.hf.builder.resolve_groups`."""
    if resolve_groups(groups)["residual"] == "orthogonal":
        return None
    root = skeleton(config, shapes, dtypes)
    if root is None:
        return None
    sd = root.state_dict()
    try:
        st = replace(describe(table_of(config), root, ""), aliases=tied_aliases(sd))
        return build_spec(st, sd, groups)
    except (SpecError, StateDictMismatchError, UnsupportedOperationError):
        return None
