"""σ-asymmetric networks: a fixed, non-learned gating nonlinearity ("FiGLU") that differs per unit.

Method (Lim et al. 2024, "The Empirical Impact of Neural Parameter Symmetries, or Lack Thereof", σ-Asymmetric
networks; docs/methods.md §1, baselines): the elementwise activation after a hidden linear layer is replaced by

    FiGLU(x) = x ⊙ sigmoid(C x),      C ∈ R^{n×n} fixed, C_ij = gate_scale · N(0, 1),

on the n features of the layer (for (N, *, n) inputs the gate acts on the last axis). C is a persistent buffer,
never trained. A permutation P of the hidden units maps FiGLU(x) to ``P x ⊙ sigmoid(C P x)``, which equals
``P FiGLU(x)`` only when ``C P = P C``; a random dense C commutes with no permutation but the identity, so the
permutation symmetry of the layer is broken by the nonlinearity while every linear layer stays standard.
With ``C = I`` FiGLU is SiLU (``x ⊙ sigmoid(x)``), which is why :class:`FiGLU` subclasses ``nn.SiLU``: the
symmetry tracer applies the elementwise activation rule (the hidden space is permutable, the gate buffer is
left unbound), and its self-check sets the gate to ``I`` (:meth:`FiGLU.symmetric_fixed_structure`) before
verifying function preservation, as it sets W-asymmetric layers to F = 0, D = 1.

C is drawn from a CPU generator seeded with :func:`~modeconn.models.asymmetric.layer_seed` ``(gate_seed, key)``
(``key``: the module's qualified name), so two processes building the same architecture with the same
``gate_seed`` share C, and the checkpoint digest / regeneration checks of :mod:`.asymmetric` cover it
(``fixed_buffers = ("fixed_gate",)``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from torch import nn

from ..errors import ConfigError
from .asymmetric import layer_seed

DEFAULT_GATE_SCALE = 1.0
"""Default scale of the gate matrix entries (the reference draws C ~ N(0, 1))."""


class SigmaAsymmetricConfig(BaseModel):
    """The ``sigma_asymmetric`` option of ``mlp``: FiGLU replaces the activation of every hidden layer.

    Fields:
        gate_scale: > 0, finite: the standard deviation of the entries of C (default 1.0).
        gate_seed: seed of the gate matrices (default 0); the trained weights follow ``build_model(seed=...)``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    gate_scale: float = Field(DEFAULT_GATE_SCALE, gt=0.0, allow_inf_nan=False)
    gate_seed: StrictInt = 0


SigmaAsymmetricOption = SigmaAsymmetricConfig | None
"""Type of the ``sigma_asymmetric`` architecture kwarg: ``None`` (the plain activation) or a config."""


def generate_gate(features: int, gate_scale: float, seed: int) -> torch.Tensor:
    """C: an fp32 CPU tensor (features, features) of ``gate_scale · N(0, 1)`` from a fresh generator seeded ``seed``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(features, features, generator=g, device="cpu") * float(gate_scale)


class FiGLU(nn.SiLU):
    """Fixed gated linear unit ``x ⊙ sigmoid(x Cᵀ)`` on the last axis: (N, *, features) → the same shape.

    Args:
        features: n, the size of the gated axis.
        gate_scale: standard deviation of C's entries (> 0).
        gate_seed, key: C comes from :func:`~modeconn.models.asymmetric.layer_seed` ``(gate_seed, key)``.

    Buffers: ``fixed_gate`` C (features, features), persistent, not trained.

    Raises:
        ConfigError: ``features`` < 1 or ``gate_scale`` ≤ 0 / non-finite.
    """

    fixed_buffers: tuple[str, ...] = ("fixed_gate",)
    fixed_gate: torch.Tensor

    def __init__(self, features: int, *, gate_scale: float = DEFAULT_GATE_SCALE, gate_seed: int = 0,
                 key: str = "") -> None:
        super().__init__()
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise ConfigError(f"FiGLU {key!r}: features must be an int ≥ 1, got {features!r}")
        if not (isinstance(gate_scale, (int, float)) and 0 < float(gate_scale) < float("inf")):
            raise ConfigError(f"FiGLU {key!r}: gate_scale must be a finite number > 0, got {gate_scale!r}")
        self.features, self.gate_scale, self.gate_seed, self.structure_key = features, float(gate_scale), gate_seed, key
        self.register_buffer("fixed_gate", torch.zeros(features, features), persistent=True)
        if not self.fixed_gate.is_meta:  # shape-only builds generate nothing
            with torch.no_grad():
                self.fixed_gate.copy_(self.regenerate_fixed_structure()[0])

    def regenerate_fixed_structure(self) -> tuple[torch.Tensor]:
        """``(C,)`` regenerated from (gate_seed, key, gate_scale) on the CPU, in the buffer's dtype."""
        gate = generate_gate(self.features, self.gate_scale, layer_seed(self.gate_seed, self.structure_key))
        return (gate.to(self.fixed_gate.dtype),)

    def symmetric_fixed_structure(self) -> dict[str, torch.Tensor]:
        """``C = I``: FiGLU is then SiLU, an elementwise activation that every permutation commutes with."""
        return {"fixed_gate": torch.eye(self.features, dtype=self.fixed_gate.dtype, device=self.fixed_gate.device)}

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input * torch.sigmoid(F.linear(input, self.fixed_gate))

    def extra_repr(self) -> str:
        return f"features={self.features}, gate_scale={self.gate_scale}, gate_seed={self.gate_seed}, key={self.structure_key!r}"


__all__ = ["DEFAULT_GATE_SCALE", "FiGLU", "SigmaAsymmetricConfig", "SigmaAsymmetricOption", "generate_gate"]
