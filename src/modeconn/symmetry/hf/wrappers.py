"""Multimodal wrappers (Llava, Gemma-3 and Mistral-3 conditional generation): the language model's spaces, with the projector's
output joining its residual stream.

A wrapper computes image features with its vision tower, maps them into the language model's embedding space with a
projector, and puts them where the image tokens are in the embedded text: the projector's last layer *writes the
language model's residual stream* (its output rows, or the stream axis of a projection matrix), and the LM head reads
the final norm. So a wrapper's :class:`~modeconn.symmetry.hf.structure.Structure` is its language model's (from the
language model's own registered adapter) with the projector's output added to the stream's writers and the head to
its readers. The vision tower and the rest of the projector are frozen: they act on the vision model's own spaces,
which no group here moves (a coarser group than the wrapper admits, never a wrong one). The example inputs hold an
image, so the projector's bindings are exercised by every check that runs the model.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace

import torch
from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, join, token_inputs
from .registry import ADAPTERS, Adapter, adapter_for
from .structure import Structure


@dataclass(frozen=True)
class Wrapper:
    """One wrapper family: the language model's path, the projector's output (``(module, parameter, stream axis)``,
    or a Linear's path with ``parameter=None``: its rows and bias), the frozen vision side, and the head."""

    family: str
    classes: tuple[str, ...]
    projector_out: tuple[str, str | None, int]
    vision: tuple[str, ...] = ("model.vision_tower", "model.multi_modal_projector")
    language_model: str = "model.language_model"
    head: str = "lm_head"


def describe_wrapper(w: Wrapper, model: nn.Module, prefix: str) -> Structure:
    """The wrapper's :class:`Structure` (module docstring). Raises UnsupportedOperationError when the language model
    inside has no registered adapter of its own (an inferred layout is not composed into a wrapper)."""
    if not {c.__name__ for c in type(model).__mro__} & set(w.classes):
        raise UnsupportedOperationError(f"{w.family} adapter: {type(model).__name__} is not supported "
                                        f"(supported: {', '.join(w.classes)})")
    W = Walker(model, prefix, w.family)
    lm = W.mod(w.language_model)
    inner = adapter_for(lm)
    if inner.groups is not None:
        raise UnsupportedOperationError(f"{w.family} adapter: the language model {w.language_model!r} "
                                        f"({type(lm).__name__}) has only an inferred layout; wrappers compose "
                                        "registered ones")
    st = inner.describe(lm, join(prefix, w.language_model))
    path, name, axis = w.projector_out
    writers = W.linear(path).rows() if name is None else (W.param(path, name, axis),)
    head = W.heads_reading((w.head,), st.stream.size)
    final = replace(st.stream.norms[-1], readers=tuple(head))
    named = {s.key for s in writers}
    frozen = [W.key(p, n) for p in w.vision for n, _ in W.mod(p).named_parameters() if W.key(p, n) not in named]
    stream = replace(st.stream, writers=(*st.stream.writers, *writers), norms=(*st.stream.norms[:-1], final),
                     readers=(*st.stream.readers, *(c for h in head for c in h.cols())), is_output=False)
    return replace(st, family=w.family, model_type=model.config.model_type, model_class=type(model).__name__,
                   prefix=prefix, stream=stream, frozen=(*st.frozen, *frozen, *(h.bias for h in head if h.bias)))


def _image_inputs(model: nn.Module, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
    """``pixel_values``, and ``image_sizes`` where the wrapper requires them (Mistral-3; Llava takes them optionally and
    then reads a patch size its CLIP tower does not have)."""
    x = {"pixel_values": pixels}
    sizes = inspect.signature(model.model.get_image_features).parameters.get("image_sizes")
    if sizes is not None and sizes.default is inspect.Parameter.empty:
        x["image_sizes"] = torch.tensor([list(pixels.shape[-2:])] * pixels.shape[0])
    return x


def _image_tokens(model: nn.Module, pixels: torch.Tensor) -> int:
    """How many embedding positions one image's features fill."""
    with torch.no_grad():
        feats = model.model.get_image_features(**_image_inputs(model, pixels[:1]))
    feats = getattr(feats, "pooler_output", feats)
    first = feats[0] if isinstance(feats, (list, tuple)) else feats.reshape(-1, feats.shape[-1])
    return int(first.reshape(-1, first.shape[-1]).shape[0])


def example(model: nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Token inputs with one image each: ``pixel_values`` and as many image tokens as its features fill."""
    vision = model.config.vision_config
    size = vision.image_size if isinstance(vision.image_size, int) else vision.image_size[0]
    pixels = torch.randn(2, getattr(vision, "num_channels", 3), size, size, generator=gen)
    ids = token_inputs(model.model.language_model, gen)["input_ids"]
    image_id = getattr(model.config, "image_token_id", None)
    image_id = image_id if image_id is not None else model.config.image_token_index
    ids = torch.where(ids == image_id, (image_id + 1) % model.config.text_config.vocab_size, ids)  # text only
    n = _image_tokens(model, pixels)
    ids = torch.cat([ids[:, :1], torch.full((ids.shape[0], n), image_id), ids[:, 1:]], dim=1)
    return {"input_ids": ids, **_image_inputs(model, pixels)}


WRAPPERS = (
    Wrapper("llava", ("LlavaForConditionalGeneration",), ("model.multi_modal_projector.linear_2", None, 0)),
    Wrapper("gemma3", ("Gemma3ForConditionalGeneration",),
            ("model.multi_modal_projector", "mm_input_projection_weight", 1)),
    Wrapper("mistral3", ("Mistral3ForConditionalGeneration",), ("model.multi_modal_projector.linear_2", None, 0)),
)
for _w in WRAPPERS:
    ADAPTERS.register(_w.family)(Adapter(_w.family, lambda m, p, w=_w: describe_wrapper(w, m, p), example, _w.classes,
                                         absorb=f"{_w.family}: normalization absorption does not apply to a multimodal "
                                                "wrapper (the projector writes the language model's stream)"))
