"""Recipe ``merge``: align every model to the first, take the weighted average, write it — for every checkpoint kind.

* modeconn checkpoints: in memory, BatchNorm statistics reset / interpolated / REPAIRed, evaluated on the test split
  (:func:`modeconn.experiments.merge.run_merge`).
* Hugging Face directories: streamed shard by shard in the first model's layout, no data read
  (:func:`modeconn.stream.merge_hf_checkpoints`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._util.outdir import check_output_target
from ..checkpoints import Checkpoint, open_checkpoints
from ..errors import ConfigError
from .align import check_single_process, no_streaming_options
from .outcome import Outcome

Log = Callable[[str], None]


@dataclass(frozen=True)
class MergeOptions:
    """The options of ``modeconn merge`` (see its ``--help``); ``weights`` as given (strings or numbers)."""

    weights: Sequence[str | float] | None = None
    normalize: bool = True
    rule: str = "linear"
    align: str = "weight"
    bn: str = "reset"
    dataset: str | None = None
    data: Path | None = None
    limit_train: int | None = None
    seed: int = 0
    restarts: int | None = None
    max_iter: int | None = None
    overwrite: bool = False


def merge(models: Sequence[Path], out: Path, opts: MergeOptions = MergeOptions(), *, progress=None,
          log: Log = print, note: Log = print) -> Outcome:
    """Merge checkpoint directories ``models`` (the first is the reference) into ``out``.

    ``note`` is told when the weights were normalised. Raises ConfigError / CheckpointError for a bad option, weight,
    output target or checkpoint, before any work; NonFiniteError (nothing written) for a merged model that computes
    NaN/Inf."""
    from ..path.interpolate import merge_weights, weights_sum_to_one

    check_output_target(out, inputs=[p for p in (*models, opts.data) if p is not None], overwrite=opts.overwrite)
    weights = None
    if opts.weights is not None:
        weights = merge_weights(opts.weights, len(models), normalize=opts.normalize, option="--weights")
        if opts.normalize and not weights_sum_to_one([float(w) for w in opts.weights]):
            note(f"--weights {','.join(map(str, opts.weights))} normalised to sum 1: "
                 f"{','.join(f'{w:g}' for w in weights)} (--no-normalize uses them as given)")
    _check_options(opts)
    ckpts = open_checkpoints(models)
    handler = _BY_KIND.get(ckpts[0].kind.name)
    if handler is None:
        raise ConfigError(f"merge reads {', '.join(_BY_KIND)} checkpoints; {ckpts[0].describe()} is not one")
    return handler(ckpts, Path(out), opts, weights, progress, log)


def _check_options(opts: MergeOptions) -> None:
    """Typos in --align, --bn or --rule fail before any checkpoint is opened."""
    from ..experiments.merge import ALIGN_CHOICES
    from ..path.batchnorm import check_bn_policy
    from ..path.merge_rules import MERGE_RULES

    if opts.align not in ALIGN_CHOICES:
        raise ConfigError(f"unknown --align {opts.align!r}; valid: {', '.join(ALIGN_CHOICES)}")
    check_bn_policy(opts.bn)
    MERGE_RULES.get(opts.rule)


def _merge_modeconn(ckpts: list[Checkpoint], out: Path, opts: MergeOptions, weights, progress, log: Log) -> Outcome:
    from ..experiments.merge import run_merge

    no_streaming_options(opts)
    path, metrics = run_merge([c.path for c in ckpts], out, weights=weights, align_method=opts.align, bn=opts.bn,
                              dataset=opts.dataset, data=opts.data, limit_train=opts.limit_train, seed=opts.seed,
                              overwrite=opts.overwrite, normalize=opts.normalize, rule=opts.rule, log=log)
    lines = (f"merged model: test acc {100 * metrics['test']['acc']:.2f}%, test loss {metrics['test']['loss']:.4f}",
             ) if metrics else ()
    return Outcome(path, "config.json, model.safetensors, metrics.json", lines, "merged checkpoint")


def _merge_hf(ckpts: list[Checkpoint], out: Path, opts: MergeOptions, weights, progress, log: Log) -> Outcome:
    from ..stream import merge_hf_checkpoints

    check_single_process()
    if opts.bn == "repair" or opts.dataset is not None or opts.data is not None or opts.limit_train is not None:
        raise ConfigError("Hugging Face checkpoints are merged without data: --bn repair, --dataset, --data and "
                          "--limit-train do not apply (transformer LMs have no BatchNorm statistics to reset)")
    rec = merge_hf_checkpoints([c.path for c in ckpts], out, weights=weights, align=opts.align, seed=opts.seed,
                               restarts=opts.restarts or 4, max_iter=opts.max_iter or 100, overwrite=opts.overwrite,
                               progress=progress, normalize=opts.normalize, rule=opts.rule)
    lines = tuple(f"{r['model']}: streaming weight matching objective {r['objective']:.4f}" for r in rec["alignments"])
    return Outcome(Path(out), "config.json, safetensors shards and index as the first model, merge.json", lines,
                   "merged checkpoint")


_BY_KIND = {"modeconn": _merge_modeconn, "huggingface": _merge_hf}
