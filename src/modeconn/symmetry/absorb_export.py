"""An absorbed model as a stock checkpoint of its own family, where the family's normalization can represent it.

After :func:`~modeconn.symmetry.absorb_normalization` every norm is a parameter-free
:class:`~modeconn.symmetry.hf.ScaleFreeRMSNorm` ``x / sqrt(mean(x²) + eps)``. An RMSNorm family (Llama, Mistral,
Qwen …: ``w ⊙ x / sqrt(mean(x²) + eps)``) computes exactly that with unit weights, so the absorbed — and then
rotated — model *is* a stock model of the family with every norm weight 1 and untied embeddings: transformers loads
it with ``from_pretrained``. A LayerNorm family (GPT-NeoX, GPT-2, ViT) subtracts the mean, which a residual rotation
no longer keeps at zero, so no stock model computes the result; it stays an absorbed checkpoint
(:func:`~modeconn.symmetry.save_absorbed` / :func:`~modeconn.symmetry.load_absorbed`).

Which case holds is decided by the outputs, not by a family list: :func:`stock_model` builds the stock model, sets
every norm weight to 1 (and a norm bias to 0), loads the absorbed weights strictly, and returns it only if its
outputs equal the absorbed model's on a random input (``max|Δ| ≤ atol · max(1, max|y|)``) — a family whose norm
weight means something else (Gemma's ``1 + w``) fails the check and stays absorbed.

Streamed (:class:`~modeconn.symmetry.absorb_stream.AbsorbedView`, no model in memory to run), the same cases are told
apart by the absorption plan instead: :func:`stock_norm_weights` gives the unit norm weights that make the absorbed
tensors a stock state dict where every stream norm is an RMSNorm without offset, else None (tested to agree with
:func:`stock_model` on models moved by a random element of the full group, family by family; a LayerNorm family
passes :func:`stock_model` before a rotation, which keeps its stream mean-free, and fails after).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .absorb import ABSORBED_KEY, _require_hf

if TYPE_CHECKING:
    from .absorb_stream import AbsorbedView


def _stock_config(hf: nn.Module) -> Any:
    cfg = hf.config.__class__.from_dict({k: v for k, v in hf.config.to_dict().items() if k != ABSORBED_KEY})
    cfg.tie_word_embeddings = False
    return cfg


def _norm_parameters(model: nn.Module, absorbed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The stock model's tensors the absorbed state dict lacks: norm weights set to 1 and norm biases to 0 (anything
    else missing makes the export impossible: returned as is, and the strict load refuses it)."""
    out = {}
    for key, t in model.state_dict().items():
        if key not in absorbed:
            out[key] = torch.ones_like(t) if key.endswith("weight") else torch.zeros_like(t)
    return out


def _same_outputs(a: nn.Module, b: nn.Module, atol: float) -> bool:
    vocab = getattr(a.config, "vocab_size", None)
    if not isinstance(vocab, int):
        return False
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ya, yb = a.eval()(input_ids=ids).logits.float(), b.eval()(input_ids=ids).logits.float()
    return bool((ya - yb).abs().max() <= atol * max(1.0, float(ya.abs().max())))


def stock_model(absorbed: nn.Module, *, atol: float = 1e-4) -> nn.Module | None:
    """The stock model of ``absorbed``'s class computing its function (module docstring), or None where the family's
    normalization cannot represent it. ``absorbed``: a model made by :func:`~modeconn.symmetry.absorb_normalization`
    (possibly transformed since, e.g. by dual matching), or a module wrapping one; never modified."""
    _, hf = _require_hf(absorbed)
    if not getattr(hf.config, ABSORBED_KEY, None):
        return None
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    try:
        with torch.random.fork_rng(devices=[]):
            stock = type(hf)(_stock_config(hf)).float()
        stock.load_state_dict(sd | _norm_parameters(stock, sd), strict=True)
    except (RuntimeError, ValueError, TypeError, KeyError):  # extra biases the stock class has no place for
        return None
    return stock.eval() if _same_outputs(hf, stock, atol) else None


def stock_norm_weights(view: AbsorbedView) -> dict[str, torch.Tensor] | None:
    """The tensors a stock model of ``view``'s class needs beside the absorbed ones to compute the absorbed function
    after any group element (every norm weight 1, key → tensor in ``view``'s dtype), or None where no stock model
    computes it: a stream norm other than an RMSNorm ``w ⊙ x / rms(x)`` (a LayerNorm, whose mean subtraction a
    rotation breaks; Gemma's ``1 + w``). Decided from the absorption plan, before any weight is read."""
    if any(n.kind != "rmsnorm" or n.offset for n in view.norms):
        return None
    return {n.weight: torch.ones(n.size, dtype=view.dtype_of(n.weight)) for n in view.norms}
