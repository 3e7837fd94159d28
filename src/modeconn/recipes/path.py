"""Finding and evaluating one low-loss path between two trained models (`modeconn path`).

The methods, :func:`~modeconn.path.methods.find_path` and :func:`~modeconn.path.methods.evaluate_found_path` live in
the path-method registry (:mod:`modeconn.path.methods`). :func:`run_path` (the recipe of ``modeconn path``) adds
what makes its numbers trustworthy (issue #14):

- *complete* means one thing for every method (:meth:`~modeconn.path.pathobj.PathCurve.completeness`): the
  path reaches B and every segment passes the continuity check. results.json (``complete``, ``completeness``),
  report.md and the headline say so — an incomplete path loudly, with the dense peak of its worst segment —
  and the CLI exits with :data:`INCOMPLETE_EXIT_CODE` (3) after writing everything;
- a gradient-evaluation ``budget`` every method honours, stated with its spend (``results["budget"]``), and a
  bounded, stated evaluation (``max_points`` stored LLPF points, ``eval_limit`` examples per split;
  ``results["evaluation"]``);
- *low-loss* is a second, separate verdict: the dense peak train loss is within :data:`LOW_LOSS_MARGIN` nats of
  the higher endpoint — a complete path may be continuous and still high; the linear path A → B is evaluated
  beside every other method's (``results["linear"]``, the report's table, ``path_loss.png``) as the baseline;
- one atomic output: everything is assembled in a uniquely named temporary sibling of ``out`` and swapped in
  at the end; an LLPF search runs in a modeconn-owned, locked work directory next to ``out``
  (:class:`SearchWorkDir`) that survives a kill and is resumed (fingerprint and digests checked) or discarded.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path as FsPath
from typing import Any

import torch
import torch.nn as nn

from .._util.outdir import MARKER, is_modeconn_output, output_directory, read_marker
from ..data import DatasetBundle
from ..errors import ConfigError
from ..path import Path
from ..path.methods import (
    PATH_METHODS, PathMethod, SearchContext, check_budget, check_path_options, evaluate_found_path, evaluation_size,
    path_row,
)
from ..path.pathobj import CONTINUITY_TOL, LOW_LOSS_MARGIN, PathCurve
from ..report.figures import plot_path_losses
from ..report.path_rows import rows_table
from ..experiments.output import write_json

StateDict = Mapping[str, torch.Tensor]
INCOMPLETE_EXIT_CODE = 3
"""Exit status of ``modeconn path`` when the path is incomplete (after all outputs are written)."""
LINEAR_POINTS = 11
"""Points of the linear path evaluated beside a searched one (its baseline)."""
DEFAULT_MAX_POINTS = 64
"""Default bound on the points an LLPF search stores (and so on the points evaluated)."""
WORK_SUFFIX = "modeconn-work"
WORK_LOCK = ".lock"


# ------------------------------------------------------------------------------- the search's work directory


def work_dir_for(out: str | FsPath) -> FsPath:
    """Where the in-progress state of a checkpointing search for ``out`` lives: the hidden sibling
    ``.<name>.modeconn-work`` (it never becomes part of ``out`` and ``out`` is never written while it runs)."""
    out = FsPath(out)
    return out.parent / f".{out.name}.{WORK_SUFFIX}"


def _lock(directory: FsPath) -> int | None:
    """An exclusive ``flock`` on ``directory/.lock`` (released when the process ends, however it ends); None where
    ``fcntl`` does not exist. ConfigError if another process holds it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no protection against a concurrent run
        return None
    fd = os.open(directory / WORK_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ConfigError(f"{directory} is in use by another modeconn process (a search for the same --out is "
                          "running); wait for it to finish or choose another --out") from None
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


class SearchWorkDir:
    """The persistent, modeconn-owned directory of one checkpointing search (LLPF) for ``out``
    (:func:`work_dir_for`), held under an exclusive lock while this process uses it.

    It is created atomically (marker and lock in place before it gets its name), so a second process never
    sees a half-made or unlocked one. :meth:`retire` moves it out of the way as the last step before the output
    is swapped in; :meth:`restore` puts it back if that swap fails; :meth:`remove` deletes it afterwards.
    Leftovers of killed processes (half-made or retired siblings nobody holds a lock on) are swept on open.
    """

    def __init__(self, out: FsPath, path: FsPath, fd: int | None, record: dict[str, Any]) -> None:
        self.out, self.path, self._fd, self.record = out, path, fd, record
        self._retired: FsPath | None = None

    @staticmethod
    def read_record(out: str | FsPath) -> dict[str, Any] | None:
        """The marker of ``out``'s work directory (None if there is none); ConfigError if a directory of that
        name exists but modeconn did not write it."""
        work = work_dir_for(out)
        if not os.path.lexists(work):
            return None
        record = None if work.is_symlink() else read_marker(work)  # a symlinked marker is never followed
        if record is None:
            raise ConfigError(f"{work} exists but was not written by modeconn (no {MARKER}); remove it yourself")
        return record

    @classmethod
    def open(cls, out: FsPath, method: str, *, resume: bool, overwrite: bool) -> SearchWorkDir:
        """The work directory to search in: the interrupted one (``resume``), or a new one (replacing an
        interrupted one only with ``overwrite``). ConfigError naming the flag otherwise."""
        _sweep_leftovers(out)
        work = work_dir_for(out)
        record = cls.check_flags(out, method, resume=resume, overwrite=overwrite)
        if record is not None:
            fd = _lock(work)
            if resume:
                return cls(out, work, fd, record)
            shutil.rmtree(work)  # ours (marker), unused (locked by us), and --overwrite says replace it
            _unlock(fd)
        return cls._create(out, method, overwrite)

    @classmethod
    def check_flags(cls, out: FsPath, method: str, *, resume: bool, overwrite: bool) -> dict[str, Any] | None:
        """The interrupted search's marker (None if there is none), after checking that ``resume`` /
        ``overwrite`` say what to do with it (ConfigError naming the flag otherwise). Changes nothing."""
        work = work_dir_for(out)
        record = cls.read_record(out)
        if record is None and resume:
            raise ConfigError(f"--resume (resume=True): there is no interrupted search for {out} to continue "
                              f"({work} does not exist); run without --resume to start one")
        if record is not None and resume and record.get("method") != method:
            raise ConfigError(f"{work} holds an interrupted {record.get('method')} search, not {method}: resume it "
                              f"with --method {record.get('method')}, or pass --overwrite (overwrite=True) without "
                              "--resume to discard it")
        if record is not None and not resume and not overwrite:
            raise ConfigError(f"an interrupted {record.get('method')} search for {out} is in {work}: pass --resume "
                              "(resume=True) to continue it, or --overwrite (overwrite=True) to discard it and "
                              "start again")
        return record

    @classmethod
    def _create(cls, out: FsPath, method: str, overwrite: bool) -> SearchWorkDir:
        out.parent.mkdir(parents=True, exist_ok=True)
        new = FsPath(tempfile.mkdtemp(prefix=f".{out.name}.{WORK_SUFFIX}-new-", dir=out.parent))
        record = {"tool": "modeconn", "command": "path (search work directory)", "method": method,
                  "out": str(out), "overwrite": bool(overwrite), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_json(new / MARKER, record)
        fd = _lock(new)
        try:
            os.rename(new, work_dir_for(out))
        except OSError:
            _unlock(fd)
            shutil.rmtree(new, ignore_errors=True)
            raise ConfigError(f"{work_dir_for(out)} appeared while starting (another modeconn search for {out} "
                              "started at the same time); choose another --out") from None
        return cls(out, work_dir_for(out), fd, record)

    def retire(self) -> None:
        """Move the directory out of the way (atomic rename to a hidden ``-retired-`` sibling)."""
        self._retired = self.path.with_name(f"{self.path.name}-retired-{uuid.uuid4().hex[:8]}")
        os.rename(self.path, self._retired)

    def restore(self) -> None:
        """Undo :meth:`retire` (the output could not be swapped in: the search stays resumable)."""
        if self._retired is not None and self._retired.exists() and not os.path.lexists(self.path):
            os.rename(self._retired, self.path)
            self._retired = None

    def close(self, *, remove: bool) -> None:
        """Release the lock; with ``remove``, delete the retired directory."""
        if remove and self._retired is not None:
            shutil.rmtree(self._retired, ignore_errors=True)
        _unlock(self._fd)
        self._fd = None


def _sweep_leftovers(out: FsPath) -> None:
    """Delete half-made (``-new-``) and retired (``-retired-``) work siblings of ``out`` that carry modeconn's
    marker and that no process holds locked (their process was killed)."""
    if not out.parent.is_dir():
        return
    for p in out.parent.glob(f".{glob.escape(out.name)}.{WORK_SUFFIX}-*"):
        if p.is_dir() and not p.is_symlink() and is_modeconn_output(p):
            try:
                fd = _lock(p)
            except ConfigError:
                continue  # in use
            shutil.rmtree(p, ignore_errors=True)
            _unlock(fd)


# ------------------------------------------------------------------------------------------------- the recipe


def interrupted_note(out: str | FsPath, method: str) -> str:
    """What a user is told when a ``path`` run is interrupted (Ctrl-C): how to continue a checkpointing search whose
    work directory survives, or that nothing was written."""
    work = work_dir_for(out)
    if work.is_dir():
        return (f"interrupted: the {method} search so far is kept in {work}; run the same command with --resume to "
                "continue it, or with --overwrite to discard it and start again")
    return f"interrupted: nothing was written to {out}"


def _same_point(p: StateDict, q: StateDict) -> bool:
    return p.keys() == q.keys() and all(torch.equal(p[k].detach().cpu(), q[k].detach().cpu()) for k in p)


def low_loss(results: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the path is low-loss: its dense peak train loss within :data:`LOW_LOSS_MARGIN` of the higher endpoint
    (``{"low_loss", "dense_peak", "endpoint_max", "margin"}``)."""
    peak, ends = results["summary"]["dense_peak_train_loss"], max(results["endpoint_train_loss"])
    return {"low_loss": bool(peak <= ends + LOW_LOSS_MARGIN), "dense_peak": peak, "endpoint_max": ends,
            "margin": LOW_LOSS_MARGIN}


def not_low_loss_why(results: Mapping[str, Any]) -> str:
    """Why an LLPF path is not low-loss, from its records (empty for other methods or a low-loss path): how many ticks
    ended their refinement above the target (the budget's share per tick ran out first) — or, when every tick reached
    it, that the peak lies where the refinement does not look (between stored points, or beyond its minibatch
    estimate)."""
    info, low = results.get("path_info") or {}, results["low_loss"]
    target = (info.get("threshold") or {}).get("value")
    if low["low_loss"] or target is None:
        return ""
    unreached, ticks = len(info.get("unreached_ticks", [])), info.get("ticks_done")
    if unreached:
        return (f"{unreached} of {ticks} LLPF ticks ended their refinement above the target {target:.4f} (their share "
                "of the budget ran out first): a larger --budget, or a larger refinement -o lr, lowers the path")
    return (f"every LLPF tick reached the target {target:.4f}: the peak lies between stored points or beyond the "
            "refinement's minibatch estimate (-o record_every=1, -o verify_batches=8 to check each point in the "
            "evaluation's terms, -o closing_ticks=8 for a long closing segment, -o threshold_margin= lower)")


def _linear_text(results: Mapping[str, Any]) -> str:
    lin = results.get("linear")
    return "" if lin is None else f"; the linear path's peak train loss {lin['peak_train_loss']:.4f}"


def completeness_headline(method: str, results: Mapping[str, Any]) -> str:
    """One line for the terminal: counts; whether the path is continuous (reaches B, every segment passes the
    continuity check) and, separately, low-loss (:func:`low_loss`) with the linear path's peak beside it — or,
    loudly, why the path is incomplete (with the dense peak of the worst failing segment)."""
    r, c = results["summary"], results["completeness"]
    budget = results["budget"]["requested"]
    spent = f"{r['grad_evals']} gradient evaluations" + (f" (budget {budget})" if budget is not None else "")
    counts = f"{r['points']} points, {spent}, {r['wall_time_s']:.1f} s search"
    base = f"{method}: {counts}"
    if c["complete"]:
        low = results["low_loss"]
        verdict = ("LOW-LOSS" if low["low_loss"] else "NOT low-loss") + (
            f" (dense peak {low['dense_peak']:.4f} vs endpoints {low['endpoint_max']:.4f} + {low['margin']:g})")
        why = not_low_loss_why(results)
        return (f"{base}; continuous (reaches B, every segment within {c['continuity_tol']:g} of its ends), "
                f"{verdict}: peak train loss {r['peak_train_loss']:.4f}{_linear_text(results)}"
                + (f". Why: {why}" if why else ""))
    text = f"{method}: INCOMPLETE PATH ({counts}): {'; '.join(c['reasons'])}"  # the verdict first: never wrapped
    worst = c["worst_segment"]
    if worst is not None:
        text += (f". Dense peak of the failing segment: {worst['dense_peak']:.4f} — the peak at the points "
                 f"({r['peak_train_loss']:.4f}) is not the path's peak")
    elif not c["reached_b"]:
        text += ". The numbers describe A → the last point only"
    return text


def _report(results: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    c, ev, b = results["completeness"], results["evaluation"], results["budget"]
    low = results["low_loss"]
    verdict = (f"**Continuous**: the path reaches B and every segment passes the continuity check (sub-points rise "
               f"at most {c['continuity_tol']:g} nats above the segment's ends). " + (
                   f"**Low-loss**: its dense peak train loss {low['dense_peak']:.4f} is within {low['margin']:g} "
                   f"nats of the higher endpoint ({low['endpoint_max']:.4f})." if low["low_loss"] else
                   f"**Not low-loss**: its dense peak train loss {low['dense_peak']:.4f} is more than "
                   f"{low['margin']:g} nats above the higher endpoint ({low['endpoint_max']:.4f})."
                   + (f" Why: {not_low_loss_why(results)}." if not_low_loss_why(results) else ""))
               if c["complete"] else
               "**INCOMPLETE PATH** — " + "; ".join(c["reasons"]) + (
                   f". The failing segment's dense peak is {c['worst_segment']['dense_peak']:.4f}: the peak at the "
                   "points is not the path's peak." if c["worst_segment"] else "."))
    budget = (f"Gradient evaluations: {b['used']}" + (f" of a budget of {b['requested']}." if b["requested"] is not None
                                                      else " (no budget given)."))
    size = (f"Evaluated: {ev['points']} points and {ev['sub_points_per_segment']} linear sub-points per segment "
            f"({ev['models_evaluated']} models), on {ev['examples']['train']} train and {ev['examples']['test']} "
            f"test examples (`--eval-limit`: {ev.get('eval_limit') or 'none, every example'})"
            + (f"; BatchNorm statistics recomputed at every point from {ev['bn_batches']} training "
                                 "batches." if ev["has_batchnorm"] else " (the model has no BatchNorm)."))
    baseline = ("" if len(rows) < 2 else
                f" The `linear` row is the straight line A → B ({LINEAR_POINTS} points, evaluated the same way): the "
                "baseline the path is to improve on.")
    return (f"# {results['task']}\n\n{verdict}\n\n{budget} {size}\n\n{rows_table(list(rows))}\n\n"
            "Losses are cross-entropy (nats); 'dense peak' includes the linear sub-points between consecutive points "
            f"(continuity check).{baseline}\n\n![loss along the path](path_loss.png)\n")


def _linear_baseline(model_a: nn.Module, sd_a: StateDict, sd_b: StateDict, bundle: DatasetBundle,
                     eval_limit: int | None, bn_batches: int, seed: int, progress) -> tuple[Path, PathCurve]:
    """The straight line A → B at :data:`LINEAR_POINTS` points, evaluated as a found path is (no sub-points: a
    straight line is its own interpolation)."""
    linear = PATH_METHODS.get("linear")
    ctx = SearchContext(None, None, False, None, None, {})
    path = linear.run(model_a, sd_a, sd_b, bundle.train, {"n": LINEAR_POINTS}, ctx)
    return path, evaluate_found_path(path, model_a, bundle, eval_limit=eval_limit, bn_batches=bn_batches,
                                     sub_points=0, seed=seed, progress=progress)


def _search(out: FsPath, tmp: FsPath, m: PathMethod, model_a: nn.Module, sd_a: StateDict, sd_b: StateDict,
            bundle: DatasetBundle, options: Mapping[str, Any], work: SearchWorkDir | None,
            ctx: SearchContext) -> Path:
    """Run the search (a checkpointing one inside ``work``) and put the path at ``tmp/path``."""
    if work is not None:
        ctx = replace(ctx, out_dir=work.path / "path", resume=(work.path / "path").exists())
    path = m.run(model_a, sd_a, sd_b, bundle.train, dict(options), ctx)
    path.save(tmp / "path")  # a disk-backed path is hard-linked (or copied): the work directory stays intact
    return Path.load(tmp / "path")


def run_path(out: str | FsPath, method: str, model_a: nn.Module, model_b: nn.Module, bundle: DatasetBundle,
             options: Mapping[str, Any] | None = None, *, budget: int | None = None, eval_limit: int | None = None,
             sub_points: int = 3, bn_batches: int = 20, seed: int = 0, resume: bool = False,
             overwrite: bool = False, names: tuple[str, str] = ("A", "B"), inputs: Sequence[str | FsPath] = (),
             limit_train: int | None = None, continuity_tol: float = CONTINUITY_TOL,
             max_points: int | None = DEFAULT_MAX_POINTS, log: Callable[[str], None] = print,
             progress: Callable[[int, int], None] | None = None,
             on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Find one path, evaluate it, and write ``out``: ``path/`` (safetensors shards + path.json), ``results.json``,
    ``report.md`` and ``path_loss.png`` — all assembled in a uniquely named temporary sibling that becomes ``out``
    in one atomic swap (:func:`~modeconn._util.outdir.output_directory`), so ``out`` always holds one whole run.

    A checkpointing search (LLPF) runs in ``out``'s work directory (:class:`SearchWorkDir`), which survives a
    kill: rerun with ``resume`` to continue it (same settings and data — checked), or ``overwrite`` to discard it.
    A kill at any moment leaves the previous ``out`` (or none) plus, at most, that resumable work directory.

    Args:
        budget: gradient evaluations every method honours (:class:`SearchContext`).
        eval_limit: examples per split evaluated (None: all); sub_points: continuity-check points per segment.
        inputs: the checkpoint directories of A and B (``out`` may not be, contain or lie inside them).
        limit_train: the training-set limit the data was loaded with (recorded; part of a resume's fingerprint).
        continuity_tol: tolerance of the continuity check (:meth:`PathCurve.completeness`).
        max_points: bound on the points an LLPF search stores (``record_every`` sized to it unless given).
        on_stage: called with the name and unit of each stage before its first ``progress`` call (e.g.
            ``"search (LLPF ticks)"``, ``"evaluating the path (models)"``).

    Returns: the results dict (also ``results.json``); ``results["complete"]`` says whether the path is complete
        (reaches B, every segment passes the continuity check) — the CLI exits with
        :data:`INCOMPLETE_EXIT_CODE` when it is not.

    Raises: ConfigError (bad method/option/budget/out, a conflicting or missing interrupted search),
        CheckpointError (a corrupt interrupted search), and what the method raises.
    """
    out = FsPath(out)
    options = dict(options or {})
    m = check_path_options(method, options)
    check_budget(budget)
    if resume and not m.checkpoints:
        raise ConfigError(f"--resume (resume=True): the {method} method does not checkpoint; only "
                          f"{', '.join(k for k in PATH_METHODS if PATH_METHODS.get(k).checkpoints)} searches can be resumed")
    record = SearchWorkDir.check_flags(out, method, resume=resume, overwrite=overwrite) if m.checkpoints else None
    may_replace = overwrite or bool(resume and record and record.get("overwrite"))  # the resumed run's permission
    start = time.perf_counter()
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    data_info = {"name": bundle.name, "split": "train", "limit": limit_train}
    ctx = SearchContext(budget, None, False, progress, max_points, data_info)
    stage = on_stage or (lambda name: None)
    work = None
    try:
        with output_directory(out, inputs=inputs, overwrite=may_replace, command="path") as tmp:
            work = SearchWorkDir.open(out, method, resume=resume, overwrite=overwrite) if m.checkpoints else None
            log(f"finding the {method} path ({m.summary})" + (f" with a budget of {budget} gradient evaluations"
                                                              if budget is not None else ""))
            stage(f"search ({m.progress_unit})")
            path = _search(out, tmp, m, model_a, sd_a, sd_b, bundle, options, work, ctx)
            stage("evaluating the path (models)")
            log(f"evaluating {len(path)} points (+{sub_points} sub-points per segment) on "
                f"{'all' if eval_limit is None else f'at most {eval_limit}'} examples per split")
            curve = evaluate_found_path(path, model_a, bundle, eval_limit=eval_limit, bn_batches=bn_batches,
                                        sub_points=sub_points, seed=seed, progress=progress)
            results, row = _path_results(method, names, bundle, options, budget, eval_limit, limit_train,
                                         continuity_tol, path, curve, sd_b)
            curves, rows = {method: curve}, [row]
            if method != "linear":
                log(f"evaluating the linear path ({LINEAR_POINTS} points) beside it")
                stage("evaluating the linear path (models)")
                lin_path, lin_curve = _linear_baseline(model_a, sd_a, sd_b, bundle, eval_limit, bn_batches, seed,
                                                       progress)
                lin_row = path_row("linear", lin_curve, lin_path, max(results["endpoint_train_loss"]),
                                   continuity_tol=continuity_tol, reached_b=True)
                results["linear"] = {k: lin_row[k] for k in ("peak_train_loss", "dense_peak_train_loss",
                                                             "peak_test_loss", "min_test_acc")}
                results["headline"] = completeness_headline(method, results)
                curves["linear"], rows = lin_curve, [row, lin_row]
            results["seconds"] = time.perf_counter() - start
            _write_outputs(tmp, results, rows, curves, bundle, eval_limit)
            if work is not None:
                work.retire()  # last step before the swap: afterwards no stale search sits next to the result
    except BaseException:
        if work is not None:
            work.restore()
            work.close(remove=False)
        raise
    if work is not None:
        work.close(remove=True)
    return results


def _path_results(method: str, names: tuple[str, str], bundle: DatasetBundle, options: dict[str, Any],
                  budget: int | None, eval_limit: int | None, limit_train: int | None, continuity_tol: float,
                  path: Path, curve: PathCurve, sd_b: StateDict) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(results, summary row)`` of an evaluated path (:func:`run_path`'s ``results.json``, less ``seconds``)."""
    reached = path.info.get("reached_b") is not False and _same_point(path[len(path) - 1], sd_b)
    ends = [float(curve.values("train", "loss")[0]), float(curve.values("train", "loss")[-1])]
    row = path_row(method, curve, path, max(ends), continuity_tol=continuity_tol, reached_b=reached)
    completeness = curve.completeness(continuity_tol, reached_b=reached)
    results = {
        "task": f"{method} path between {names[0]} and {names[1]} on {bundle.name}",
        "models": list(names), "method": method, "options": options,
        "complete": completeness["complete"], "completeness": completeness,
        "budget": {"requested": budget, "used": row["grad_evals"],
                   "honoured": budget is None or row["grad_evals"] <= budget},
        "evaluation": evaluation_size(curve, bundle, eval_limit),
        "dataset": {"name": bundle.name, "train": len(bundle.train), "test": len(bundle.test),
                    "limit_train": limit_train, "eval_limit": eval_limit},
        "endpoint_train_loss": ends, "summary": row, "curve": curve.to_json(), "path_info": path.info,
    }
    results["low_loss"] = low_loss(results)
    results["headline"] = completeness_headline(method, results)
    return results, row


def _write_outputs(tmp: FsPath, results: dict[str, Any], rows: Sequence[dict[str, Any]],
                   curves: Mapping[str, PathCurve], bundle: DatasetBundle, eval_limit: int | None) -> None:
    """``path_loss.png`` (the path and, beside it, the linear path), ``results.json`` and ``report.md`` into the
    run's temporary directory."""
    ex = results["evaluation"]["examples"]
    plot_path_losses(curves, tmp / "path_loss.png", title=results["task"],
                     note=f"Evaluated — train: {ex['train']} of {len(bundle.train)} examples; test: {ex['test']} of "
                          f"{len(bundle.test)} (--eval-limit {eval_limit})")
    write_json(tmp / "results.json", results)
    (tmp / "report.md").write_text(_report(results, rows))  # tmp becomes out in one swap: no per-file temp


def path(a: FsPath, b: FsPath, method: str, options: Mapping[str, Any], out: FsPath, *, dataset: str | None = None,
         data: FsPath | None = None, limit_train: int | None = None, **run: Any) -> dict[str, Any]:
    """The back-end of ``modeconn path``: the method and its options checked before anything is loaded, the pair and
    its data loaded (:func:`~modeconn.recipes.pair.load_pair_and_data`), then :func:`run_path` with ``run``
    (budget — the method's :attr:`~modeconn.path.methods.PathMethod.default_budget` when None —, eval_limit,
    sub_points, continuity_tol, seed, resume, overwrite, log, progress, on_stage). Returns its results."""
    from .pair import load_pair_and_data

    m = check_path_options(method, options)  # typos fail before anything is loaded
    if run.get("budget") is None:
        run["budget"] = m.default_budget  # a run of minutes at the defaults; the method's schedule scales to it
    ma, mb, _, bundle = load_pair_and_data(a, b, "path", dataset, data, limit_train)
    return run_path(out, method, ma, mb, bundle, options, names=(str(a), str(b)),
                    inputs=[p for p in (a, b, data) if p is not None], limit_train=limit_train, **run)
