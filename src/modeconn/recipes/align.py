"""Recipe ``align``: align B to A and write the result, for every checkpoint kind.

* modeconn checkpoints, vision models: weight / activation / learned (STE) matching in memory; the aligned B is
  checked to compute B's function and saved as a checkpoint with ``alignment.json``.
* modeconn language-model checkpoints: dual (LMC-DM) or one-sided learned matching after normalization absorption
  (:func:`modeconn.recipes.align_lm.align_lm_checkpoints`), data-parallel under ``torchrun``.
* Hugging Face directories: streaming weight matching (:func:`modeconn.recipes.hf_stream.align_hf_checkpoints`);
  causal LMs also dual / one-sided learned matching in memory (:mod:`modeconn.recipes.align_lm`).
* Other kinds loaded in memory (timm, torchvision …): the in-memory methods through the kind's hooks.

Every option given is used by the path taken or refused naming it (:data:`ALIGN_SCOPES`, :mod:`.scope`). The
options are resolved once into an :class:`AlignPlan` — the method's registry entry, ``torch.device`` and the method's
config object (its :class:`~modeconn.config.StrictConfig`, from the dedicated flags and the generic ``-o key=value``
options, :func:`~.scope.method_config`) — and the objects are passed down. The methods offered are read from
:data:`~modeconn.match.methods.ALIGNMENT_METHODS` when asked (:data:`IN_MEMORY`, :data:`LANGUAGE_MODEL`), so a method
registered later is offered too.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .._util.device import resolve_device
from .._util.outdir import check_output_target
from ..checkpoints import CHECKPOINT_KINDS, Checkpoint, open_checkpoints, refuse_kind, register_in_memory
from ..errors import ConfigError, ModeconnError
from ..match.methods import ALIGNMENT_METHODS, AlignmentMethod, command_line_methods
from .outcome import Outcome
from .scope import IN_MEMORY_EXCLUDED, check_scope, method_config, method_options

Log = Callable[[str], None]
_OFFERED = {"IN_MEMORY": {}, "LANGUAGE_MODEL": {"continuous": True}}


def __getattr__(name: str) -> tuple[str, ...]:
    """``IN_MEMORY`` (the methods of modeconn vision checkpoints) and ``LANGUAGE_MODEL`` (those that need language
    models), read from the registry when asked: a method registered after import is offered."""
    if name in _OFFERED:
        return command_line_methods(**_OFFERED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class AlignOptions:
    """The options of ``modeconn align`` (see its ``--help``); the defaults are the command line's. ``None`` (and
    ``False``) mean "not given": the path taken uses its own default, and a path that does not use an option refuses
    it when given (:data:`ALIGN_SCOPES`)."""

    method: str = "weight"
    dataset: str | None = None
    data: Path | None = None
    download: bool = False
    limit_train: int | None = None
    seed: int | None = None
    steps: int | None = None
    lr: float | None = None
    lambda_schedule: str | None = None
    lambda_value: float | None = None
    parameterization: str | None = None
    batch_size: int | None = None
    restarts: int | None = None
    max_iter: int | None = None
    groups: str = "permutation"
    overwrite: bool = False
    device: str | None = None
    shard: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    """The method's further options (``-o key=value``): fields of its config class (:func:`~.scope.method_config`)."""


@dataclass(frozen=True)
class AlignPlan:
    """One ``align`` run's options resolved once: ``method`` (the registry entry of the method run), ``device``, and
    ``config`` (the method's validated config object, set once by the path taken: which options apply depends on the
    checkpoints' kind)."""

    opts: AlignOptions
    method: AlignmentMethod
    device: torch.device | None
    config: Any = None


_DATA = "the methods that read data (--method activation, learned, dual, one-sided)"
_LEARNED = "learned matching (--method learned, dual, one-sided)"
_LM = "dual / one-sided learned matching of modeconn language-model checkpoints"
_WM = "weight matching (--method weight, and the weight-matching start of dual / one-sided)"
ALIGN_SCOPES = {
    "dataset": _DATA, "data": _DATA, "download": _DATA, "limit_train": _DATA,
    "steps": _LEARNED, "lr": _LEARNED, "lambda_schedule": _LEARNED, "lambda_value": _LEARNED,
    "parameterization": _LM, "batch_size": _LM, "shard": _LM + " (storage sharded over torchrun's processes)",
    "restarts": _WM, "max_iter": _WM,
    "groups": ("weight matching of Hugging Face checkpoint directories (modeconn language-model checkpoints get the "
               "full group from --method dual / one-sided)"),
    "device": "weight matching and dual / one-sided matching",
}
"""Every ``align`` option that some path does not use → where it applies (the other options apply everywhere)."""
_DATA_OPTIONS = ("dataset", "data", "download", "limit_train")


