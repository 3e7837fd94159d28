"""Hugging Face models in memory: the alignment methods that read data (activation matching, learned STE matching)
for ``align`` and ``merge --align``, barriers, paths, ``check`` and ``eval``, on the data of the model's task
(:data:`TASKS`): causal LMs on text — a registered text dataset or the user's corpus, tokenized with the checkpoint's
own tokenizer (:func:`~.pair.hf_text_data`) —, masked LMs on the same text as fixed masked blocks, sequence
classifiers on the user's labelled texts (:mod:`modeconn.data.user_encoder`), image classifiers on the user's image
folder with the checkpoint's own preprocessing; the data is read and checked before any weights.

Both models are loaded in float32 and wrapped to map a batch of the data to logits
(:class:`~modeconn.models.causal_lm.CausalLM`, :class:`~modeconn.models.encoder.MaskedLM`,
:class:`~modeconn.models.encoder.SequenceClassifier`, :class:`~modeconn.models.vit.ViTClassifier`), their permutation spec
traced through the Hugging Face adapters, and
the result written as a stock Hugging Face checkpoint (``save_pretrained``, the source's tokenizer, processor and side
files): ``from_pretrained`` loads it. The aligned B is checked to compute B's function; the merge is scored on the
held-out split (loss in nats — per token for LMs, with perplexity —, accuracy) and refused when that is NaN/Inf.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from ..checkpoints import Checkpoint
from ..errors import ConfigError
from .outcome import Outcome

Log = Callable[[str], None]


COPIES = {"align": 3, "merge": 2, "dual": 5, "barrier": 3, "path": 4, "check": 3, "eval": 1, "fuse": 3}
"""Model-sized float32 copies a command holds at its peak, per input model (align: A, B and the aligned B; merge: each
model and its aligned state dict, plus the merge; dual: each model, its absorbed copy, the transformed copy, the
learned transforms and Adam's state; barrier and path: the endpoints and the points evaluated; check: the
endpoints and B moved by an alignment; fuse: each model, its reduced copy, the fused model) — what
:func:`check_fits_in_memory` multiplies by."""
STREAMING = {"align": "streaming weight matching (--method weight)", "merge": "a streamed merge (--align weight or none)"}
"""What reads one tensor at a time instead, per command (the others evaluate the models: no streaming way)."""


def check_fits_in_memory(ckpts: list[Checkpoint], command: str, streaming: str | None, available=None) -> None:
    """ConfigError, before any weights are read, when the float32 copies ``command`` holds (:data:`COPIES`) exceed
    the memory available (``available()``: bytes, default :func:`modeconn._util.memory.available_bytes`; None: not
    checked); names the size needed and the ``streaming`` alternative, which reads one tensor at a time."""
    from .._util.memory import available_bytes, gib

    free = (available or available_bytes)()
    if free is None:
        return
    params = sum(i.nbytes // max(i.dtype.itemsize, 1) for c in ckpts for i in c.lazy().infos.values())
    need = 4 * params * COPIES[command] + (4 * params // len(ckpts) if command == "merge" else 0)
    if need > free:
        alternative = (f": {streaming} reads one tensor at a time and fits models larger than memory" if streaming
                       else "; use a machine with more memory")
        raise ConfigError(f"{command} in memory needs about {gib(need)} for these {len(ckpts)} models in float32 "
                          f"({params:,} parameters in all), and {gib(free)} is available{alternative}")


ARCHITECTURE_SUFFIXES = {"ForCausalLM": "causal_lm", "ForMaskedLM": "masked_lm",
                         "ForSequenceClassification": "sequence_classifier",
                         "ForImageClassification": "image_classifier"}
"""The end of ``config.architectures[0]`` → the task it is read in memory as (:data:`TASKS`)."""


def _task(ckpt: Checkpoint) -> str:
    """The :data:`TASKS` entry of ``config.architectures``; ConfigError for another task."""
    arch = str((ckpt.config.get("architectures") or ["?"])[0])
    for suffix, task in ARCHITECTURE_SUFFIXES.items():
        if arch.endswith(suffix):
            return task
    raise ConfigError(f"{ckpt.path} is a {arch}: modeconn reads Hugging Face causal LMs and masked LMs (with text), "
                      "sequence classifiers (with labelled text) and image classifiers (with an image folder) in "
                      "memory; other tasks are aligned by streaming weight matching (--method weight), which reads "
                      "no data")


def _image_data(ckpts: list[Checkpoint], command: str, dataset: str | None, data, limit_train: int | None):
    """The user's image folder for Hugging Face image classifiers, with the checkpoint's own preprocessing
    (``preprocessor_config.json``) and its head checked (:func:`modeconn.data.user_data_for_checkpoint`)."""
    from ..data import user_data_for_checkpoint, user_data_path

    path = user_data_path(dataset)  # DataError for a path that does not exist
    if path is None:
        raise ConfigError(f"{command} reads Hugging Face image classifiers with your image folder (one sub-folder per "
                          f"class): pass --dataset PATH (got {dataset!r})")
    cfg = ckpts[0].config
    size = cfg.get("image_size")
    shape = (int(cfg.get("num_channels", 3)), int(size), int(size)) if isinstance(size, int) else None
    return user_data_for_checkpoint(ckpts[0].path, cfg, path, input_shape=shape, limit_train=limit_train)


def _text_data(ckpts: list[Checkpoint], command: str, dataset: str | None, data, limit_train: int | None):
    from .pair import hf_text_data

    return hf_text_data(ckpts, command, dataset, data, limit_train)


def _masked_text_data(ckpts: list[Checkpoint], command: str, dataset: str | None, data, limit_train: int | None):
    """Masked-LM blocks (:mod:`modeconn.data.user_encoder`) of the user's corpus or a registered text dataset,
    tokenized with the checkpoint's own tokenizer, masked with ``--seed``."""
    import dataclasses

    from ..data import user_data_options
    from ..data.user_encoder import masked_context, masked_lm_bundle
    from ..data.user_options import current_user_data_options
    from ..data.user_text import load_checkpoint_tokenizer, max_positions
    from .pair import text_blocks

    tokenizer = load_checkpoint_tokenizer(ckpts[0].path)
    opts = current_user_data_options()
    inner = masked_context(tokenizer, max_positions(ckpts[0].config), opts.context_length)
    with user_data_options(dataclasses.replace(opts, context_length=inner)):
        blocks = text_blocks(ckpts, command, dataset, data, limit_train)
    return masked_lm_bundle(blocks, tokenizer, opts.seed)


