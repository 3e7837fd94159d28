"""The result type shared by every matching method."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..symmetry import SymmetrySpec


@dataclass
class Alignment:
    """A group element aligning model B to model A, and how it was found.

    ``element``: apply it to B (``spec.apply(sd_b, element)``) to bring B into A's basin.
    ``objective``: the method's objective at ``element`` (weight matching: ``Σ ⟨θ_A, g·θ_B⟩`` over bound
    tensors; activation matching: sum over spaces of the matched correlations). ``history``: the objective
    after every sweep, one list per restart. ``stats``: method-specific numbers (iterations, LAP seconds …).
    """

    method: str
    spec: SymmetrySpec
    element: dict[str, torch.Tensor]
    objective: float
    history: list[list[float]] = field(default_factory=list)
    stats: dict[str, float | int | bool | list] = field(default_factory=dict)

    def apply(self, state_dict) -> dict[str, torch.Tensor]:
        """``element · state_dict`` (a new dict; the input is not mutated)."""
        return self.spec.apply(state_dict, self.element)

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "objective": self.objective,
            "history": self.history,
            "stats": self.stats,
            "element": {k: v.tolist() for k, v in self.element.items()},
        }