def align(a: Path, b: Path, out: Path, opts: AlignOptions = AlignOptions(), *, progress=None, log: Log = print,
          note: Log = print) -> Outcome:
    """Align checkpoint ``b`` to ``a`` and write the result to ``out`` (kind by kind, see the module docstring).

    ``progress(stage, done, total, **metrics)``; ``note`` gets warnings meant for the user (deprecations).
    Raises ConfigError / CheckpointError for a bad option, method, output target or checkpoint, before any work."""
    check_output_target(out, inputs=[p for p in (a, b, opts.data) if p is not None], overwrite=opts.overwrite)
    # a typo names the valid methods; an accelerator this machine lacks fails here, before any work
    plan = AlignPlan(opts, ALIGNMENT_METHODS.get(opts.method), resolve_device(opts.device, "--device"))
    ckpts = open_checkpoints([a, b])
    handler = ckpts[0].kind.operation("align")
    if handler is None:
        raise refuse_kind("align", "align", ckpts[0])
    return handler(ckpts, Path(out), plan, progress, log, note)


# ------------------------------------------------------------------------------------------- Hugging Face


def _align_hf(ckpts: list[Checkpoint], out: Path, plan: AlignPlan, progress, log: Log, note: Log) -> Outcome:
    opts = plan.opts
    if plan.method.needs_continuous:  # dual / one-sided: both causal LMs in memory, absorbed, with text data
        from .align_lm import align_lm

        return align_lm(ckpts, out, plan, progress, log)
    if plan.method.needs_data:  # activation / learned matching: both causal LMs in memory, with text data
        from .hf_memory import align_in_memory, check_text_given

        check_text_given(opts.dataset, "--method", opts.method, "streaming weight matching (--method weight) aligns")
        return align_in_memory(ckpts, out, replace(plan, config=_in_memory_config(plan, ckpts[0].kind.label)), log,
                               progress)
    check_single_process()
    if not plan.method.streams:
        raise ConfigError(f"Hugging Face checkpoint directories are aligned by streaming weight matching (--method "
                          f"weight), by activation / learned matching or by dual / one-sided learned matching of "
                          f"causal LMs in memory (got {opts.method!r})")
    path = "streaming weight matching of Hugging Face checkpoint directories (it reads no data)"
    check_scope(opts, ("seed", "restarts", "max_iter", "groups", "device"), path, ALIGN_SCOPES)
    if opts.groups not in _HF_GROUPS:
        raise ConfigError(f"unknown --groups {opts.groups!r}; valid: {', '.join(_HF_GROUPS)}")
    from . import hf_stream

    config = method_config(plan.method, method_options(plan.method.config, opts, _METHOD_OPTIONS), opts.options, path)
    name, what = _HF_GROUPS[opts.groups]
    res = getattr(hf_stream, name)(ckpts[0].path, ckpts[1].path, out, config, overwrite=opts.overwrite,
                                   progress=progress)
    line = (f"streaming weight matching objective {res.objective:.4f} (upper bound {res.stats['upper_bound']:.4f}; "
            f"{len(res.element)} spaces, {res.stats['seconds']:.1f} s)")
    return Outcome(out, what, (line,), "aligned checkpoint")


_HF_GROUPS = {
    "permutation": ("align_hf_checkpoints", "config.json, safetensors shards and index as B, alignment.json"),
    "full": ("align_hf_full_group", "a/ (A absorbed) and b/ (B absorbed and aligned): absorbed checkpoints "
                                    "(modeconn.symmetry.load_absorbed), alignment.json"),
}
"""``--groups`` on Hugging Face directories → (streaming run, what it writes)."""


def check_single_process() -> None:
    """ConfigError under torchrun: streaming runs in one process (every rank would write --out)."""
    from ..match.dual import launched_world_size

    if launched_world_size() > 1:
        raise ConfigError("streaming align/merge of Hugging Face checkpoints runs in one process; launch it without "
                          "torchrun (multi-process runs are for --method dual / one-sided)")


# ------------------------------------------------------------------------------------------------ modeconn


def _align_modeconn(ckpts: list[Checkpoint], out: Path, plan: AlignPlan, progress, log: Log,
                    note: Log) -> Outcome:
    from ..models import TOKEN_MODELS

    is_lm = any(c.config.get("architecture") in TOKEN_MODELS for c in ckpts)
    method, offered = plan.method.name, command_line_methods()
    if is_lm and method == "learned":  # one name, one algorithm: learned is STE matching; on LMs it meant one-sided
        note("deprecated: --method learned on language models is one-sided learned matching; use --method one-sided")
        method = "one-sided"
    if method in command_line_methods(continuous=True):
        if not is_lm:
            raise ConfigError(f"--method {method} needs language-model checkpoints (architecture gpt-neox-tiny); "
                              f"{ckpts[0].path} is {ckpts[0].config.get('architecture')!r}: use weight, activation "
                              "or learned")
        from .align_lm import align_lm

        return align_lm(ckpts, out, replace(plan, method=ALIGNMENT_METHODS.get(method)), progress, log)
    if method not in offered:
        raise ConfigError(f"--method {method} is not offered here; choose one of "
                          f"{', '.join(offered + command_line_methods(continuous=True))}")
    return _align_in_memory(ckpts, out, replace(plan, config=_in_memory_config(plan, ckpts[0].kind.label)), progress)


