"""Automatic symmetry specs from a torch.fx trace.

One pass over the fx graph in topological order. Every tensor value carries the dimension on which a
symmetry acts (``dim``) and its layout along that dimension: a list of segments, each a union-find
space id with a size and a ``block`` (entries per unit; > 1 after conv → flatten). Writers (Linear,
Conv) create a space per module; readers bind their input axis to the spaces of their input value;
residual additions and other elementwise binary ops *union* the spaces of their operands; the model's
inputs and outputs are *frozen* spaces, and anything unioned with a frozen space is frozen too.
Frozen spaces are dropped at the end: their axes stay unbound (never permuted).

Per-head spaces (attention): a reshape that splits the permuted dim into (groups, width), e.g.
``q.unflatten(-1, (heads, head_dim))``, *splits* each space into ``heads`` child spaces of size ``head_dim``
(the group is restricted to permutations within each head) and the value records the axis indexing the
children (``Val.outer``). Bindings made before or after the split are expanded to one partial binding per
child at offset ``i · head_dim`` when the spec is built. ``q @ kᵀ`` contracts the per-head dims, so it unions
q's and k's child spaces head by head (QKᵀ is invariant under a joint permutation) and its result carries no
symmetry; ``attn @ v`` keeps v's per-head spaces, and merging the heads again (``flatten``) lays them out
along the feature dim for ``o_proj``. Permutations of whole heads are not modelled (a later head-permutation
group); every space here is a plain permutation space.

Parameters read by ``get_attr`` and combined elementwise with activations (a positional embedding added to
tokens, a per-feature scale) are bound, on the axis broadcast against the permuted dim, to the activations'
spaces (output side, like a bias); read anywhere else they stay unbound and, if also bound somewhere, their
spaces are frozen.

Convolutional attention reshapes channels into heads while it flattens the spatial dims (CoAtNet's
``(B, C, H, W) → (B, heads, C / heads, H·W)``): a reshape is taken run by run of dims whose sizes line up, each a
merge or a split; heads may be merged into the batch axis and split back (BoTNet's ``(B·heads, d, H·W)``), their
layouts then repeated per sample. A parameter contracted with per-head queries (a relative-position table shared by
the heads) joins the heads' spaces and moves with them; one key for all heads (multi-query attention) joins every
head's query space with the key's. Rotary embeddings fix the query/key dims they rotate (:mod:`.library`).

Linear and channel attention form ``kᵀ v``, permuted along both its dims (key dims × value dims): such a value is a
:class:`~.values.Pair`, passed through scaling, softmax and axis moves until a second product contracts one of its dims
(``q (kᵀ v)`` joins q's spaces with k's and carries v's; DaViT's ``softmax(kᵀ v) qᵀ`` joins q's with v's and carries
k's). A reshape that moves channels through the batch axis (MobileViT's patches, HaloNet's blocks) is taken through
the common refinement of both shapes: the permuted dim's layout repeats along the parts before its units and falls
within each unit along the parts after them. A space split into parts and later into coarser or finer ones (q, k
and v groups inside heads) is split at both levels.

Supported: Linear, Conv1d/2d/3d (groups=1, depthwise or grouped), BatchNorm1d/2d/3d, LayerNorm, GroupNorm (with
several groups: permutations within each group), PReLU, padding (of the permuted dim too, with a constant),
elementwise activations, softmax, dropout, pooling, sliding windows (``unfold``),
flatten / view / reshape that merges adjacent dimensions or splits the permuted one into (groups, width) — also
several groups of dims at once —, unflatten, permute / transpose, mean/sum/amax/norm reductions, residual additions
and products, parameters added to activations, matmul / bmm (also of two permuted operands), concatenation, stack,
split / chunk / unbind. A model
whose forward branches on sizes (fx cannot trace it symbolically) is traced at the example's shapes
(:mod:`.concrete`). Anything else raises :class:`UnsupportedOperationError` naming
the node, or with ``on_unsupported="freeze"`` freezes every space touching it.

The package: :mod:`.values` (what a node's value carries), :mod:`.axes` (the union-find of spaces),
:mod:`.registry` and :mod:`.ops` (the op rules, one registered function each, one module per kind of
operation), :mod:`.tracer` (the pass over the graph), :mod:`.assembly` (the spec built from it), :mod:`.leaves`
(which modules stay one node, :func:`register_rule`), :mod:`.library` (rules for libraries' fx-wrapped functions
and layers) and :mod:`.driver` (:func:`symmetry_spec`). A new op is one function in the module of its kind,
registered with :func:`~.registry.module_op` or :func:`~.registry.node_op`.
"""

from __future__ import annotations

from . import ops  # noqa: F401  (registers the op rules)
from .driver import symmetry_spec
from .leaves import (
    ELEMENTWISE_RULES,
    LIBRARY_MODULES,
    LIBRARY_RULES,
    MODULE_RULES,
    fx_trace,
    layer_leaf,
    register_rule,
    rule_leaf,
)
from .registry import module_op, module_types, node_op
from .tracer import OnUnsupported, Tracer

# the leaf policy and the fx trace as the driver reads them (:func:`.leaves.tables`), and the tracer by its old name
_rule_leaf = rule_leaf
_fx_trace = fx_trace
_Tracer = Tracer
_RULE_MODULES = module_types()  # the stock layers with a rule

__all__ = [
    "ELEMENTWISE_RULES",
    "LIBRARY_MODULES",
    "LIBRARY_RULES",
    "MODULE_RULES",
    "OnUnsupported",
    "Tracer",
    "fx_trace",
    "layer_leaf",
    "module_op",
    "node_op",
    "register_rule",
    "rule_leaf",
    "symmetry_spec",
]
