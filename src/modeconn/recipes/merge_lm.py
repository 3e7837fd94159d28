"""``modeconn merge A B --align dual|one-sided``: transformers merged after learned matching (LMC-DM).

Both Hugging Face causal LMs (with their text: a registered text dataset or the user's corpus, tokenized with A's own
tokenizer) or ViT / DeiT image classifiers (with the user's image folder; :data:`~.align_lm.LM_LOADERS`) are absorbed,
the full group bound, weight-matched and the continuous transforms learned on the training split, exactly as ``align
--method dual|one-sided`` does (:func:`~.align_lm.learn_transforms`). The two transformed endpoints are merged by the
rule and weights in the absorbed space, scored on the held-out split (loss in nats — per token, with perplexity, for
LMs —, accuracy; :func:`~.hf_memory.score_merged`) — a NaN/Inf score is an error and nothing is written — and the merge
is written as ``align`` writes an endpoint: a stock checkpoint of the family where a stock model represents it
(RMSNorm families, with A's tokenizer and side files), else an absorbed checkpoint
(:func:`modeconn.symmetry.load_absorbed`; ``barrier`` and ``eval`` read it). ``merge.json`` records the format.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from ..checkpoints import Checkpoint
from ..errors import ConfigError
from .outcome import Outcome

Log = Callable[[str], None]


def merge_lm(ckpts: list[Checkpoint], out: Path, plan, progress, log: Log) -> Outcome:
    """Merge two language-model checkpoints after ``plan.align`` (dual or one-sided learned matching, its config
    ``plan.align_config``) into ``out``; ConfigError before any weights are read for more than two models, a kind
    without a language-model loader, or ``--dtype``."""
    from .._util.jsonio import write_json
    from ..experiments.output import output_directory
    from ..path import merge
    from .align_lm import LM_DEFAULTS, LM_LOADERS, learn_transforms, save_endpoint
    from .hf_memory import score_merged
    from .merge_modeconn import merge_record

    method = plan.align.name
    if len(ckpts) != 2:
        raise ConfigError(f"--align {method} merges two models (learned matching pairs A with B); got "
                          f"{len(ckpts)}")
    if ckpts[0].kind.name != "huggingface":
        raise ConfigError(f"--align {method} merges Hugging Face causal LMs and ViT image classifiers; {ckpts[0].path} "
                          f"is a {ckpts[0].kind.label} checkpoint (modeconn's language models: align --method {method}, then "
                          "evaluate the endpoints a/ and b/ it writes)")
    if plan.dtype is not None or plan.out_dtype is not None:
        raise ConfigError(f"--dtype / dtype apply to streamed merges; --align {method} writes the merge in float32, "
                          "as it was scored")
    precheck, load, sources, _ = LM_LOADERS[ckpts[0].kind.name]
    opts = plan.opts
    data = SimpleNamespace(dataset=opts.dataset, data=opts.data, limit_train=opts.limit_train, shard=False)
    ma, mb, bundle = load(ckpts, data, precheck(ckpts, data))
    batch_size = LM_DEFAULTS["batch_size"]
    run = learn_transforms(ma, mb, bundle, plan.align_config, method=method, batch_size=batch_size,
                           progress=progress, log=log, restarts=opts.restarts, max_iter=opts.max_iter)
    log(f"merging the two transformed endpoints ({plan.rule.name})")
    merged_sd = merge(list(run.transformed()), plan.weights, spec=run.spec, normalize=False, rule=plan.rule,
                      settings=plan.settings)
    merged = copy.deepcopy(run.absorbed[0])
    merged.load_state_dict(merged_sd)
    test, scored = score_merged(merged, bundle)
    source = (sources(ckpts) or (None,))[0]
    with output_directory(out, opts.overwrite, inputs=[c.path for c in ckpts], command="merge") as tmp:
        fmt, _ = save_endpoint(merged, tmp, source, into_staging=True)
        record = {**merge_record(plan, bundle.name), "test": test, "format": fmt,
                  "alignment": run.record(method, batch_size, False, "cpu")}
        write_json(tmp / "merge.json", record, nan="null", default=str)
    line = f"{method} matching objective {run.result.objective:.4f}; {scored} ({fmt} checkpoint)"
    return Outcome(Path(out), f"the merged model ({fmt} checkpoint), merge.json", (line,), "merged checkpoint")