def _labelled_text_data(ckpts: list[Checkpoint], command: str, dataset: str | None, data, limit_train: int | None):
    """The user's labelled texts (``--text-field``, ``--label-field``) for sequence classifiers, tokenized with the
    checkpoint's own tokenizer (:func:`modeconn.data.user_encoder.text_classification_bundle`)."""
    from ..data import user_data_path
    from ..data.user_encoder import text_classification_bundle
    from ..data.user_options import current_user_data_options
    from ..data.user_text import load_checkpoint_tokenizer

    path = user_data_path(dataset)  # DataError for a path that does not exist
    if path is None:
        raise ConfigError(f"{command} reads Hugging Face sequence classifiers with your labelled texts (a .jsonl, "
                          f".json, .csv, .parquet file or a saved dataset with text and label fields): pass --dataset "
                          f"PATH (got {dataset!r})")
    return text_classification_bundle(path, load_checkpoint_tokenizer(ckpts[0].path), ckpts[0].config,
                                      options=current_user_data_options(), limit_train=limit_train)


def _wrap_lm(model: nn.Module, bundle) -> nn.Module:
    from ..models.causal_lm import CausalLM

    return CausalLM.wrap(model, bundle.input_shape[0])


def _wrap_masked_lm(model: nn.Module, bundle) -> nn.Module:
    from ..models.encoder import MaskedLM

    return MaskedLM(model, bundle.input_shape[0])


def _wrap_text_classifier(model: nn.Module, bundle) -> nn.Module:
    from ..models.encoder import SequenceClassifier

    return SequenceClassifier(model, bundle.input_shape[0], bundle.pad_token_id)


def _wrap_classifier(model: nn.Module, bundle) -> nn.Module:
    from ..models.vit import ViTClassifier

    return ViTClassifier.wrap(model, tuple(bundle.input_shape))


