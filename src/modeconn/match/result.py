"""The result type shared by every matching method."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from ..symmetry import SymmetrySpec

OBJECTIVE_SENSES = ("maximize", "minimize")


@dataclass
class Alignment:
    """A group element aligning model B to model A, and how it was found.

    ``element``: apply it to B (``spec.apply(sd_b, element)``) to bring B into A's basin.
    ``objective``: the method's objective at ``element`` (weight matching: ``Σ ⟨θ_A, g·θ_B⟩`` over bound
    tensors; activation matching: sum over spaces of the matched correlations; learned and dual matching: the mean
    training loss along the path over the last steps, in nats). ``objective_sense`` says which way it points:
    ``"maximize"`` (a score: weight, activation and reference matching) or ``"minimize"`` (a loss: learned, dual and
    one-sided matching). ``history``: the objective after every sweep (or step), one list per restart. ``stats``:
    method-specific numbers (iterations, LAP seconds …).
    """

    method: str
    spec: SymmetrySpec
    element: dict[str, torch.Tensor]
    objective: float
    history: list[list[float]] = field(default_factory=list)
    stats: dict[str, float | int | bool | list] = field(default_factory=dict)
    objective_sense: Literal["maximize", "minimize"] = "maximize"

    def __post_init__(self) -> None:
        if self.objective_sense not in OBJECTIVE_SENSES:
            raise ValueError(f"objective_sense must be 'maximize' or 'minimize', got {self.objective_sense!r}")

    def better(self, a: float, b: float) -> bool:
        """True if objective value ``a`` is strictly better than ``b`` in this result's sense."""
        return a > b if self.objective_sense == "maximize" else a < b

    def apply(self, state_dict) -> dict[str, torch.Tensor]:
        """``element · state_dict`` (a new dict; the input is not mutated)."""
        return self.spec.apply(state_dict, self.element)

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "objective": self.objective,
            "objective_sense": self.objective_sense,
            "history": self.history,
            "stats": self.stats,
            "element": {k: v.tolist() for k, v in self.element.items()},
        }
