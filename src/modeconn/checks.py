"""Cheap input checks shared by matching, paths and merging (run before any heavy work)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .errors import DeviceMismatchError, NonFiniteError, StateDictMismatchError

StateDict = Mapping[str, torch.Tensor]


def check_compatible(state_dicts: Sequence[StateDict], names: Sequence[str] | None = None) -> None:
    """All state dicts have the same keys, shapes and dtype kinds (:func:`check_dtype_kinds`); one error lists every
    missing/extra key and shape difference (naming both shapes). Raises :class:`StateDictMismatchError`."""
    names = list(names or [f"model {i}" for i in range(len(state_dicts))])
    ref, ref_name = state_dicts[0], names[0]
    problems = []
    for sd, name in zip(state_dicts[1:], names[1:], strict=False):
        missing = [k for k in ref if k not in sd]
        extra = [k for k in sd if k not in ref]
        if missing:
            problems.append(f"keys of {ref_name} missing from {name}: {missing}")
        if extra:
            problems.append(f"keys of {name} not in {ref_name}: {extra}")
        for k in ref:
            if k in sd and tuple(ref[k].shape) != tuple(sd[k].shape):
                problems.append(f"{k!r}: shape {tuple(ref[k].shape)} in {ref_name} vs {tuple(sd[k].shape)} in {name}")
    if problems:
        raise StateDictMismatchError("state dicts are not compatible:\n  " + "\n  ".join(problems))
    check_dtype_kinds(state_dicts, names)


def dtype_kind(dtype: torch.dtype) -> str:
    """The kind of a dtype: ``"bool"``, ``"complex"``, ``"floating"`` (fp8 … fp64, bf16) or ``"integer"``.

    Precisions of one kind are interchangeable (an fp16 file loads into an fp32 model); kinds are not: safetensors
    cannot tell int32 from float32 bytes, so a header that relabels one as the other would silently reinterpret
    the bits (float32 weights read as int32 are ~1e9)."""
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "floating" if dtype.is_floating_point else "integer"


def _dtype_of(value: Any) -> torch.dtype:
    return value if isinstance(value, torch.dtype) else value.dtype  # a tensor, meta tensor or TensorInfo


def dtype_kind_mismatches(expected: Mapping[str, Any], found: Mapping[str, Any], expected_name: str = "the model",
                          found_name: str = "the file") -> list[str]:
    """``"key: the model has float32 (floating), the file has int32 (integer)"`` for every key of both maps whose
    dtype kind (:func:`dtype_kind`) differs. Values are dtypes, tensors (meta tensors too) or anything with a
    ``dtype``; keys present in only one map are not compared (key checks report them)."""
    out = []
    for k, e in expected.items():
        if k not in found:
            continue
        de, df = _dtype_of(e), _dtype_of(found[k])
        if dtype_kind(de) != dtype_kind(df):
            out.append(f"{k}: {expected_name} has {str(de)[6:]} ({dtype_kind(de)}), {found_name} has "
                       f"{str(df)[6:]} ({dtype_kind(df)})")
    return out


def check_dtype_kinds(state_dicts: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> None:
    """Every tensor has the dtype kind (:func:`dtype_kind`) of the same key in the first (reference) state dict.

    ``state_dicts``: maps key → tensor / meta tensor / dtype (lazy checkpoints' ``meta()`` or ``dtypes``).
    Floating precisions may differ (fp16 vs fp32); an integer tensor where the reference has a floating one (or any
    other change of kind) is refused, because its bytes would be reinterpreted, not converted.

    Raises:
        StateDictMismatchError: naming every such tensor, its model and both dtypes.
    """
    names = list(names or [f"model {i}" for i in range(len(state_dicts))])
    problems = []
    for sd, name in zip(state_dicts[1:], names[1:], strict=True):
        problems += dtype_kind_mismatches(state_dicts[0], sd, names[0], name)
    if problems:
        raise StateDictMismatchError(
            "tensors of another dtype kind than the reference (their bytes would be reinterpreted as another kind "
            "of number; floating precisions may differ, kinds may not):\n  " + "\n  ".join(problems))


def check_one_device(state_dicts: Sequence[StateDict], names: Sequence[str] | None = None) -> torch.device:
    """The single device all tensors live on; :class:`DeviceMismatchError` naming two tensors otherwise."""
    names = list(names or [f"model {i}" for i in range(len(state_dicts))])
    first: tuple[str, torch.device] | None = None
    for sd, name in zip(state_dicts, names, strict=False):
        for k, t in sd.items():
            if first is None:
                first = (f"{name}[{k!r}]", t.device)
            elif t.device != first[1]:
                raise DeviceMismatchError(
                    f"{name}[{k!r}] is on {t.device} but {first[0]} is on {first[1]}; move both models to one device"
                )
    return first[1] if first else torch.device("cpu")


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of floating tensor ``t`` is finite, in one cheap pass: NaN/Inf make any sum non-finite, so
    a finite sum (in ``t``'s own dtype: no widened copy) proves it; only a non-finite sum (an entry, or an overflow
    of the sum itself) is settled by the entry-wise test."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def check_finite(sd: StateDict, name: str, keys=None) -> None:
    """:class:`NonFiniteError` naming the first floating tensor with NaN/Inf entries."""
    for k in keys if keys is not None else sd:
        t = sd[k]
        if t.is_floating_point() and not all_finite(t):
            bad = int((~torch.isfinite(t)).sum())
            raise NonFiniteError(f"{name}[{k!r}] has {bad} NaN/Inf entries (shape {tuple(t.shape)})")


def check_finite_stored(t: torch.Tensor, file: Any, key: str, part: str = "") -> torch.Tensor:
    """``t`` itself, tensor ``key`` (``part``: which rows, when only some were read) as read from checkpoint file
    ``file``; :class:`NonFiniteError` naming the file and the tensor when a floating ``t`` holds NaN/Inf.

    Every checkpoint reader calls it on each tensor before anything uses it: a non-finite parameter or buffer is the
    input's fault, reported as such, not a wrong result or an "internal error" further on."""
    if not (t.is_floating_point() or t.is_complex()):
        return t
    v = t.float() if t.dtype.itemsize == 1 else t  # fp8: no sum / isfinite kernels; exact in fp32
    if all_finite(v):
        return t
    nan, inf = int(torch.isnan(v).sum()), int(torch.isinf(v).sum())
    raise NonFiniteError(
        f"{file}: tensor {key!r}{part} ({str(t.dtype).removeprefix('torch.')}, shape {tuple(t.shape)}) has "
        f"{nan + inf} non-finite entries ({nan} NaN, {inf} ±Inf): the checkpoint is broken, not readable as a model — "
        "modeconn refuses non-finite weights and buffers (re-export or repair it)")


def is_interpolable(t: torch.Tensor) -> bool:
    """Floating tensors are interpolated/averaged; integer buffers (``num_batches_tracked``) never are."""
    return t.is_floating_point() or t.is_complex()
