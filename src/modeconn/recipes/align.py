"""Recipe ``align``: align B to A and write the result, for every checkpoint kind.

* modeconn checkpoints, vision models: weight / activation / learned (STE) matching in memory; the aligned B is
  checked to compute B's function and saved as a checkpoint with ``alignment.json``.
* modeconn language-model checkpoints: dual (LMC-DM) or one-sided learned matching after normalization absorption
  (:func:`modeconn.recipes.align_lm.align_lm_checkpoints`), data-parallel under ``torchrun``.
* Hugging Face directories: streaming weight matching (:func:`modeconn.recipes.hf_stream.align_hf_checkpoints`).

Every option given is used by the path taken or refused naming it (:data:`ALIGN_SCOPES`, :mod:`.scope`); the
in-memory methods get the options that are fields of their config class (:mod:`modeconn.match.methods`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .._util.device import resolve_device
from .._util.outdir import check_output_target
from ..checkpoints import CHECKPOINT_KINDS, Checkpoint, kinds_supporting, open_checkpoints
from ..errors import ConfigError, ModeconnError
from ..match.methods import command_line_methods
from .outcome import Outcome
from .scope import check_scope, method_options

Log = Callable[[str], None]
IN_MEMORY = command_line_methods()
LANGUAGE_MODEL = command_line_methods(continuous=True)


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
    from ..match.methods import ALIGNMENT_METHODS

    check_output_target(out, inputs=[p for p in (a, b, opts.data) if p is not None], overwrite=opts.overwrite)
    ALIGNMENT_METHODS.get(opts.method)  # a typo names the valid methods
    resolve_device(opts.device, "--device")  # an accelerator this machine lacks fails here, before any work
    ckpts = open_checkpoints([a, b])
    handler = ckpts[0].kind.operation("align")
    if handler is None:
        raise ConfigError(f"align reads {', '.join(kinds_supporting('align'))} checkpoints; {ckpts[0].describe()} "
                          "is not one")
    return handler(ckpts, Path(out), opts, progress, log, note)


# ------------------------------------------------------------------------------------------- Hugging Face


def _align_hf(ckpts: list[Checkpoint], out: Path, opts: AlignOptions, progress, log: Log, note: Log) -> Outcome:
    check_single_process()
    if opts.method != "weight":
        raise ConfigError(f"Hugging Face checkpoint directories are aligned by streaming weight matching only "
                          f"(--method weight, got {opts.method!r}): activation, learned and dual matching need both "
                          "models in memory and data")
    check_scope(opts, ("seed", "restarts", "max_iter", "groups", "device"),
                "streaming weight matching of Hugging Face checkpoint directories (it reads no data)", ALIGN_SCOPES)
    if opts.groups not in _HF_GROUPS:
        raise ConfigError(f"unknown --groups {opts.groups!r}; valid: {', '.join(_HF_GROUPS)}")
    from . import hf_stream
    from ..match.weight import DEFAULTS

    name, what = _HF_GROUPS[opts.groups]
    res = getattr(hf_stream, name)(ckpts[0].path, ckpts[1].path, out, seed=opts.seed or 0,
                                   restarts=opts.restarts or DEFAULTS.restarts, max_iter=opts.max_iter or DEFAULTS.max_iter,
                                   overwrite=opts.overwrite, progress=progress, device=opts.device)
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


def _align_modeconn(ckpts: list[Checkpoint], out: Path, opts: AlignOptions, progress, log: Log,
                    note: Log) -> Outcome:
    from ..models import TOKEN_MODELS

    is_lm = any(c.config.get("architecture") in TOKEN_MODELS for c in ckpts)
    method = opts.method
    if is_lm and method == "learned":  # one name, one algorithm: learned is STE matching; on LMs it meant one-sided
        note("deprecated: --method learned on language models is one-sided learned matching; use --method one-sided")
        method = "one-sided"
    if method in LANGUAGE_MODEL:
        if not is_lm:
            raise ConfigError(f"--method {method} needs language-model checkpoints (architecture gpt-neox-tiny); "
                              f"{ckpts[0].path} is {ckpts[0].config.get('architecture')!r}: use weight, activation "
                              "or learned")
        from .align_lm import align_lm

        return align_lm(ckpts, out, opts, method, progress, log)
    if method not in IN_MEMORY:
        raise ConfigError(f"--method {method} is not offered here; choose one of {', '.join(IN_MEMORY + LANGUAGE_MODEL)}")
    overrides = _in_memory_options(opts, method)
    return _align_in_memory(ckpts, out, opts, method, overrides)


_METHOD_OPTIONS = ("seed", "steps", "lr", "lambda_schedule", "lambda_value", "restarts", "max_iter", "device")
"""The ``align`` options an in-memory method takes where its config class has the field of that name."""


def _in_memory_options(opts: AlignOptions, method: str) -> dict:
    """The options given that ``method`` takes (fields of its config class), after refusing every other option given
    (:func:`~.scope.check_scope`) — before any weights are read."""
    from ..match.methods import ALIGNMENT_METHODS

    entry = ALIGNMENT_METHODS.get(method)
    used = [n for n in _METHOD_OPTIONS if n in entry.config.model_fields] + list(_DATA_OPTIONS if entry.needs_data else ())
    check_scope(opts, used, f"{entry.display} of modeconn checkpoints (--method {method})", ALIGN_SCOPES)
    return method_options(entry.config, opts, _METHOD_OPTIONS)


def dataset_for(config: dict, dataset: str | None, data: Path | None, limit_train: int | None):
    """The dataset named by ``dataset`` or recorded in the checkpoint's config (ConfigError if neither, or if its
    examples do not have the shape the model was built for — checked before anything is traced); a ``dataset`` that is
    a path is the user's image folder (:func:`modeconn.data.user_data_for_checkpoint`)."""
    from ..data import load_dataset, user_data_for_checkpoint, user_data_path

    from ..io.models import check_input_shape

    if (path := user_data_path(dataset or config.get("dataset"))) is not None:  # named, or recorded by train
        return user_data_for_checkpoint(None, config, path, input_shape=config.get("kwargs", {}).get("in_shape"),
                                        limit_train=limit_train)
    name = dataset or config.get("dataset")
    if name is None:
        raise ConfigError("the checkpoint does not record its dataset; pass --dataset")
    bundle = load_dataset(name, data, limit_train=limit_train, **config.get("dataset_options", {}))
    recorded = f" (trained on {config['dataset']!r})" if config.get("dataset") else ""
    check_input_shape(config.get("kwargs", {}).get("in_shape"), bundle.input_shape, f"the checkpoint{recorded}",
                      f"dataset {name!r}")
    return bundle


