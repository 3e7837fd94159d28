"""State dicts that keep ``_metadata``: the per-module versions that ``load_state_dict`` hands to each module's
``_load_from_state_dict`` (torchvision's MNASNet, for one, refuses a state dict without its version)."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping

import torch


def with_metadata(out: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``out`` (a new state dict) carrying a copy of ``like``'s ``_metadata`` when it has one; ``out`` itself
    otherwise. Never modifies ``like``."""
    meta = getattr(like, "_metadata", None)
    if meta is None:
        return dict(out) if not isinstance(out, dict) else out
    result: OrderedDict[str, torch.Tensor] = OrderedDict(out)
    result._metadata = copy.deepcopy(meta)  # type: ignore[attr-defined]
    return result
