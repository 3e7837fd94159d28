"""ConvNeXt (transformers' classes; timm's are traced by :func:`modeconn.symmetry_spec`): one channel space per stage.

Layout: ``embeddings.patch_embeddings`` (a strided Conv2d) → ``embeddings.layernorm`` (channels first) → stages.
Stage ``i > 0`` starts with ``downsampling_layer`` = [LayerNorm over stage ``i − 1``'s channels, a strided Conv2d to
stage ``i``'s]. A layer: ``x + layer_scale · pwconv2(act(pwconv1(LN(dwconv(x)))))`` with a depthwise ``dwconv``
(channel c reads only channel c) and channels-last LayerNorm / Linear layers. ``ConvNextModel`` ends with
``layernorm`` on the pooled last stage (``pooler_output``); the classifier reads it.

Spaces: each stage's channels (a hidden space; the last stage is the stream, the model's output in
``ConvNextModel``): the writers (the patch or downsampling convolution's output channels, ``dwconv``'s channels and
bias — one axis that is its input and output alike —, ``pwconv2``'s rows, the layer scales), every LayerNorm on the
stage, the readers (``pwconv1``'s columns, the next downsampling convolution's input channels, the classifier);
each layer's FFN hidden units. LayerNorm is post-block here (it normalises inside the branch and on the downsampling
path), so there is no orthogonal symmetry and no absorption. ConvNeXt-V2's GRN is not described.
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, base_path, join, pixel_inputs
from .registry import ADAPTERS, Adapter
from .structure import FFN, Hidden, Slice, Stream, Structure

CLASSES = ("ConvNextModel", "ConvNextForImageClassification")


def _affine(W: Walker, path: str) -> list[Slice]:
    return [W.param(path, n, 0) for n in ("weight", "bias") if getattr(W.mod(path), n, None) is not None]


def _stage(W: Walker, cfg, prefix: str, sp: str, i: int, space: dict, ffns: list) -> None:
    """Bind stage ``i``'s layers into ``space`` (writers / norms / readers) and ``ffns``."""
    for j in range(cfg.depths[i]):
        lp = f"{sp}.layers.{j}"
        up, down = W.linear(f"{lp}.pwconv1"), W.linear(f"{lp}.pwconv2")
        space["writers"] += [W.param(f"{lp}.dwconv", "weight", 0), *down.rows()]
        space["writers"] += [W.param(f"{lp}.dwconv", "bias", 0)] if W.mod(f"{lp}.dwconv").bias is not None else []
        if isinstance(getattr(W.mod(lp), "layer_scale_parameter", None), torch.Tensor):
            space["writers"].append(W.param(lp, "layer_scale_parameter", 0))
        space["norms"] += _affine(W, f"{lp}.layernorm")
        space["readers"] += up.cols()
        ffns.append(FFN(join(prefix, lp), up.out_features, up.rows(), down.cols(), (), str(cfg.hidden_act)))


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    cls_name = next((c.__name__ for c in type(model).__mro__ if c.__name__ in CLASSES), None)
    if cls_name is None:
        raise UnsupportedOperationError(f"convnext adapter: {type(model).__name__} is not supported "
                                        f"(supported: {', '.join(CLASSES)})")
    W = Walker(model, prefix, "convnext")
    base = base_path(model)
    emb = W.linear(join(base, "embeddings.patch_embeddings"))
    spaces = [{"writers": [*emb.rows()], "norms": _affine(W, join(base, "embeddings.layernorm")), "readers": []}]
    ffns: list[FFN] = []
    for i in range(cfg.num_stages):
        sp = join(base, f"encoder.stages.{i}")
        if i > 0:
            down = W.linear(f"{sp}.downsampling_layer.1")
            spaces[-1]["norms"] += _affine(W, f"{sp}.downsampling_layer.0")
            spaces[-1]["readers"] += down.cols()
            spaces.append({"writers": [*down.rows()], "norms": [], "readers": []})
        _stage(W, cfg, prefix, sp, i, spaces[-1], ffns)
    last = spaces[-1]
    final = join(base, "layernorm")
    heads = W.heads_reading(("classifier",), cfg.hidden_sizes[-1])
    last["readers"] += [c for h in heads for c in h.cols()]
    hidden = tuple(Hidden(join(prefix, base, f"encoder.stages.{i}"), cfg.hidden_sizes[i], tuple(s["writers"]),
                          tuple(s["readers"]), tuple(s["norms"])) for i, s in enumerate(spaces[:-1]))
    # the channels-first LayerNorms' parameters are bound as writers (no probe reads a channels-first input)
    pooled = W.norm(final, heads)
    stream = Stream(cfg.hidden_sizes[-1], (*last["writers"], *last["norms"]), (pooled,), tuple(last["readers"]),
                    is_output=not heads, post_norm=True)
    return Structure("convnext", cfg.model_type, type(model).__name__, prefix, stream, (), tuple(ffns), hidden,
                     frozen=(*W.buffers(), *(h.bias for h in heads if h.bias)),
                     notes=("one channel space per stage; depthwise convolutions move with their channels",))



ADAPTERS.register("convnext")(Adapter(
    "convnext", describe, pixel_inputs, CLASSES,
    absorb="convnext normalises inside each branch and on the downsampling path, so no scale can be folded into "
           "readers and there is no orthogonal channel symmetry to expose"))
