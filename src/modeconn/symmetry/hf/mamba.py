"""Mamba (selective state-space model, Mamba-1): which channel permutations are symmetries of a selective-scan block.

A block (``D`` = ``intermediate_size`` inner channels, ``N`` = ``state_size``, ``R`` = ``time_step_rank``)::

    x, z   = in_proj(norm(h)) split [D | D]
    x      = silu(conv1d(x))                      (depthwise: channel d reads only channel d)
    Δ, B, C = x_proj(x) split [R | N | N];  Δ = softplus(dt_proj(Δ))
    s_d,n ← exp(Δ_d · A_d,n) · s_d,n + Δ_d · B_n · x_d;   y_d = Σ_n C_n · s_d,n + D_d · x_d
    h     ← h + out_proj(y · silu(z))

Symmetries (each checked on a perturbed instance): the **residual stream** (embeddings, the RMSNorms, ``in_proj``'s
columns, ``out_proj``'s rows, the head); the **inner channels** d — every per-channel quantity moves together:
``in_proj``'s rows of both halves (``x_d`` and ``z_d`` meet in ``y_d · silu(z_d)``), the depthwise ``conv1d`` rows
and bias, ``dt_proj``'s rows and bias, ``A_log``'s rows, ``D``, and the columns of ``x_proj`` and ``out_proj``; the
**state** index n — ``B``'s and ``C``'s rows of ``x_proj`` and ``A_log``'s columns together; the **time-step rank**
(``x_proj``'s first R rows, ``dt_proj``'s columns: a linear bottleneck). Nothing mixes channels d inside the scan, so
no other grouping exists: moving ``x`` without ``z``, or B without C or ``A_log``, changes the outputs (the tests'
negative controls). Mamba-2 (grouped B/C heads, a gated RMSNorm over the SSM output) is not described.
"""

from __future__ import annotations

from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, base_path, join, token_inputs
from .registry import ADAPTERS, Adapter
from .structure import Hidden, Slice, Stream, Structure

CLASSES = ("MambaModel", "MambaForCausalLM")


def _mixer(W: Walker, prefix: str, mp: str, cfg) -> tuple[list[Hidden], tuple[Slice, ...], tuple[Slice, ...]]:
    """The mixer's inner, state and time-step spaces; returns them with the stream's reader and writer slices."""
    D, N, R = cfg.intermediate_size, cfg.state_size, cfg.time_step_rank
    inp, xp, dt, out = (W.linear(join(mp, n)) for n in ("in_proj", "x_proj", "dt_proj", "out_proj"))
    conv = join(mp, "conv1d")
    if W.mod(conv).groups != D:
        raise UnsupportedOperationError(f"mamba adapter: {conv!r} is not depthwise ({W.mod(conv).groups} groups, {D} "
                                        "channels)")
    per_channel = (*inp.rows(0, D), *inp.rows(D, D), W.param(conv, "weight", 0), *dt.rows(),
                   W.param(mp, "A_log", 0), W.param(mp, "D", 0))
    per_channel += (W.param(conv, "bias", 0),) if W.mod(conv).bias is not None else ()
    spaces = [Hidden(join(prefix, mp, "inner"), D, per_channel, (*xp.cols(), *out.cols())),
              Hidden(join(prefix, mp, "state"), N, (*xp.rows(R, N), *xp.rows(R + N, N), W.param(mp, "A_log", 1)), (),
                     probe=(xp.path, "output", R)),
              Hidden(join(prefix, mp, "time_step"), R, xp.rows(0, R), dt.cols())]
    return spaces, inp.cols(), out.rows()


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    if not any(c.__name__ in CLASSES for c in type(model).__mro__):
        raise UnsupportedOperationError(f"mamba adapter: {type(model).__name__} is not supported "
                                        f"(supported: {', '.join(CLASSES)})")
    W = Walker(model, prefix, "mamba")
    base = base_path(model)
    writers, readers, norms, hidden = [W.param(join(base, "embeddings"), "weight", 1)], [], [], []
    for i in range(cfg.num_hidden_layers):
        lp = join(base, f"layers.{i}")
        spaces, reads, writes = _mixer(W, prefix, join(lp, "mixer"), cfg)
        norms.append(W.norm(join(lp, "norm"), (W.linear(join(lp, "mixer.in_proj")),)))
        hidden += spaces
        readers += reads
        writers += writes
    heads = W.heads_reading(("lm_head",), cfg.hidden_size)
    norms.append(W.norm(join(base, "norm_f"), heads))
    readers += [c for h in heads for c in h.cols()]
    stream = Stream(cfg.hidden_size, tuple(writers), tuple(norms), tuple(readers), is_output=not heads)
    return Structure("mamba", cfg.model_type, type(model).__name__, prefix, stream, (), (), tuple(hidden),
                     frozen=tuple(W.buffers()), notes=("selective scan: inner channels, state and time-step spaces",))


ADAPTERS.register("mamba")(Adapter(
    "mamba", describe, lambda m, g: token_inputs(m, g), CLASSES,
    absorb="transformers' Mamba block reads its RMSNorm's weight (for the dtype), so the parameter-free norm that "
           "absorption installs cannot stand in for it"))
