"""The common :class:`Path` object: an ordered list of models (state dicts) between two endpoints.

Every path-finding method (linear, Bezier / polygonal chain, LLPF M2M / M2O / cross-sphere) returns a
``Path``: points ``θ_0 … θ_{n−1}`` (full state dicts, buffers included), their positions ``t`` in [0, 1]
(λ for the linear path, the curve parameter for Bezier/polychain, normalised arc length for LLPF), the
method name, ``info`` (method-specific diagnostics) and ``compute`` (``grad_evals``: minibatch backward passes,
the unit methods are compared in; ``wall_time_s``).

Storage: in memory, or on disk as a directory::

    path.json                   manifest: method, t, info, compute, shards, model keys/shapes + digest
    points-000000.safetensors   points 0 … N−1, keys "<index>/<state-dict key>"
    points-000032.safetensors   …

A disk-backed path reads points lazily (one at a time), so long LLPF paths need not fit in memory.
:meth:`Path.load` checks integrity (every shard present, complete, sha256 as recorded) and, given a model,
that the path belongs to it (keys/shapes) — a path of another architecture raises
:class:`~modeconn.errors.StateDictMismatchError` naming the directory.

:meth:`Path.evaluate` gives a :class:`PathCurve` (a :class:`~modeconn.path.Curve`): loss/accuracy per split
at every point, a continuity check (``k`` linear sub-points between consecutive points; the largest loss
among them per segment), the peak train loss and the path length ``Σ_i ‖θ_{i+1} − θ_i‖₂`` over the model's
parameters.

**Complete** means the same for every method (:meth:`PathCurve.completeness`): the path reaches B (its search
says so, ``info["reached_b"]``, and the caller may check the last point) *and* every segment passes the
continuity check — its largest sub-point loss exceeds the larger loss at its two ends by at most
``continuity_tol`` (default :data:`CONTINUITY_TOL` nats), so the losses at the points describe the whole path
to that tolerance. A path evaluated without sub-points is not complete (its continuity was not checked).
"""

from __future__ import annotations

import copy
import hashlib
import os
import pathlib
import shutil
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
from safetensors import safe_open

from .._util.atomic import atomic_path
from .._util.digest import sha256_file
from .._util.jsonio import write_json
from ..checks import check_compatible, check_one_device
from ..errors import CheckpointError, ConfigError, StateDictMismatchError
from ..io import check_state_dict_compatible, read_json_object, save_state_dict
from ..nn_utils import batchnorm_modules
from .batchnorm import fixed_batches, reset_bn_stats
from .curve import Curve
from .evaluate import evaluate_model
from .interpolate import interpolate

StateDict = Mapping[str, torch.Tensor]
MANIFEST = "path.json"
FORMAT = "modeconn-path"
FORMAT_VERSION = 1
SHARD_PREFIX = "points-"
PATH_BN_POLICIES = ("reset", "keep")
CONTINUITY_TOL = 0.05
"""Default continuity tolerance (loss units, nats for cross-entropy): a segment passes when its sub-points rise
at most this much above the larger loss at its two ends."""
LOW_LOSS_MARGIN = 0.1
"""A complete path is *low-loss* when its dense peak train loss is at most this many nats above the higher
endpoint's (the verdict of ``modeconn path`` and of the experiments; LLPF's default refinement target sits
:data:`CONTINUITY_TOL` below it: :data:`~modeconn.path.llpf.THRESHOLD_MARGIN`)."""


# ------------------------------------------------------------------------------------------- helpers


def model_keys(obj: nn.Module | StateDict) -> dict[str, tuple[int, ...]]:
    """``{key: shape}`` of a model's state dict (or of a state dict)."""
    sd = obj.state_dict() if isinstance(obj, nn.Module) else obj
    return {k: tuple(int(s) for s in v.shape) for k, v in sd.items()}


def keys_digest(keys: Mapping[str, Sequence[int]]) -> str:
    """sha256 over the sorted ``key:shape`` lines: which architecture a path belongs to."""
    text = "\n".join(f"{k}:{','.join(str(int(s)) for s in keys[k])}" for k in sorted(keys))
    return hashlib.sha256(text.encode()).hexdigest()


