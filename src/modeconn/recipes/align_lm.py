"""Recipe ``align`` for modeconn language-model checkpoints: dual (LMC-DM) or one-sided learned matching.

Every option and both configs are checked before any weights are read. Under ``torchrun`` the learned matching is
data-parallel over the processes (:func:`~modeconn.match.dual.init_distributed`: NCCL and ``cuda:LOCAL_RANK`` where
CUDA is available, gloo on the CPU otherwise); only rank 0 writes ``--out``, logs and reports progress.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..checkpoints import Checkpoint
from ..errors import ConfigError
from .outcome import Outcome

LM_DEFAULTS = {"seed": 0, "steps": 200, "lr": 0.01, "lambda_schedule": "uniform", "lambda_value": 0.5,
               "parameterization": "cayley", "batch_size": 16}
"""The learned-matching options of ``align`` not given on the command line take these values."""


def with_lm_defaults(opts):
    """``opts`` with every learned-matching option not given (None) set to :data:`LM_DEFAULTS`."""
    return replace(opts, **{k: v for k, v in LM_DEFAULTS.items() if getattr(opts, k) is None})


def check_lm_options(opts) -> None:
    """ConfigError naming the first invalid learned-matching option (before any work); ``opts`` with its defaults
    filled in (:func:`with_lm_defaults`)."""
    from ..match.dual import LAMBDA_SCHEDULES, launched_world_size
    from ..match.parametrize import get_parameterization

    if opts.lambda_schedule not in LAMBDA_SCHEDULES:
        raise ConfigError(f"--lambda-schedule must be one of {', '.join(LAMBDA_SCHEDULES)} "
                          f"(got {opts.lambda_schedule!r})")
    if not 0.0 <= opts.lambda_value <= 1.0:
        raise ConfigError(f"--lambda-value must lie in [0, 1] (got {opts.lambda_value}); λ is the weight of B on the "
                          "path")
    if not opts.lr > 0:
        raise ConfigError(f"--lr must be > 0 (got {opts.lr})")
    get_parameterization(opts.parameterization)  # ConfigError naming the choices
    world = launched_world_size()
    if opts.batch_size < world:
        raise ConfigError(f"--batch-size {opts.batch_size} is smaller than the number of processes ({world}): every "
                          "process needs a share of each batch; raise --batch-size or start fewer processes")


def align_lm(ckpts: list[Checkpoint], out: Path, opts, method: str, progress, log: Callable[[str], None]) -> Outcome:
    """Dual / one-sided learned matching of two LM checkpoints into ``out`` (a/, b/, transforms, alignment.json).
    Every option of ``align`` but ``--groups`` applies (:data:`~.align.ALIGN_SCOPES`); ``--restarts`` /
    ``--max-iter`` to the weight matching that starts the learned matching, ``--device`` to where it runs."""
    from ..experiments.lmc_dm import align_lm_checkpoints, check_same_lm_configs
    from ..match.dual import init_distributed
    from .align import ALIGN_SCOPES, dataset_for
    from .scope import check_scope

    check_scope(opts, set(ALIGN_SCOPES) - {"groups"}, f"{method} learned matching of modeconn language models",
                ALIGN_SCOPES)
    opts = with_lm_defaults(opts)
    check_lm_options(opts)
    check_same_lm_configs([c.config for c in ckpts], [c.path for c in ckpts])
    info = init_distributed(opts.device)
    try:
        ma, mb = (c.load() for c in ckpts)
        bundle = dataset_for(ckpts[0].config, opts.dataset, opts.data, opts.limit_train)
        rec = align_lm_checkpoints(ma, mb, bundle, out, method=method, steps=opts.steps, lr=opts.lr,
                                   lambda_schedule=opts.lambda_schedule, lambda_value=opts.lambda_value,
                                   parameterization=opts.parameterization, batch_size=opts.batch_size,
                                   seed=opts.seed, overwrite=opts.overwrite, shard=opts.shard,
                                   restarts=opts.restarts, max_iter=opts.max_iter,
                                   progress=progress if info.rank == 0 else None,
                                   log=log if info.rank == 0 else (lambda s: None), device=info.device)
    finally:
        if info.initialized_here:
            import torch.distributed

            torch.distributed.destroy_process_group()
    procs = f" on {info.world_size} processes" if info.world_size > 1 else ""
    line = (f"{'dual' if method == 'dual' else 'one-sided learned'} matching: path loss {rec['first_loss']:.4f} → "
            f"{rec['objective']:.4f} nats/token over {opts.steps} steps{procs} ({len(rec['spaces'])} spaces, "
            f"weight-matching objective {rec['wm_objective']:.4f})")
    return Outcome(Path(out), "a/, b/, transforms.safetensors, alignment.json", (line,), "aligned endpoints",
                   quiet=info.rank != 0)