def _align_in_memory(ckpts: list[Checkpoint], out: Path, opts: AlignOptions, method: str, overrides: dict) -> Outcome:
    from ..io.models import example_input, load_same_architecture
    from ..diagnostics.compare import align as run_align
    from ..io import save_checkpoint
    from ..symmetry import symmetry_spec

    (ma, mb), (cfg, _) = load_same_architecture([c.path for c in ckpts])
    bundle = dataset_for(cfg, opts.dataset, opts.data, opts.limit_train) if method != "weight" else None
    x0 = bundle.train.tensors[0][:2] if bundle is not None else example_input(cfg)
    spec = symmetry_spec(ma, x0)
    res = run_align(method, spec, ma, ma.state_dict(), mb.state_dict(), bundle, overrides=overrides)
    mb_aligned = copy.deepcopy(mb)
    mb_aligned.load_state_dict(res.apply(mb.state_dict()))
    _check_same_function(mb, mb_aligned, x0)
    kept = {k: v for k, v in cfg.items() if k not in ("architecture", "kwargs", "modeconn_version", "format_version")}
    from ..io.hf import model_names

    path = save_checkpoint(out, mb_aligned, config=kept | {"aligned_to": model_names([ckpts[0].path])[0],
                                                           "alignment": method},
                           metrics={"alignment": {"method": method, "objective": res.objective, "stats": res.stats}},
                           extra_json={"alignment.json": {**res.to_json(), "options": overrides}},
                           overwrite=opts.overwrite,
                           inputs=[c.path for c in ckpts], command="align")
    line = f"{method} matching objective {res.objective:.4f} ({len(spec.spaces)} spaces)"
    return Outcome(path, "config.json, model.safetensors, alignment.json", (line,), "aligned checkpoint")


def _check_same_function(m1, m2, x) -> None:
    with torch.no_grad():
        y1, y2 = m1.eval()(x), m2.eval()(x)
    if not torch.allclose(y1, y2, atol=1e-4, rtol=1e-4):
        raise ModeconnError(f"internal error: alignment changed the function (max |Δlogit| = {(y1 - y2).abs().max():.3g})")


CHECKPOINT_KINDS["modeconn"].supports("align", _align_modeconn)
CHECKPOINT_KINDS["huggingface"].supports("align", _align_hf)