def link_or_copy(src: pathlib.Path, dst: pathlib.Path) -> None:
    """Make ``dst`` hold ``src``'s bytes: a hard link where the file system allows, else a copy — either way
    through a temporary sibling (:func:`~modeconn._util.atomic.atomic_path`), so ``dst`` is never half-written."""
    with atomic_path(dst) as tmp:
        tmp.unlink()  # os.link makes the name itself
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)


def cpu_clone(sd: StateDict) -> dict[str, torch.Tensor]:
    """Detached CPU copies (never aliasing the caller's tensors)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}


def shard_name(start: int) -> str:
    return f"{SHARD_PREFIX}{start:06d}.safetensors"


def write_shard(directory: pathlib.Path, start: int, points: Sequence[StateDict]) -> dict[str, Any]:
    """Write ``points`` (global indices ``start …``) as one safetensors file; returns its manifest entry."""
    name = shard_name(start)
    tensors = {f"{start + j}/{k}": v for j, p in enumerate(points) for k, v in p.items()}
    # no extra header metadata: safetensors writes metadata maps in hash order, which would make the bytes
    # of identical shards differ between processes (resume must reproduce them exactly)
    save_state_dict(directory / name, tensors)
    return {"file": name, "start": start, "count": len(points), "sha256": sha256_file(directory / name)}


def param_names(model: nn.Module) -> list[str]:
    """State-dict keys of the model's parameters (the path coordinates; buffers are not)."""
    return [n for n, _ in model.named_parameters()]


def distance(a: StateDict, b: StateDict, keys: Iterable[str]) -> float:
    """``‖a − b‖₂`` over ``keys`` (float64 accumulation)."""
    total = 0.0
    for k in keys:
        d = a[k].double() - b[k].to(a[k].device).double()
        total += float((d * d).sum())
    return total ** 0.5


# ------------------------------------------------------------------------------------------ PathCurve


