"""Recipe ``align`` for modeconn language-model checkpoints: dual (LMC-DM) or one-sided learned matching.

Every option and both configs are checked before any weights are read. Under ``torchrun`` the learned matching is
data-parallel over the processes (:func:`~modeconn.match.dual.init_distributed`: NCCL and ``cuda:LOCAL_RANK`` where
CUDA is available, gloo on the CPU otherwise); only rank 0 writes ``--out``, logs and reports progress.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._util.jsonio import write_json
from ..checkpoints import Checkpoint
from ..data import make_loader
from ..errors import ConfigError
from ..experiments.lmc_dm import GROUPS
from ..experiments.output import output_directory
from ..match.dual import DualMatchingConfig
from .outcome import Outcome

Log = Callable[[str], None]

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


_LM_EXCLUDED = {"one_sided": "--method chooses it (dual or one-sided)",
                "checkpoint_every": "modeconn align keeps no learned-matching checkpoints"}
_LM_FLAGS = ("seed", "steps", "lr", "lambda_schedule", "lambda_value", "parameterization")


def align_lm(ckpts: list[Checkpoint], out: Path, plan, progress, log: Callable[[str], None]) -> Outcome:
    """Dual / one-sided learned matching (``plan.method``) of two LM checkpoints into ``out`` (a/, b/, transforms,
    alignment.json). Every option of ``align`` but ``--groups`` applies (:data:`~.align.ALIGN_SCOPES`);
    ``--restarts`` / ``--max-iter`` to the weight matching that starts the learned matching, ``--device`` to where it
    runs; ``-o`` to the method's :class:`~modeconn.match.dual.DualMatchingConfig` (all of it but ``one_sided`` and
    ``checkpoint_every``), built once here. The checkpoints' kind says how they and their data are read
    (:data:`LM_LOADERS`), checked before any weights are read."""
    from ..match.dual import init_distributed
    from .align import ALIGN_SCOPES
    from .scope import check_scope, method_config, method_options

    given, method = plan.opts, plan.method.name
    precheck, load, sources, what = LM_LOADERS[ckpts[0].kind.name]
    path = f"{method} learned matching of {what}"
    check_scope(given, set(ALIGN_SCOPES) - {"groups"}, path, ALIGN_SCOPES)
    opts = with_lm_defaults(given)
    check_lm_options(opts)
    config = method_config(plan.method, method_options(plan.method.config, given, _LM_FLAGS), given.options, path,
                           defaults={k: LM_DEFAULTS[k] for k in _LM_FLAGS}, excluded=_LM_EXCLUDED)
    state = precheck(ckpts, opts)
    info = init_distributed(given.device)
    try:
        ma, mb, bundle = load(ckpts, opts, state)
        rec = align_lm_checkpoints(ma, mb, bundle, out, config, method=method, batch_size=opts.batch_size,
                                   overwrite=opts.overwrite, shard=opts.shard, restarts=opts.restarts,
                                   max_iter=opts.max_iter, progress=progress if info.rank == 0 else None,
                                   sources=sources(ckpts),
                                   log=log if info.rank == 0 else (lambda s: None), device=info.device)
    finally:
        if info.initialized_here:
            import torch.distributed

            torch.distributed.destroy_process_group()
    procs = f" on {info.world_size} processes" if info.world_size > 1 else ""
    line = (f"{'dual' if method == 'dual' else 'one-sided learned'} matching: path loss {rec['first_loss']:.4f} → "
            f"{rec['objective']:.4f} nats of cross-entropy (means of the first and the last tenth) over "
            f"{config.steps} steps{procs} "
            f"({len(rec['spaces'])} spaces, weight-matching objective {rec['wm_objective']:.4f})")
    return Outcome(Path(out), "a/, b/, transforms.safetensors, alignment.json", (line,), "aligned endpoints",
                   quiet=info.rank != 0)


def _precheck_modeconn(ckpts: list[Checkpoint], opts) -> None:
    check_same_lm_configs([c.config for c in ckpts], [c.path for c in ckpts])


def _load_modeconn(ckpts: list[Checkpoint], opts, _state) -> tuple[nn.Module, nn.Module, Any]:
    from ..checkpoints.modeconn import dataset_for

    ma, mb = (c.load() for c in ckpts)
    return ma, mb, dataset_for(ckpts[0].config, opts.dataset, opts.data, opts.limit_train)


DUAL_TASKS = ("causal_lm", "image_classifier")
"""The Hugging Face tasks dual / one-sided matching reads (:data:`~.hf_memory.TASKS`): transformers whose
normalizations absorb into the full group — causal LMs on text, ViT / DeiT image classifiers on an image folder."""


def _precheck_hf(ckpts: list[Checkpoint], opts):
    """Causal LMs and their text (a registered text dataset or the user's corpus, tokenized with the first
    checkpoint's own tokenizer), or image classifiers and the user's image folder (the checkpoint's preprocessing);
    returned, read and checked before any weights are read."""
    from .hf_memory import check_fits_in_memory, read_data

    bundle = read_data(ckpts, "--method dual / one-sided", opts.dataset, opts.data, opts.limit_train,
                       tasks=DUAL_TASKS)
    if not opts.shard:  # sharded: each process holds its share (docs/results/dual-memory has the memory model)
        check_fits_in_memory(ckpts, "dual", "full-group streaming weight matching (--method weight --groups full)")
    return bundle


def _load_hf(ckpts: list[Checkpoint], opts, bundle) -> tuple[nn.Module, nn.Module, Any]:
    """Both models in memory (float32), wrapped as a batch of their data → logits, with the data."""
    from .hf_memory import load_wrapped

    ma, mb = load_wrapped(ckpts, bundle)
    return ma, mb, bundle


LM_LOADERS = {
    "modeconn": (_precheck_modeconn, _load_modeconn, lambda ckpts: None, "modeconn language models"),
    "huggingface": (_precheck_hf, _load_hf, lambda ckpts: tuple(c.path for c in ckpts),
                    "Hugging Face causal LMs and image classifiers"),
}
"""Checkpoint kind → (checks before any weights are read, returning what loading needs; loading of both endpoints and
the training data; the source directories whose endpoints may be written as stock checkpoints (None: absorbed
only); a label for messages)."""


def check_same_lm_configs(configs: list[dict], paths: list[Path]) -> None:
    """ConfigError naming every differing architecture / kwargs field of two checkpoint configs (before any
    weights are read)."""
    ca, cb = configs
    problems = []
    if ca.get("architecture") != cb.get("architecture"):
        problems.append(f"architecture: {ca.get('architecture')!r} vs {cb.get('architecture')!r}")
    ka, kb = ca.get("kwargs", {}) or {}, cb.get("kwargs", {}) or {}
    for k in sorted(set(ka) | set(kb)):
        va, vb = ka.get(k, "<absent>"), kb.get(k, "<absent>")
        if va != vb:
            problems.append(f"kwargs.{k}: {va!r} vs {vb!r}")
    da, db = ca.get("dataset_options"), cb.get("dataset_options")
    if da != db:
        problems.append(f"dataset_options (tokenizer/context): {da!r} vs {db!r}")
    if problems:
        raise ConfigError(f"{paths[0]} and {paths[1]} differ:\n  " + "\n  ".join(problems))


def align_lm_checkpoints(ma: nn.Module, mb: nn.Module, bundle, out: Path, config: DualMatchingConfig, *, method: str,
                         batch_size: int, overwrite: bool, progress=None, log: Log = print,
                         device: str | torch.device = "cpu", shard: bool = False, restarts: int | None = None,
                         max_iter: int | None = None, sources: tuple[Path, Path] | None = None) -> dict[str, Any]:
    """Absorb both models, bind :data:`GROUPS`, weight-match, learn the transforms (``method``: ``"dual"`` or
    ``"learned"`` = one-sided) on the training split, and write ``out/a`` and ``out/b`` (the transformed,
    absorbed endpoints, :func:`~modeconn.symmetry.save_absorbed`), ``transforms.safetensors`` (``a.<space>``
    and ``b.<space>``) and ``alignment.json``. Every saved endpoint is reloaded and checked against its
    checkpoint's logits. Returns the alignment record. ``config``: the learned matching's options (its ``seed`` also
    seeds the weight matching and the data order).

    ``device``: where the learned matching runs (absorption, weight matching and the written files stay on the
    CPU). Multi-process (a ``torch.distributed`` default group exists, e.g. under ``torchrun`` after
    :func:`~modeconn.match.dual.init_distributed`): every rank runs the same steps, the learned matching
    data-parallel (each rank its share of every batch of ``batch_size`` blocks, see
    :func:`~modeconn.match.dual_matching`); only rank 0 checks and writes ``out`` and calls ``log``, and every rank
    returns the record once the files are in place. ``shard``: sharded storage over the processes
    (:mod:`modeconn.match.sharded`). ``restarts`` / ``max_iter``: of the weight matching that gives the discrete parts
    and the start (None: :class:`~modeconn.match.WeightMatchingConfig`'s defaults). ``sources``: the two Hugging Face
    checkpoint directories the endpoints came from: an endpoint a stock model of its family can represent
    (:func:`~modeconn.symmetry.absorb_export.stock_model`: RMSNorm families) is then written as a stock checkpoint
    (``save_pretrained``, with its source's tokenizer and side files) instead of an absorbed one. Raises what
    :func:`~modeconn.match.dual_matching` raises, and
    ConfigError for a non-empty ``out`` without ``overwrite`` (rank 0, before any work)."""
    from contextlib import nullcontext

    from ..match.distributed import barrier, current_rank

    writer = current_rank() == 0
    log = log if writer else _silent
    with output_directory(out, overwrite) if writer else nullcontext() as tmp:
        t0 = time.perf_counter()
        run = learn_transforms(ma, mb, bundle, config, method=method, batch_size=batch_size, progress=progress,
                               log=log, device=device, shard=shard, restarts=restarts, max_iter=max_iter)
        checks = _write_aligned(tmp, run.result, (ma, mb), run.absorbed, run.state_dicts, bundle.train.tensors[0][:2],
                                sources) if writer else {}
        record = {**run.record(method, batch_size, shard, device),
                  "max_logit_change_after_reload": {side: c["max_abs_diff"] for side, c in checks.items()},
                  "formats": {side: c["format"] for side, c in checks.items()}, "seconds": time.perf_counter() - t0,
                  "files": {"a": "a/", "b": "b/", "transforms": "transforms.safetensors"}}
        if writer:
            write_json(tmp / "alignment.json", record, nan="null", default=str)
    barrier()
    return record


@dataclass
class LearnedRun:
    """Both endpoints absorbed (``absorbed``, their ``state_dicts``), the full-group ``spec`` (:data:`GROUPS`), the
    weight matching that started the learned matching (``wm``, with its ``wm_options``) and the learned ``result``
    (:class:`~modeconn.match.DualAlignment`: ``apply_a`` / ``apply_b``)."""

    absorbed: tuple[nn.Module, nn.Module]
    state_dicts: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]
    spec: Any
    wm: Any
    wm_options: dict[str, int]
    config: DualMatchingConfig
    result: Any

    def record(self, method: str, batch_size: int, shard: bool, device) -> dict[str, Any]:
        """What ``alignment.json`` (and a merge's record) says about the run."""
        res = self.result
        return {"method": method, "one_sided": method != "dual", "groups": GROUPS, "spaces": list(self.spec.spaces),
                "options": {**self.config.model_dump(exclude={"one_sided", "checkpoint_every"}),
                            "batch_size": batch_size, "shard": shard, "device": str(device), **self.wm_options},
                "world_size": res.stats["world_size"], "wm_objective": self.wm.objective, "objective": res.objective,
                "first_loss": _head_mean(res.history[0]) if res.history and res.history[0] else None}

    def transformed(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Both absorbed endpoints' state dicts with their learned transforms applied."""
        return self.result.apply_a(self.state_dicts[0]), self.result.apply_b(self.state_dicts[1])


def learn_transforms(ma: nn.Module, mb: nn.Module, bundle, config: DualMatchingConfig, *, method: str,
                     batch_size: int, progress=None, log: Log = print, device: str | torch.device = "cpu",
                     shard: bool = False, restarts: int | None = None, max_iter: int | None = None) -> LearnedRun:
    """Absorb both models, bind :data:`GROUPS`, weight-match, and learn the transforms (``method``: ``"dual"``, else
    one-sided) on ``bundle``'s training split (see :func:`align_lm_checkpoints` for the options)."""
    from ..match import dual_matching, one_sided_matching, weight_matching
    from ..symmetry import absorb_normalization
    from ..symmetry.hf import check_same_config, hf_symmetry_spec

    check_same_config(ma, mb)
    abs_a, abs_b = absorb_normalization(ma), absorb_normalization(mb)
    sa, sb = abs_a.state_dict(), abs_b.state_dict()
    spec = hf_symmetry_spec(abs_a, groups=GROUPS)
    wm_options = {k: v for k, v in (("restarts", restarts), ("max_iter", max_iter)) if v is not None}
    wm = weight_matching(spec, sa, sb, seed=config.seed, **wm_options)
    log(f"weight matching: objective {wm.objective:.4f} ({len(spec.spaces)} spaces)")
    loader = make_loader(bundle.train, batch_size, shuffle=True, seed=config.seed)
    fn = dual_matching if method == "dual" else one_sided_matching
    on_device = [{k: v.to(device) for k, v in sd.items()} for sd in (sa, sb)]
    res = fn(spec, abs_a, *on_device, loader, config, weight_alignment=wm, progress=progress, shard=shard)
    return LearnedRun((abs_a, abs_b), (sa, sb), spec, wm, wm_options, config, res)


def _silent(_: str) -> None:
    """The ``log`` of ranks other than 0."""


def _write_aligned(tmp: Path, res, models, absorbed, state_dicts, x: torch.Tensor,
                   sources: tuple[Path, Path] | None = None) -> dict[str, dict[str, Any]]:
    """Write the transformed endpoints ``tmp/a``, ``tmp/b`` (stock checkpoints where ``sources`` are given and the
    family can represent them, else absorbed ones) and ``tmp/transforms.safetensors``; reload each endpoint and
    compare its logits on ``x`` with its original model's (ConfigError beyond 1e-3 relative). Returns per side the
    max |Δlogit| and the format written (``"stock"`` or ``"absorbed"``)."""
    from ..io import save_state_dict
    from .hf_memory import rewrap

    checks = {}
    for i, (side, model, base, sd, apply) in enumerate(zip("ab", models, absorbed, state_dicts,
                                                           (res.apply_a, res.apply_b), strict=True)):
        m = copy.deepcopy(base)
        m.load_state_dict(apply(sd))
        fmt, reloaded = save_endpoint(m, tmp / side, sources[i] if sources is not None else None)
        with torch.no_grad():
            ref = model.eval()(x)
            got = rewrap(model, reloaded).eval()(x)
        diff = float((got - ref).abs().max())
        if diff > 1e-3 * max(1.0, float(ref.abs().max())):
            raise ConfigError(f"internal error: the saved endpoint {side} changed the function "
                              f"(max |Δlogit| = {diff:.3g})")
        checks[side] = {"max_abs_diff": diff, "format": fmt}
    flat = {f"{side}.{space}": t for side, el in res.export_transforms().items() for space, t in el.items()}
    save_state_dict(tmp / "transforms.safetensors", flat, {"modeconn": "lmc-dm transforms"})
    return checks


def save_endpoint(model: nn.Module, out: Path, source: Path | None, *, into_staging: bool = False
                  ) -> tuple[str, nn.Module]:
    """Write one transformed endpoint to ``out``: a stock checkpoint (``from_pretrained`` loads it) with ``source``'s
    side files where a stock model represents it, else an absorbed checkpoint. ``into_staging``: ``out`` is a staging
    directory modeconn made (:func:`~modeconn.experiments.output.output_directory`), written into as it is. Returns the
    format and the reloaded model."""

    from ..io.hf import copy_code_free_side_files
    from ..symmetry import load_absorbed, save_absorbed
    from ..symmetry.absorb import write_absorbed_files
    from ..symmetry.absorb_export import stock_model

    stock = stock_model(model) if source is not None else None
    if stock is None and into_staging:
        write_absorbed_files(model, out)
    elif stock is None:
        save_absorbed(model, out)
    else:
        stock.save_pretrained(out)
    copy_code_free_side_files(source, out)
    if stock is None:
        return "absorbed", load_absorbed(out).eval()
    return "stock", type(stock).from_pretrained(out, local_files_only=True, trust_remote_code=False).eval()


def _head_mean(losses) -> float:
    """The mean loss of the first 10 % of steps (at least one): the counterpart of the objective, the last 10 %'s
    mean — one step's loss at one random λ is no baseline."""
    head = losses[:max(1, len(losses) // 10)]
    return float(sum(head) / len(head))
