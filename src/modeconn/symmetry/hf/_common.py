"""Helpers shared by the family adapters: walking a Hugging Face model by attribute path."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ...errors import SpecError, UnsupportedOperationError
from .structure import LinearRef, NormKind, NormRef, Slice


class ScaleFreeRMSNorm(nn.Module):
    """``x / sqrt(mean(x², -1) + eps)``, computed in fp32 and cast back: RMSNorm without a scale.

    What every normalisation layer becomes after :func:`modeconn.absorb_normalization`; it commutes with
    every orthogonal map of its input (``‖Qx‖ = ‖x‖``). No parameters, no buffers.
    """

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.size = int(size)
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.size}, eps={self.eps}"


def join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


class Walker:
    """Module lookup inside one HF model whose state-dict keys carry ``prefix`` (a wrapper's submodule path)."""

    def __init__(self, model: nn.Module, prefix: str, family: str) -> None:
        self.model, self.prefix, self.family = model, prefix, family

    def has(self, path: str) -> bool:
        try:
            m = self.model.get_submodule(path) if path else self.model
        except AttributeError:
            return False
        return m is not None

    def mod(self, path: str) -> nn.Module:
        try:
            return self.model.get_submodule(path) if path else self.model
        except AttributeError as exc:
            raise UnsupportedOperationError(
                f"{self.family} adapter: {type(self.model).__name__} has no submodule {path!r} ({exc}); "
                "the model does not have the layout this adapter knows"
            ) from None

    def first(self, *paths: str) -> str:
        """The first of ``paths`` that exists (attribute names differ between transformers versions)."""
        for p in paths:
            if self.has(p):
                return p
        raise UnsupportedOperationError(
            f"{self.family} adapter: {type(self.model).__name__} has none of the submodules {list(paths)}"
        )

    def key(self, path: str, name: str) -> str:
        return join(self.prefix, path, name)

    def linear(self, path: str) -> LinearRef:
        m = self.mod(path)
        bias = self.key(path, "bias") if getattr(m, "bias", None) is not None else None
        w = self.key(path, "weight")
        if isinstance(m, nn.Linear):
            return LinearRef(join(self.prefix, path), w, bias, 0, 1, m.out_features, m.in_features)
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            if m.groups != 1:
                raise UnsupportedOperationError(f"{self.family} adapter: grouped convolution at {path!r}")
            return LinearRef(join(self.prefix, path), w, bias, 0, 1, m.out_channels, m.in_channels)
        if type(m).__name__ == "Conv1D" and hasattr(m, "nf"):  # transformers.pytorch_utils.Conv1D: (in, out)
            return LinearRef(join(self.prefix, path), w, bias, 1, 0, m.weight.shape[1], m.weight.shape[0])
        raise UnsupportedOperationError(
            f"{self.family} adapter: {path!r} is a {type(m).__name__}, expected nn.Linear or Conv1D"
        )

    def norm(self, path: str, readers: Iterable[LinearRef] = (), offset: float = 0.0,
             kind: NormKind | None = None) -> NormRef:
        """The norm at ``path``: ``nn.LayerNorm`` (with or without affine), a parameter-free LayerNorm module
        (``normalized_shape``, no parameters: OLMo), an RMSNorm (a ``weight`` and ``variance_epsilon`` or ``eps``)
        whose scale is ``offset + weight`` (Gemma: 1; a LayerNorm's too: Nemotron's LayerNorm1P), or
        :class:`ScaleFreeRMSNorm`. ``kind`` overrides what the
        module looks like (a mean-subtracting norm with the attributes of an RMSNorm: Cohere)."""
        m = self.mod(path)
        found, eps, size = _norm_kind(m, self.family, path)
        kind = kind if kind is not None and found != "rms" else found
        weight = self.key(path, "weight") if getattr(m, "weight", None) is not None else None
        bias = self.key(path, "bias") if getattr(m, "bias", None) is not None else None
        return NormRef(join(self.prefix, path), kind, float(eps), int(size), weight, bias, tuple(readers),
                       offset if kind in ("rmsnorm", "layernorm") else 0.0)

    def param(self, path: str, name: str, axis: int) -> Slice:
        """A parameter written into a space along ``axis`` (an embedding table, a CLS token)."""
        mod = self.mod(path)
        if not isinstance(getattr(mod, name, None), torch.Tensor):
            raise UnsupportedOperationError(f"{self.family} adapter: {join(path, name)!r} is not a tensor")
        return Slice(self.key(path, name), axis)

    def buffers(self) -> tuple[str, ...]:
        """Every buffer key of the model (persistent or not; the builder keeps those in the state dict)."""
        return tuple(self.key("", n) for n, _ in self.model.named_buffers())

    def heads_reading(self, names: Iterable[str], size: int) -> list[LinearRef]:
        """Top-level Linear heads (``lm_head``, ``score``, ``classifier``, ``qa_outputs``) reading ``size`` features."""
        out = []
        for n in names:
            m = getattr(self.model, n, None)
            if isinstance(m, nn.Linear):
                if m.in_features != size:
                    raise UnsupportedOperationError(
                        f"{self.family} adapter: head {n!r} reads {m.in_features} features, the stream has {size}"
                    )
                out.append(self.linear(n))
            elif m is not None and not isinstance(m, (nn.Identity, nn.Dropout)):
                raise UnsupportedOperationError(
                    f"{self.family} adapter: head {n!r} is a {type(m).__name__}; only nn.Linear heads are supported"
                )
        return out


def _norm_kind(m: nn.Module, family: str, path: str) -> tuple[NormKind, float, int]:
    if isinstance(m, ScaleFreeRMSNorm):
        return "rms", m.eps, m.size
    if isinstance(m, nn.LayerNorm):
        if len(m.normalized_shape) != 1:
            raise UnsupportedOperationError(f"{family} adapter: LayerNorm {path!r} over several dims")
        return "layernorm", m.eps, m.normalized_shape[0]
    shape = getattr(m, "normalized_shape", None)
    if shape is not None and len(shape) == 1 and not any(True for _ in m.parameters(recurse=False)):
        return "layernorm", float(getattr(m, "eps", 1e-5)), int(shape[0])  # OlmoLayerNorm: F.layer_norm, no affine
    w = getattr(m, "weight", None)
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
    if isinstance(w, torch.Tensor) and w.ndim == 1 and isinstance(eps, (int, float)):
        return "rmsnorm", float(eps), w.shape[0]  # LlamaRMSNorm & co. (variance_epsilon), GemmaRMSNorm (eps)
    raise UnsupportedOperationError(
        f"{family} adapter: {path!r} is a {type(m).__name__}; expected LayerNorm, an RMSNorm "
        "(weight + variance_epsilon or eps), a parameter-free LayerNorm (normalized_shape) or ScaleFreeRMSNorm"
    )


def base_path(model: nn.Module) -> str:
    """The attribute path of the base model inside a task model ('' if ``model`` is the base model)."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else None
    return prefix if isinstance(base, nn.Module) and base is not model else ""


def require(cond: bool, family: str, field: str, value: object, supported: str) -> None:
    """SpecError naming the config field, its value and what is supported."""
    if not cond:
        raise SpecError(f"{family} adapter: config.{field}={value!r} is not supported (supported: {supported})")


def rotary_dims(model: nn.Module, base: str, attn: nn.Module, head_dim: int) -> int:
    """Number of leading head dims carrying RoPE: ``attn.rotary_ndims`` where the module records it, else
    ``2 · len(inv_freq)`` of the model's rotary embedding (the width of the cos/sin tables), else all."""
    if hasattr(attn, "rotary_ndims"):
        return int(attn.rotary_ndims)
    for holder in (join(base, "rotary_emb"),):
        try:
            rot = model.get_submodule(holder)
        except AttributeError:
            continue
        inv = getattr(rot, "inv_freq", None)
        if isinstance(inv, torch.Tensor):
            return min(head_dim, 2 * inv.numel())
    inv = getattr(getattr(attn, "rotary_emb", None), "inv_freq", None)
    if isinstance(inv, torch.Tensor):
        return min(head_dim, 2 * inv.numel())
    return head_dim


def token_inputs(model: nn.Module, gen: torch.Generator, batch: int = 2, length: int = 8) -> dict[str, torch.Tensor]:
    """Random token ids ``(batch, length)`` within the vocabulary (and the position table)."""
    cfg = model.config
    length = min(length, getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or length)
    return {"input_ids": torch.randint(0, cfg.vocab_size, (batch, length), generator=gen)}


def pixel_inputs(model: nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Two random images for a vision model's checks: ``pixel_values`` (2, C, H, H) at its config's (or its vision
    tower's) ``image_size``."""
    cfg = getattr(model.config, "vision_config", model.config)
    size = cfg.image_size if isinstance(cfg.image_size, int) else cfg.image_size[0]
    return {"pixel_values": torch.randn(2, cfg.num_channels, size, size, generator=gen)}