@dataclass
class PathCurve(Curve):
    """:class:`Curve` of a :class:`Path` (``lambdas`` are the path's ``t``) plus path diagnostics.

    Attributes:
        length: ``Σ_i ‖θ_{i+1} − θ_i‖₂`` over the model's parameters (same units as the weights).
        sub_points: ``k`` linear sub-points evaluated between consecutive points (0: no continuity check).
        segment_peaks: (n−1,) largest ``continuity_split`` loss among the sub-points of each segment
            (empty when ``sub_points == 0``).
        continuity_split: the split the continuity check ran on.
    """

    length: float = 0.0
    sub_points: int = 0
    segment_peaks: np.ndarray = field(default_factory=lambda: np.zeros(0))
    continuity_split: str | None = None

    def continuity_peak(self) -> float:
        """The largest loss among all sub-points (NaN without a continuity check)."""
        return float(self.segment_peaks.max()) if len(self.segment_peaks) else float("nan")

    def dense_peak(self, split: str | None = None) -> float:
        """``max`` of the peak at the points and, on the continuity split, at the sub-points."""
        split = self.splits[0] if split is None else split
        p = self.peak(split)
        if split == self.continuity_split and len(self.segment_peaks):
            p = max(p, self.continuity_peak())
        return p

    def segment_excess(self) -> np.ndarray:
        """(n−1,) ``segment_peaks[i] − max(loss_i, loss_{i+1})`` on the continuity split: how far each segment's
        interior rises above its ends (empty without a continuity check)."""
        if not len(self.segment_peaks):
            return np.zeros(0)
        ends = self.values(self.continuity_split, "loss")
        return self.segment_peaks - np.maximum(ends[:-1], ends[1:])

    def completeness(self, tol: float = CONTINUITY_TOL, *, reached_b: bool | None = None) -> dict[str, Any]:
        """Whether the path is complete (module docstring): it reaches B and every segment passes the continuity
        check at ``tol``.

        Args:
            tol: largest allowed rise of a segment's sub-points above its ends (loss units), ≥ 0.
            reached_b: whether the path reaches B; None: the search's own ``info["reached_b"]`` (a path whose
                search does not say is taken to reach B).

        Returns: ``{"complete", "reached_b", "continuity_checked", "continuity_tol", "failing_segments"`` (per
            failing segment i: ``segment``, ``points`` [i, i+1], ``t``, ``dense_peak``, ``ends_max``, ``excess``),
            ``"worst_segment"`` (the failing segment with the largest excess, else None), ``"reasons"`` (one
            sentence per failure)``}``.
        Raises: ConfigError (``tol`` negative or not finite).
        """
        if not (isinstance(tol, (int, float)) and np.isfinite(tol) and tol >= 0):
            raise ConfigError(f"continuity tolerance must be a finite number ≥ 0, got {tol!r}")
        if reached_b is None:
            reached_b = self.info.get("path_info", {}).get("reached_b") is not False
        excess = self.segment_excess()
        checked = self.sub_points > 0 and len(self.lambdas) > 1 and len(excess) == len(self.lambdas) - 1
        ends = self.values(self.continuity_split, "loss") if checked else None
        failing = [{"segment": i, "points": [i, i + 1], "t": [float(self.lambdas[i]), float(self.lambdas[i + 1])],
                    "dense_peak": float(self.segment_peaks[i]), "ends_max": float(max(ends[i], ends[i + 1])),
                    "excess": float(excess[i])}
                   for i in range(len(excess)) if not excess[i] <= tol]  # NaN fails too
        worst = max(failing, key=lambda f: np.inf if np.isnan(f["excess"]) else f["excess"]) if failing else None
        reasons = []
        if not reached_b:
            reasons.append("the search stopped before reaching B")
        if len(self.lambdas) > 1 and not checked:
            reasons.append("the continuity between consecutive points was not checked (no sub-points)")
        if worst is not None:
            reasons.append(f"{len(failing)} of {len(excess)} segments fail the continuity check (worst: points "
                           f"{worst['points'][0]}→{worst['points'][1]}, dense peak {worst['dense_peak']:.4f} vs "
                           f"{worst['ends_max']:.4f} at its ends, tolerance {tol:g})")
        return {"complete": not reasons, "reached_b": bool(reached_b), "continuity_checked": checked,
                "continuity_tol": float(tol), "failing_segments": failing, "worst_segment": worst, "reasons": reasons}

    def path_summary(self) -> dict:
        s = self.continuity_split
        return {
            "n_points": len(self.lambdas),
            "length": self.length,
            "sub_points": self.sub_points,
            "continuity_split": s,
            "continuity_peak_loss": self.continuity_peak(),
            "peak_loss": {sp: self.peak(sp) for sp in self.splits},
            "dense_peak_loss": self.dense_peak(s) if s is not None else None,
        }

    def to_json(self) -> dict:
        out = super().to_json()
        out["path"] = self.path_summary()
        out["segment_peaks"] = self.segment_peaks.tolist()
        return out

    @classmethod
    def from_json(cls, d: dict) -> PathCurve:
        base = Curve.from_json(d)
        p = d.get("path", {})
        return cls(lambdas=base.lambdas, metrics=base.metrics, bn=base.bn, info=base.info,
                   length=float(p.get("length", 0.0)), sub_points=int(p.get("sub_points", 0)),
                   segment_peaks=np.asarray(d.get("segment_peaks", []), dtype=float),
                   continuity_split=p.get("continuity_split"))


# ----------------------------------------------------------------------------------------------- Path


