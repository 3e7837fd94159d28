"""Recipe ``align``: align B to A and write the result, for every checkpoint kind.

* modeconn checkpoints, vision models: weight / activation / learned (STE) matching in memory; the aligned B is
  checked to compute B's function and saved as a checkpoint with ``alignment.json``.
* modeconn language-model checkpoints: dual (LMC-DM) or one-sided learned matching after normalization absorption
  (:func:`modeconn.experiments.lmc_dm.align_lm_checkpoints`), data-parallel under ``torchrun``.
* Hugging Face directories: streaming weight matching (:func:`modeconn.stream.align_hf_checkpoints`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .._util.device import resolve_device
from .._util.outdir import check_output_target
from ..checkpoints import Checkpoint, open_checkpoints
from ..errors import ConfigError, ModeconnError
from .outcome import Outcome

Log = Callable[[str], None]
IN_MEMORY = ("weight", "activation", "learned")
LANGUAGE_MODEL = ("dual", "one-sided")


@dataclass(frozen=True)
class AlignOptions:
    """The options of ``modeconn align`` (see its ``--help``); the defaults are the command line's."""

    method: str = "weight"
    dataset: str | None = None
    data: Path | None = None
    limit_train: int | None = None
    seed: int = 0
    steps: int = 200
    lr: float = 0.01
    lambda_schedule: str = "uniform"
    lambda_value: float = 0.5
    parameterization: str = "cayley"
    batch_size: int = 16
    restarts: int | None = None
    max_iter: int | None = None
    groups: str = "permutation"
    overwrite: bool = False
    device: str | None = None
    shard: bool = False


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
    handler = _BY_KIND.get(ckpts[0].kind.name)
    if handler is None:
        raise ConfigError(f"align reads {', '.join(_BY_KIND)} checkpoints; {ckpts[0].describe()} is not one")
    return handler(ckpts, Path(out), opts, progress, log, note)


# ------------------------------------------------------------------------------------------- Hugging Face


def _align_hf(ckpts: list[Checkpoint], out: Path, opts: AlignOptions, progress, log: Log, note: Log) -> Outcome:
    check_single_process()
    if opts.method != "weight":
        raise ConfigError(f"Hugging Face checkpoint directories are aligned by streaming weight matching only "
                          f"(--method weight, got {opts.method!r}): activation, learned and dual matching need both "
                          "models in memory and data")
    if opts.dataset is not None:
        raise ConfigError("--dataset does not apply: weight matching of Hugging Face checkpoints reads no data")
    if opts.groups not in _HF_GROUPS:
        raise ConfigError(f"unknown --groups {opts.groups!r}; valid: {', '.join(_HF_GROUPS)}")
    from .. import stream
    from ..match.weight import DEFAULTS

    name, what = _HF_GROUPS[opts.groups]
    res = getattr(stream, name)(ckpts[0].path, ckpts[1].path, out, seed=opts.seed,
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


def no_streaming_options(opts) -> None:
    if getattr(opts, "groups", "permutation") != "permutation":
        raise ConfigError("--groups full applies to Hugging Face checkpoint directories (streaming absorption and "
                          "weight matching); language models in modeconn checkpoints: --method dual / one-sided")
    if opts.restarts is not None or opts.max_iter is not None:
        raise ConfigError("--restarts / --max-iter apply to Hugging Face checkpoint directories (streaming weight "
                          "matching) only")


# ------------------------------------------------------------------------------------------------ modeconn


def _align_modeconn(ckpts: list[Checkpoint], out: Path, opts: AlignOptions, progress, log: Log,
                    note: Log) -> Outcome:
    from ..models import TOKEN_MODELS

    no_streaming_options(opts)
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
    return _align_in_memory(ckpts, out, opts, method)


def dataset_for(config: dict, dataset: str | None, data: Path | None, limit_train: int | None):
    """The dataset named by ``dataset`` or recorded in the checkpoint's config (ConfigError if neither, or if its
    examples do not have the shape the model was built for — checked before anything is traced)."""
    from ..data import load_dataset

    from ..experiments.checkpoints import check_input_shape

    name = dataset or config.get("dataset")
    if name is None:
        raise ConfigError("the checkpoint does not record its dataset; pass --dataset")
    bundle = load_dataset(name, data, limit_train=limit_train, **config.get("dataset_options", {}))
    recorded = f" (trained on {config['dataset']!r})" if config.get("dataset") else ""
    check_input_shape(config.get("kwargs", {}).get("in_shape"), bundle.input_shape, f"the checkpoint{recorded}",
                      f"dataset {name!r}")
    return bundle


def _align_in_memory(ckpts: list[Checkpoint], out: Path, opts: AlignOptions, method: str) -> Outcome:
    from ..experiments.checkpoints import example_input, load_same_architecture
    from ..experiments.compare import align as run_align
    from ..io import save_checkpoint
    from ..symmetry import symmetry_spec

    (ma, mb), (cfg, _) = load_same_architecture([c.path for c in ckpts])
    bundle = dataset_for(cfg, opts.dataset, opts.data, opts.limit_train) if method != "weight" else None
    x0 = bundle.train.tensors[0][:2] if bundle is not None else example_input(cfg)
    spec = symmetry_spec(ma, x0)
    res = run_align(method, spec, ma, ma.state_dict(), mb.state_dict(), bundle, seed=opts.seed, device=opts.device)
    mb_aligned = copy.deepcopy(mb)
    mb_aligned.load_state_dict(res.apply(mb.state_dict()))
    _check_same_function(mb, mb_aligned, x0)
    kept = {k: v for k, v in cfg.items() if k not in ("architecture", "kwargs", "modeconn_version", "format_version")}
    path = save_checkpoint(out, mb_aligned, config=kept | {"aligned_to": str(ckpts[0].path), "alignment": method},
                           metrics={"alignment": {"method": method, "objective": res.objective, "stats": res.stats}},
                           extra_json={"alignment.json": res.to_json()}, overwrite=opts.overwrite,
                           inputs=[c.path for c in ckpts], command="align")
    line = f"{method} matching objective {res.objective:.4f} ({len(spec.spaces)} spaces)"
    return Outcome(path, "config.json, model.safetensors, alignment.json", (line,), "aligned checkpoint")


def _check_same_function(m1, m2, x) -> None:
    with torch.no_grad():
        y1, y2 = m1.eval()(x), m2.eval()(x)
    if not torch.allclose(y1, y2, atol=1e-4, rtol=1e-4):
        raise ModeconnError(f"internal error: alignment changed the function (max |Δlogit| = {(y1 - y2).abs().max():.3g})")


_BY_KIND = {"modeconn": _align_modeconn, "huggingface": _align_hf}
