"""Annotated types used in architecture builder signatures (validated by pydantic in ``build_model``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
InShape = tuple[PosInt, PosInt, PosInt]
"""Input shape (C, H, W) of one example, without the batch dimension."""