_METHOD_OPTIONS = ("seed", "steps", "lr", "lambda_schedule", "lambda_value", "restarts", "max_iter", "device")
"""The ``align`` options an in-memory method takes where its config class has the field of that name."""


def _in_memory_config(plan: AlignPlan, kind_label: str = "modeconn"):
    """The method's config object from the options given that it takes (fields of its config class, by flag or
    ``-o``), after refusing every other option given (:func:`~.scope.check_scope`) — before any weights are read."""
    opts, entry = plan.opts, plan.method
    used = [n for n in _METHOD_OPTIONS if n in entry.config.model_fields] + list(_DATA_OPTIONS if entry.needs_data else ())
    path = f"{entry.display} of {kind_label} checkpoints (--method {entry.name})"
    check_scope(opts, used, path, ALIGN_SCOPES)
    return method_config(entry, method_options(entry.config, opts, _METHOD_OPTIONS), opts.options, path,
                         excluded=IN_MEMORY_EXCLUDED)


def _align_kind(ckpts: list[Checkpoint], out: Path, plan: AlignPlan, progress, log: Log, note: Log) -> Outcome:
    """``align`` on a kind loaded in memory that has no ``align`` of its own: the in-memory methods."""
    offered = command_line_methods()
    if plan.method.name not in offered:
        raise ConfigError(f"--method {plan.method.name} is not offered for {ckpts[0].kind.label} checkpoints; choose "
                          f"one of {', '.join(offered)} ({', '.join(command_line_methods(continuous=True))}: "
                          "language models)")
    return _align_in_memory(ckpts, out, replace(plan, config=_in_memory_config(plan, ckpts[0].kind.label)), progress)


def _align_in_memory(ckpts: list[Checkpoint], out: Path, plan: AlignPlan, progress=None) -> Outcome:
    """Align B to A in memory through the kind's hooks (load, feed, example input, save): the aligned B is checked to
    compute B's function and written as a checkpoint of the same kind with ``alignment.json``; ``progress``: the
    method's (:mod:`modeconn.match.progress`)."""
    from ..checkpoints import load_same_architecture
    from ..diagnostics.compare import align as run_align
    from ..io.hf import model_names
    from ..symmetry import symmetry_spec

    opts, method = plan.opts, plan.method.name
    ma, mb = load_same_architecture(ckpts)
    bundle = ckpts[0].feed(opts.dataset, opts.data, opts.limit_train) if plan.method.needs_data else None
    x0 = bundle.train.tensors[0][:2] if bundle is not None else ckpts[0].example_input()
    spec = symmetry_spec(ma, x0)
    res = run_align(method, spec, ma, ma.state_dict(), mb.state_dict(), bundle, config=plan.config, progress=progress)
    mb_aligned = copy.deepcopy(mb)
    mb_aligned.load_state_dict(res.apply(mb.state_dict()))
    check_same_function(mb, mb_aligned, x0)
    path = ckpts[1].save(out, mb_aligned, config={"aligned_to": model_names([ckpts[0].path])[0], "alignment": method},
                         keep_source=True,
                         metrics={"alignment": {"method": method, "objective": res.objective, "stats": res.stats}},
                         extra_json={"alignment.json": {**res.to_json(), "options": given_options(plan.config)}},
                         overwrite=opts.overwrite, inputs=[c.path for c in ckpts], command="align")
    line = f"{method} matching objective {res.objective:.4f} ({len(spec.spaces)} spaces)"
    return Outcome(path, "config.json, model.safetensors, alignment.json", (line,), "aligned checkpoint")


def given_options(config) -> dict[str, Any]:
    """The config fields set by an option (flag or ``-o``), for the record."""
    return config.model_dump(mode="json", exclude_unset=True)


def check_same_function(m1, m2, x) -> None:
    with torch.no_grad():
        y1, y2 = m1.eval()(x), m2.eval()(x)
    if not torch.allclose(y1, y2, atol=1e-4, rtol=1e-4):
        raise ModeconnError(f"internal error: alignment changed the function (max |Δlogit| = {(y1 - y2).abs().max():.3g})")


CHECKPOINT_KINDS["modeconn"].supports("align", _align_modeconn)
CHECKPOINT_KINDS["huggingface"].supports("align", _align_hf)
register_in_memory("align", _align_kind)