TASKS = {"causal_lm": (_text_data, _wrap_lm, "lm"), "masked_lm": (_masked_text_data, _wrap_masked_lm, "lm"),
         "sequence_classifier": (_labelled_text_data, _wrap_text_classifier, "model"),
         "image_classifier": (_image_data, _wrap_classifier, "model")}
"""Hugging Face task → (its data, read and checked before any weights; the wrapper mapping a batch of that data to
logits; the attribute of the wrapper holding the Hugging Face model)."""


def load_models(ckpts: list[Checkpoint], command: str, dataset: str | None, data, limit_train: int | None):
    """``(wrapped models, bundle)``: the data first and the memory check (refusals before any weights), then the
    models (:func:`load_wrapped`)."""
    bundle = read_data(ckpts, command, dataset, data, limit_train)
    check_fits_in_memory(ckpts, command, STREAMING.get(command))
    return load_wrapped(ckpts, bundle), bundle


def read_data(ckpts: list[Checkpoint], command: str, dataset: str | None, data, limit_train: int | None,
              tasks: tuple[str, ...] | None = None):
    """The data of the checkpoints' task (:data:`TASKS`), read and checked before any weights; ConfigError for a
    task outside ``tasks`` (None: any), naming the tasks ``command`` reads."""
    task = _task(ckpts[0])
    if tasks is not None and task not in tasks:
        arch = (ckpts[0].config.get("architectures") or ["?"])[0]
        raise ConfigError(f"{command} reads Hugging Face {' and '.join(t.replace('_', ' ') + 's' for t in tasks)}; "
                          f"{ckpts[0].path} is a {arch}")
    return TASKS[task][0](ckpts, command, dataset, data, limit_train)


def rewrap(wrapped: nn.Module, model: nn.Module) -> nn.Module:
    """A copy of the :data:`TASKS` wrapper ``wrapped`` holding the Hugging Face ``model`` instead of its own (e.g. an
    endpoint reloaded from disk, fed the same batches)."""
    other = copy.copy(wrapped)
    other._modules = dict(wrapped._modules)
    attr = next(attr for _, _, attr in TASKS.values() if attr in wrapped._modules)
    other._modules[attr] = model
    return other


def load_wrapped(ckpts: list[Checkpoint], bundle, same_config: bool = True) -> list[nn.Module]:
    """Every model in float32, checked to share one config (unless not ``same_config``: models of one family at other
    widths) and, for LMs, to take the ids of the tokenizer that made ``bundle``; each wrapped to map a batch of
    ``bundle`` to logits."""
    from ..symmetry import check_same_config
    from .pair import check_vocabulary

    task = _task(ckpts[0])
    models = [c.load().float() for c in ckpts]
    for m in models[1:] if same_config else ():
        check_same_config(models[0], m)
    if task in ("causal_lm", "masked_lm"):
        for ckpt, m in zip(ckpts, models, strict=True):
            check_vocabulary(ckpt, m, bundle)
    return [TASKS[task][1](m, bundle) for m in models]


def hf_model(wrapped: nn.Module) -> nn.Module:
    """The Hugging Face model a :data:`TASKS` wrapper holds."""
    return next(getattr(wrapped, attr) for _, _, attr in TASKS.values() if hasattr(wrapped, attr))


def save_wrapped(tmp: Path, wrapped: nn.Module, source: Path, records: dict[str, Any]) -> None:
    """``wrapped``'s Hugging Face model as a stock checkpoint in ``tmp`` with ``source``'s side files (tokenizer,
    generation config; never its Python files or ``auto_map``) and the JSON ``records``."""
    from .._util.jsonio import write_json
    from ..io.hf import copy_code_free_side_files

    hf_model(wrapped).save_pretrained(tmp)
    copy_code_free_side_files(source, tmp)
    for name, payload in records.items():
        write_json(tmp / name, payload, nan="null", default=str)


