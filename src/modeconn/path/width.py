"""Width fusion: merge model A (width m) and model B (width n) into one model of width k ≤ min(m, n).

Per permutation space, A's and B's units are paired by activation correlation (a partial assignment,
:func:`modeconn.match.width.width_matching`), both models keep their ``k`` paired units
(:func:`modeconn.symmetry.select.select_units`) and the two reduced models are averaged, then BatchNorm statistics
are re-estimated. This is OT fusion with a hard one-to-one transport plan (Singh & Jaggi 2020, "Model Fusion via
Optimal Transport") with ZipIt!'s activation-based partial matching (Stoica et al. 2024). Residual spaces of a ResNet
are spaces like any other: every tensor reading or writing the residual stream keeps the same units.

Only the spaces whose width differs (between A, B and the target) are reduced. Where some spaces keep one width —
a transformer's residual stream and attention heads when only the FFN width (``intermediate_size``) differs — B is
then aligned to A on the reduced models as for equal widths (weight matching over the whole group, starting from the
activation pairing) before the average.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn

from ..errors import ConfigError
from ..match.weight import weight_matching
from ..match.width import WidthAlignment, width_matching
from ..nn_utils import batch_inputs
from ..symmetry import SymmetrySpec, symmetry_spec
from ..symmetry.select import check_selectable, select_units
from .evaluate import merge

__all__ = ["changing_spaces", "first_units", "merge_widths", "reduce_pair"]


def first_units(spec: SymmetrySpec, widths: dict[str, int]) -> dict[str, torch.Tensor]:
    """The truncation baseline's selection: the first ``widths[space]`` units of every space."""
    return {s: torch.arange(k) for s, k in widths.items() if k != spec.spaces[s].size}


def changing_spaces(*specs: SymmetrySpec) -> list[str]:
    """The spaces (of the first spec, in its order) whose size is not the same in every spec."""
    return [s for s in specs[0].spaces if len({spec.spaces[s].size for spec in specs}) > 1]


def reduce_pair(model_a: nn.Module, model_b: nn.Module, target: nn.Module, loader: Iterable, *,
                max_batches: int | None = None, match: bool = True) -> tuple[dict, dict, WidthAlignment | None]:
    """A's and B's state dicts reduced to ``target``'s widths: by activation matching on ``loader`` (``match``), else
    by keeping the first units (the truncation baseline). Only spaces whose size differs between A, B and the target
    (:func:`changing_spaces`) are reduced; the others keep every unit in place. Returns ``(sd_a, sd_b, alignment or
    None)``; the alignment's selections name the reduced spaces only.

    Raises: ConfigError naming the tensor whose shape differs from ``target``'s after the reduction (a width that no
    symmetry space carries, e.g. the number of classes), or the space that cannot shrink (see
    :func:`~modeconn.symmetry.select.check_selectable`, :func:`~modeconn.match.width.partial_assignment`).
    """
    x = batch_inputs(next(iter(loader)))[:2]
    specs = [symmetry_spec(m, x) for m in (model_a, model_b, target)]
    spec_a, spec_b, spec_t = specs
    if list(spec_t.spaces) != list(spec_a.spaces):
        raise ConfigError("the target model's symmetry spaces differ from A's: not one architecture at two widths")
    reduced = changing_spaces(spec_a, spec_b, spec_t)
    check_selectable(spec_a, reduced)
    widths = {s: sp.size for s, sp in spec_t.spaces.items()}
    alignment = None
    if match:
        full = width_matching(spec_a, spec_b, model_a, model_b, loader, widths, max_batches=max_batches)
        alignment = WidthAlignment(*({s: d[s] for s in reduced} for d in (full.select_a, full.select_b,
                                                                          full.correlation)))
        sel_a, sel_b = alignment.select_a, alignment.select_b
    else:
        sel_a, sel_b = ({s: sel for s, sel in first_units(spec, widths).items() if s in reduced}
                        for spec in (spec_a, spec_b))
    sd_a = select_units(spec_a, model_a.state_dict(), sel_a)
    sd_b = select_units(spec_b, model_b.state_dict(), sel_b)
    for key, t in target.state_dict().items():
        for name, sd in (("A", sd_a), ("B", sd_b)):
            if sd[key].shape != t.shape:
                raise ConfigError(f"tensor {key!r} of model {name} has shape {tuple(sd[key].shape)} after the width "
                                  f"reduction but the target has {tuple(t.shape)}: no symmetry space carries that width, "
                                  "so it cannot change")
    if len(reduced) < len(spec_t.spaces):  # spaces of one width (residual, heads): aligned as for equal widths
        sd_b = spec_t.apply(sd_b, weight_matching(spec_t, sd_a, sd_b, init="identity").element)
    return sd_a, sd_b, alignment


def merge_widths(model_a: nn.Module, model_b: nn.Module, loader: Iterable, *, target: nn.Module | None = None,
                 bn: str = "reset", bn_loader: Iterable | None = None, max_batches: int | None = None,
                 match: bool = True) -> tuple[nn.Module, WidthAlignment | None]:
    """Fuse A (width m) and B (width n) into a model of ``target``'s width k (module docstring).

    Args:
        model_a, model_b: one traceable architecture (MLP, CNN, ResNet, …) at two widths; never modified.
        loader: batches ``x`` or ``(x, y)`` (training data) on which unit activations are correlated.
        target: an instance of the architecture at the fused width (its weights are ignored); default: the model
            with fewer parameters (k = min(m, n)).
        bn: BatchNorm policy after averaging, as in :func:`~modeconn.path.merge`: ``reset`` (default: statistics
            re-estimated) or ``repair`` (REPAIR with the reduced endpoints' channel statistics).
        bn_loader: batches to re-estimate BatchNorm statistics of the fused model (default ``loader``).
        max_batches: correlate on at most this many batches.
        match: False gives the truncation baseline (first k units of each, averaged).
    Returns: ``(fused model in eval mode, WidthAlignment or None)``; the fused model has ``target``'s architecture
        and widths (its ``modeconn_config`` too, so it saves as a checkpoint of width k).
    Raises: ConfigError (a width that cannot change, naming the space or tensor; k larger than a parent's width),
        SpecError (the models are not one architecture).
    """
    if target is None:
        target = min((model_a, model_b), key=lambda m: sum(p.numel() for p in m.parameters()))
    sd_a, sd_b, alignment = reduce_pair(model_a, model_b, target, loader, max_batches=max_batches, match=match)
    fused = copy.deepcopy(target)
    merged = merge([sd_a, sd_b], model=fused, bn=bn, bn_loader=bn_loader if bn_loader is not None else loader)
    fused.load_state_dict(merged)
    return fused.eval(), alignment