class Path:
    """An ordered list of points (state dicts) with positions ``t`` — see the module docstring.

    Args:
        points: ≥ 1 state dicts of one architecture (same keys/shapes; copied to CPU, never aliased).
        t: (n,) non-decreasing positions in [0, 1]; default evenly spaced (``[0.]`` for one point).
        method: e.g. ``"linear"``, ``"bezier-1"``, ``"llpf-m2m"``.
        info: JSON-serialisable diagnostics (method parameters, per-tick records, warnings).
        compute: ``{"grad_evals": int, "wall_time_s": float}`` spent finding the path.

    Raises:
        ConfigError: no points, or ``t`` of the wrong length / decreasing / outside [0, 1].
        StateDictMismatchError: points with different keys or shapes.
    """

    def __init__(self, points: Sequence[StateDict], t: Sequence[float] | None = None, *, method: str = "",
                 info: Mapping[str, Any] | None = None, compute: Mapping[str, Any] | None = None) -> None:
        points = list(points)
        if not points:
            raise ConfigError("a Path needs at least one point")
        check_compatible(points, [f"point {i}" for i in range(len(points))])
        self._mem: list[dict[str, torch.Tensor]] | None = [cpu_clone(p) for p in points]
        self._dir: pathlib.Path | None = None
        self._shards: list[dict[str, Any]] = []
        self._keys = model_keys(points[0])
        self._dtypes = {k: str(v.dtype).replace("torch.", "") for k, v in points[0].items()}
        self.t = _check_t(t, len(points))
        self.method = method
        self.info: dict[str, Any] = dict(info or {})
        self.compute: dict[str, Any] = {"grad_evals": 0, "wall_time_s": 0.0, **dict(compute or {})}

    # ------------------------------------------------------------------ construction from disk
    @classmethod
    def _from_shards(cls, directory: pathlib.Path, shards: list[dict[str, Any]], keys: Mapping[str, Sequence[int]],
                     dtypes: Mapping[str, str], t: Sequence[float], method: str, info: Mapping[str, Any],
                     compute: Mapping[str, Any]) -> Path:
        self = cls.__new__(cls)
        self._mem = None
        self._dir = pathlib.Path(directory)
        self._shards = [dict(s) for s in sorted(shards, key=lambda s: s["start"])]
        self._keys = {k: tuple(int(x) for x in v) for k, v in keys.items()}
        self._dtypes = dict(dtypes)
        n = sum(s["count"] for s in self._shards)
        self.t = _check_t(t, n)
        self.method = method
        self.info = dict(info)
        self.compute = {"grad_evals": 0, "wall_time_s": 0.0, **dict(compute)}
        return self

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self._mem) if self._mem is not None else sum(s["count"] for s in self._shards)

    @property
    def keys(self) -> dict[str, tuple[int, ...]]:
        """``{state-dict key: shape}`` of every point."""
        return dict(self._keys)

    @property
    def digest(self) -> str:
        """sha256 of the keys/shapes (identifies the architecture)."""
        return keys_digest(self._keys)

    @property
    def directory(self) -> pathlib.Path | None:
        """The directory a disk-backed path reads from (None in memory)."""
        return self._dir

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        """Point ``i`` (negative indices allowed) as a new dict of CPU tensors. Do not modify the tensors in
        place (in-memory paths share them); clone first."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"point {i} out of range for a path of {n} points")
        i %= n
        if self._mem is not None:
            return dict(self._mem[i])
        for s in self._shards:
            if s["start"] <= i < s["start"] + s["count"]:
                f = self._dir / s["file"]
                try:
                    with safe_open(str(f), framework="pt", device="cpu") as fh:
                        return {k: fh.get_tensor(f"{i}/{k}") for k in self._keys}
                except Exception as err:
                    raise CheckpointError(f"{f}: reading point {i} failed (truncated or corrupt?): {err}") from None
        raise CheckpointError(f"{self._dir}: no shard holds point {i}")  # pragma: no cover - manifest checked

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for i in range(len(self)):
            yield self[i]

    def length(self, keys: Iterable[str] | None = None) -> float:
        """``Σ_i ‖θ_{i+1} − θ_i‖₂`` over ``keys`` (default: every floating tensor; :meth:`evaluate` uses the
        model's parameters only, excluding BatchNorm running statistics)."""
        keys = list(keys) if keys is not None else [k for k, d in self._dtypes.items() if _is_float_name(d)]
        total, prev = 0.0, None
        for p in self:
            if prev is not None:
                total += distance(prev, p, keys)
            prev = p
        return total

    def check_model(self, model: nn.Module | StateDict, where: str | None = None) -> None:
        """Raise :class:`StateDictMismatchError` unless ``model`` has this path's keys and shapes."""
        where = where or (f"path directory {self._dir}" if self._dir is not None else "path")
        found = model_keys(model)
        if keys_digest(found) == self.digest:
            return
        try:
            check_state_dict_compatible(found, self._keys, where)
        except StateDictMismatchError as err:
            raise StateDictMismatchError(
                f"{where} belongs to a different model (keys/shapes digest {self.digest[:12]}… vs the model's "
                f"{keys_digest(found)[:12]}…): {err}"
            ) from None

    # ------------------------------------------------------------------ persistence
    def manifest(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "method": self.method,
            "n_points": len(self),
            "t": [float(x) for x in self.t],
            "model": {"digest": self.digest, "keys": {k: list(v) for k, v in self._keys.items()},
                      "dtypes": self._dtypes},
            "shards": self._shards,
            "info": self.info,
            "compute": self.compute,
        }

    def save(self, directory: str | os.PathLike, *, shard_size: int = 32, overwrite: bool = False) -> pathlib.Path:
        """Write the path to ``directory`` (``path.json`` + ``points-*.safetensors``, ``shard_size`` points per
        file; every file written atomically, the manifest last). A disk-backed path saved to its own
        directory only rewrites the manifest; saved elsewhere, its shards are hard-linked (copied where links
        are impossible), keeping their layout and recorded sha256. Returns the directory; afterwards this path
        reads from it.

        Raises:
            ConfigError: ``shard_size`` < 1.
            CheckpointError: ``directory`` already holds a path (without ``overwrite``) or is a file.
        """
        if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
            raise ConfigError(f"shard_size must be a positive integer, got {shard_size!r}")
        d = pathlib.Path(directory)
        if d.exists() and not d.is_dir():
            raise CheckpointError(f"{d}: exists and is not a directory")
        same = self._dir is not None and d.resolve() == self._dir.resolve()
        if (d / MANIFEST).exists() and not overwrite and not same:
            raise CheckpointError(f"{d}: already holds a path ({MANIFEST}); pass overwrite=True to replace it")
        d.mkdir(parents=True, exist_ok=True)
        if not same and self._dir is not None:
            shards = [dict(s) for s in self._shards]
            for s in shards:
                link_or_copy(self._dir / s["file"], d / s["file"])
        elif not same:
            shards = []
            for start in range(0, len(self), shard_size):
                pts = [self[i] for i in range(start, min(start + shard_size, len(self)))]
                shards.append(write_shard(d, start, pts))
        if not same:
            keep = {s["file"] for s in shards}
            for f in d.glob(f"{SHARD_PREFIX}*.safetensors"):
                if f.name not in keep:
                    f.unlink()
            self._shards, self._dir, self._mem = shards, d, None
        write_json(d / MANIFEST, self.manifest(), nan="null")
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike, model: nn.Module | StateDict | None = None, *,
             verify: bool = True) -> Path:
        """Open a saved path (points are read lazily).

        Args:
            model: if given, the path must belong to it (same keys/shapes).
            verify: also check every shard's sha256 against the manifest (reads every file once).

        Raises:
            CheckpointError: missing/invalid ``path.json``, a missing, truncated or modified shard (named).
            StateDictMismatchError: the path belongs to a different model (both digests and the differing
                keys/shapes are named).
        """
        d = pathlib.Path(directory)
        mf = d / MANIFEST
        if not mf.is_file():
            raise CheckpointError(f"{d}: not a path directory ({MANIFEST} not found)")
        m = read_json_object(mf, "path manifest")
        if m.get("format") != FORMAT:
            raise CheckpointError(f"{mf}: not a modeconn path manifest (format {m.get('format')!r})")
        if m.get("format_version", 0) > FORMAT_VERSION:
            raise CheckpointError(f"{mf}: format_version {m['format_version']} is newer than this modeconn "
                                  f"({FORMAT_VERSION})")
        try:
            keys = {k: tuple(v) for k, v in m["model"]["keys"].items()}
            shards, t = list(m["shards"]), list(m["t"])
            dtypes = dict(m["model"].get("dtypes", {}))
        except (KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{mf}: manifest lacks {err}") from None
        if keys_digest(keys) != m["model"].get("digest"):
            raise CheckpointError(f"{mf}: the recorded keys/shapes do not hash to the recorded digest (edited?)")
        expected_start = 0
        for s in sorted(shards, key=lambda s: s["start"]):
            f = d / s["file"]
            if s["start"] != expected_start:
                raise CheckpointError(f"{mf}: shards leave a gap before point {s['start']}")
            expected_start += s["count"]
            if not f.is_file():
                raise CheckpointError(f"{f}: shard of points {s['start']}…{s['start'] + s['count'] - 1} is missing")
            if verify and s.get("sha256") and sha256_file(f) != s["sha256"]:
                raise CheckpointError(f"{f}: sha256 differs from {MANIFEST} (modified or corrupt)")
            try:
                with safe_open(str(f), framework="pt", device="cpu") as fh:
                    header = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}
            except Exception as err:
                raise CheckpointError(f"{f}: not a valid safetensors file (truncated or corrupt?): {err}") from None
            want = {f"{i}/{k}": v for i in range(s["start"], s["start"] + s["count"]) for k, v in keys.items()}
            if header != want:
                raise CheckpointError(f"{f}: its tensors do not match {MANIFEST} (keys/shapes of points "
                                      f"{s['start']}…{s['start'] + s['count'] - 1})")
        if expected_start != m.get("n_points", expected_start):
            raise CheckpointError(f"{mf}: shards hold {expected_start} points, manifest says {m['n_points']}")
        path = cls._from_shards(d, shards, keys, dtypes, t, m.get("method", ""), m.get("info", {}),
                                m.get("compute", {}))
        if model is not None:
            path.check_model(model, f"path directory {d}")
        return path

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self,
        model: nn.Module,
        loaders: Iterable | Mapping[str, Iterable],
        *,
        bn: str = "reset",
        bn_loader: Iterable | None = None,
        bn_batches: int | None = None,
        sub_points: int = 0,
        continuity_split: str | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        max_batches: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> PathCurve:
        """Loss/accuracy at every point, plus a continuity check and the path length.

        Args:
            model: an instance of the architecture (a private copy is loaded with each point; never mutated).
            loaders: ``{"train": loader, "test": loader}`` (or one loader, split ``"eval"``).
            bn: ``reset`` (default: BatchNorm running statistics re-estimated at *every* point, endpoints
                included, as a cumulative average over the fixed ``bn_loader`` batches — so all points are
                treated alike) or ``keep`` (the stored statistics). Models without BatchNorm ignore it.
            bn_loader, bn_batches: training batches for ``reset`` (the first ``bn_batches``; all when None).
            sub_points: ``k`` ≥ 0 points ``θ_i + j/(k+1)·(θ_{i+1} − θ_i)``, j = 1…k, evaluated (loss only) on
                ``continuity_split`` (default ``"train"`` if present, else the first split) between every
                pair of consecutive points; ``segment_peaks[i]`` is their largest loss.
            loss_fn: ``loss_fn(logits, y)`` returning the summed loss (default cross-entropy).
            max_batches: evaluate on the first batches of each split only.
            progress: ``progress(done, total)`` after each evaluated point / sub-point.

        Returns: :class:`PathCurve` (``lambdas`` = ``t``); ``info`` has method, compute and the path's info.

        Raises:
            StateDictMismatchError: another model.
            ConfigError: bad ``bn``/``sub_points``/split, missing ``bn_loader``.
        """
        if bn not in PATH_BN_POLICIES:
            raise ConfigError(f"unknown bn policy {bn!r} for Path.evaluate; valid: {', '.join(PATH_BN_POLICIES)}")
        if isinstance(sub_points, bool) or not isinstance(sub_points, int) or sub_points < 0:
            raise ConfigError(f"sub_points must be an integer ≥ 0, got {sub_points!r}")
        self.check_model(model)
        loaders = dict(loaders) if isinstance(loaders, Mapping) else {"eval": loaders}
        if not loaders:
            raise ConfigError("no evaluation loaders given")
        cont = continuity_split or ("train" if "train" in loaders else next(iter(loaders)))
        if cont not in loaders:
            raise ConfigError(f"continuity_split {cont!r} is not one of the splits {list(loaders)}")
        run = _Evaluation(self, model, loaders, bn, bn_loader, bn_batches, sub_points, cont, loss_fn, max_batches,
                          progress)
        for i in range(len(self)):
            run.step(i)
        return run.finish()

    def __repr__(self) -> str:
        where = f", dir={str(self._dir)!r}" if self._dir is not None else ""
        return f"Path(method={self.method!r}, n_points={len(self)}, grad_evals={self.compute.get('grad_evals')}{where})"