def align_in_memory(ckpts: list[Checkpoint], out: Path, plan, log: Log, progress=None) -> Outcome:
    """Align B to A by ``plan.method`` (a method that reads data, with its resolved config ``plan.config``; it reports
    to ``progress``) and write the aligned B as a Hugging Face checkpoint with ``alignment.json``."""
    from ..diagnostics.compare import align as run_align
    from ..experiments.output import output_directory
    from ..symmetry import symmetry_spec
    from .align import check_same_function, given_options

    opts, method = plan.opts, plan.method.name
    (ma, mb), bundle = load_models(ckpts, "align", opts.dataset, opts.data, opts.limit_train)
    x0 = bundle.train.tensors[0][:2]
    spec = symmetry_spec(ma, x0)
    log(f"{plan.method.display}: {len(spec.spaces)} spaces, {len(bundle.train)} training blocks")
    res = run_align(method, spec, ma, ma.state_dict(), mb.state_dict(), bundle, config=plan.config, progress=progress)
    aligned = copy.deepcopy(mb)
    aligned.load_state_dict(res.apply(mb.state_dict()))
    check_same_function(mb, aligned, x0)
    record = {**res.to_json(), "options": given_options(plan.config), "dataset": bundle.name}
    with output_directory(out, opts.overwrite, inputs=[c.path for c in ckpts], command="align") as tmp:
        save_wrapped(tmp, aligned, ckpts[1].path, {"alignment.json": record})
    line = f"{method} matching objective {res.objective:.4f} ({len(spec.spaces)} spaces)"
    return Outcome(Path(out), "config.json, model.safetensors, tokenizer files, alignment.json", (line,),
                   "aligned checkpoint")


def merge_in_memory(ckpts: list[Checkpoint], out: Path, plan, log: Log, progress=None) -> Outcome:
    """Align every model to the first by ``plan.align`` (a method that reads data), merge by the plan's rule and
    weights, score the merge on the held-out split, and write it as a Hugging Face checkpoint with ``merge.json``."""
    from ..experiments.output import output_directory
    from ..path import merge
    from ..symmetry import symmetry_spec
    from .merge_modeconn import aligned_state_dicts, merge_record

    opts = plan.opts
    models, bundle = load_models(ckpts, "merge", opts.dataset, opts.data, opts.limit_train)
    spec = symmetry_spec(models[0], bundle.train.tensors[0][:2])
    sds = aligned_state_dicts(plan, spec, models, bundle, log, progress)
    log(f"merging {len(sds)} models ({plan.rule.name})")
    merged = merge(sds, plan.weights, spec=spec, normalize=False, rule=plan.rule, settings=plan.settings)
    result = copy.deepcopy(models[0])
    result.load_state_dict(merged)
    test, line = score_merged(result, bundle)
    record = {**merge_record(plan, bundle.name), "test": test}
    with output_directory(out, opts.overwrite, inputs=[c.path for c in ckpts], command="merge") as tmp:
        save_wrapped(tmp, result, ckpts[0].path, {"merge.json": record})
    return Outcome(Path(out), "config.json, model.safetensors, tokenizer files, merge.json", (line,),
                   "merged checkpoint")


def score_merged(wrapped: nn.Module, bundle) -> tuple[dict[str, float], str]:
    """A merged model's held-out scores (loss in nats — per token for language models, with perplexity —, accuracy;
    NonFiniteError for NaN/Inf) and the line that reports them."""
    from ..data import make_loader
    from ..path import evaluate_model

    test = evaluate_model(wrapped, make_loader(bundle.test, 8), where="merged model, split 'test'")
    if hasattr(wrapped, "lm"):
        test["perplexity"] = math.exp(test["loss"])
    scores = f"perplexity {test['perplexity']:.4g}" if "perplexity" in test else f"accuracy {100 * test['acc']:.2f}%"
    return test, f"merged model: {bundle.name} test loss {test['loss']:.4f} nats, {scores}"


def check_text_given(dataset: str | None, option: str, method: str, streaming: str) -> None:
    """ConfigError, before anything is read, for a method that reads text on Hugging Face checkpoints without
    ``--dataset``; names the streaming alternative that reads none."""
    if dataset is None:
        raise ConfigError(f"{option} {method} on Hugging Face checkpoints reads text: pass --dataset (a text dataset "
                          f"such as austen, or the path of your corpus); {streaming} without data")


def check_no_dtype(plan) -> None:
    """ConfigError for ``--dtype`` on a merge in memory (written in float32, as scored)."""
    if plan.dtype is not None or plan.out_dtype is not None:
        raise ConfigError("--dtype / dtype apply to streamed Hugging Face merges (--align weight or none); a merge "
                          "aligned in memory is written in float32, as it was scored")