def _is_float_name(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def _check_t(t: Sequence[float] | None, n: int) -> np.ndarray:
    if t is None:
        return np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(1)
    arr = np.asarray(list(t), dtype=float)
    if arr.shape != (n,):
        raise ConfigError(f"t must have one value per point ({n}), got shape {arr.shape}")
    if not np.isfinite(arr).all() or (arr < 0).any() or (arr > 1).any() or (np.diff(arr) < 0).any():
        raise ConfigError(f"t must be non-decreasing values in [0, 1], got {arr.tolist()}")
    return arr


def linear_path(sd_a: StateDict, sd_b: StateDict, n: int = 25) -> Path:
    """The linear path ``θ(λ) = (1−λ)θ_A + λθ_B`` at ``n`` evenly spaced λ (endpoints exactly A and B).

    Floating tensors (BatchNorm statistics included) are interpolated in fp32, integer buffers come from A
    (:func:`~modeconn.path.interpolate`); the last point is ``sd_b`` itself (integer buffers included).
    No training: ``compute.grad_evals == 0``.

    Raises: ConfigError (``n`` < 2), StateDictMismatchError (different keys/shapes), DeviceMismatchError.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError(f"n must be an integer ≥ 2, got {n!r}")
    check_compatible([sd_a, sd_b], ["A", "B"])
    check_one_device([sd_a, sd_b], ["A", "B"])
    grid = np.linspace(0.0, 1.0, n)
    pts = [interpolate(sd_a, sd_b, float(lam)) for lam in grid]
    pts[-1] = dict(sd_b)  # the endpoint is B exactly, integer buffers included
    return Path(pts, grid, method="linear", info={"n": n, "reached_b": True})


class _Evaluation:
    """One :meth:`Path.evaluate` run: setup (private model copy, fixed BN batches), one step per point (the
    sub-points of the segment before it, then the point on every split), finish (the :class:`PathCurve`)."""

    def __init__(self, path: Path, model: nn.Module, loaders: dict[str, Iterable], bn: str, bn_loader,
                 bn_batches: int | None, sub_points: int, cont: str, loss_fn, max_batches: int | None, progress):
        self.path, self.loaders, self.bn, self.sub_points, self.cont = path, loaders, bn, sub_points, cont
        self.loss_fn, self.max_batches, self.progress = loss_fn, max_batches, progress
        self.net = copy.deepcopy(model)
        self.device = next(iter(self.net.parameters()), torch.empty(0)).device
        self.has_bn = bool(batchnorm_modules(self.net))
        self.reset = bn == "reset" and self.has_bn
        if self.reset and bn_loader is None:
            raise ConfigError("bn='reset' on a model with BatchNorm needs bn_loader= (training batches)")
        self.batches = fixed_batches(bn_loader, bn_batches) if self.reset else []
        self.coords = param_names(self.net)
        self.total = len(path) + (len(path) - 1) * sub_points
        self.done = 0
        self.metrics: dict[str, dict[str, list[float]]] = {s: {"loss": [], "acc": []} for s in loaders}
        self.seg_peaks: list[float] = []
        self.length, self.prev = 0.0, None

    def _load(self, sd: StateDict) -> nn.Module:
        self.net.load_state_dict({k: v.to(self.device) for k, v in sd.items()})
        if self.reset:
            reset_bn_stats(self.net, self.batches)
        return self.net

    def _tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)

    def _segment(self, i: int, p: StateDict) -> None:
        """Path length and the continuity check of the segment from point ``i − 1`` to point ``i``."""
        self.length += distance(self.prev, p, self.coords)
        if not self.sub_points:
            return
        worst = -float("inf")
        for j in range(1, self.sub_points + 1):
            frac = j / (self.sub_points + 1)
            self._load(interpolate(self.prev, p, frac))
            m = evaluate_model(self.net, self.loaders[self.cont], self.loss_fn, self.max_batches,
                               where=f"sub-point {j}/{self.sub_points} of segment {i - 1}→{i} (split {self.cont})")
            worst = max(worst, m["loss"])
            self._tick()
        self.seg_peaks.append(worst)

    def step(self, i: int) -> None:
        p = self.path[i]
        if self.prev is not None:
            self._segment(i, p)
        self._load(p)
        for split, ld in self.loaders.items():
            m = evaluate_model(self.net, ld, self.loss_fn, self.max_batches,
                               where=f"point {i} (t = {self.path.t[i]:.4g}, split {split})")
            self.metrics[split]["loss"].append(m["loss"])
            self.metrics[split]["acc"].append(m["acc"])
        self._tick()
        self.prev = p

    def finish(self) -> PathCurve:
        path = self.path
        return PathCurve(
            lambdas=np.asarray(path.t, dtype=float),
            metrics={s: {k: np.asarray(v) for k, v in d.items()} for s, d in self.metrics.items()},
            bn=self.bn,
            info={"method": path.method, "compute": dict(path.compute), "path_info": path.info,
                  "bn_batches": len(self.batches), "has_batchnorm": self.has_bn},
            length=self.length,
            sub_points=self.sub_points,
            segment_peaks=np.asarray(self.seg_peaks, dtype=float),
            continuity_split=self.cont,
        )
