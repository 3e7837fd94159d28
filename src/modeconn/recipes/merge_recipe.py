"""Merge recipes: mergekit's YAML schema (a subset) plus an ``align:`` section, and what a merge writes beside its
output (the recipe it ran, a model card).

Supported subset of mergekit's ``MergeConfiguration`` (anything else is refused, naming the key)::

    merge_method: ties                      # any rule of `modeconn merge --rule` (mergekit's names)
    base_model: org/base                    # optional; added to the inputs when not listed (as mergekit does)
    models:                                 # two or more; `model:` a directory, a Hugging Face cache entry
      - model: ./a                          #   (models--ORG--NAME) or a hub id ORG/NAME[@REV] found in the
        parameters: {weight: 0.6, density: 0.5}   #   local Hugging Face cache
      - model: ./b
    parameters: {density: [{filter: mlp, value: 0.3}, {value: 0.5}], normalize: true}   # scalars, filter lists,
                                            #   gradients: t: [0, 0.5, 1] (anchors spread over the layers)
    dtype: float32                          # inputs cast to it before the rule
    out_dtype: bfloat16                     # dtype written
    tokenizer_source: union                 # union, base or a model; or a `tokenizer:` section; `chat_template`
                                            #   (modeconn.recipes.merge_tokenizer; without them the base's, else
                                            #   the first model's, tokenizer files are copied)
    seed: 0                                 # modeconn's: seeds a randomised rule (DARE, DELLA) and the alignment
    align:                                  # modeconn's: not part of mergekit's schema
      method: weight                        # weight (streaming weight matching) or none
      groups: permutation                   # symmetry groups of the alignment
      reference: ./a                        # the model the others are aligned to (its layout is written)
      restarts: 3                           # weight matching's restarts and sweeps per run (--restarts, --max-iter)
      max_iter: 100
      seed: 0                               # the alignment's seed where it differs from `seed`

Relative model paths are taken relative to the recipe's directory (else the working directory). A parameter (``weight``
included, shared or per model, or a filter entry's value) may be a gradient: a list of values spread evenly over the
layers, interpolated at each layer as ``mergekit-yaml`` does (:mod:`modeconn.path.merge_layers`; embeddings, final
norm and LM head take the first value); gradients need Hugging Face checkpoints merged without data.

Instead of ``models``, ``slices`` stack layer ranges (:mod:`modeconn.recipes.hf_slices`)::

    merge_method: passthrough               # or any rule: each output slice merges its sources layer by layer
    slices:
      - sources: [{model: ./a, layer_range: [0, 3]}]                     # layers 0, 1, 2 of a
        parameters: {scale: 1.0}                                          # optional; base_model: optional
      - sources: [{model: ./b, layer_range: [1, 4], parameters: {scale: [1, 0.5]}}]

A gradient restarts in every slice; the output's layers are renumbered and its config gets the new layer count.
``modules``, a slice's ``residual_weight``, and tokenizer keys together with ``slices`` are refused, naming the key.

The recipe a merge writes beside its output (:data:`RECIPE_NAME`, :func:`recipe_text`) records everything a re-run
needs — the seed, the alignment's settings, the weights as applied — and names each model so that it resolves from
the recipe's own directory (a path relative to it, or a hub id for a Hugging Face cache snapshot): ``modeconn merge
--config OUT/merge_recipe.yml --out OTHER`` writes the same tensors.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..path.merge_layers import OutputSlice, SliceSource
from . import merge_tokenizer
from .merge_tokenizer import TokenizerRecipe, parse_tokenizer

KEYS = ("merge_method", "base_model", "models", "parameters", "dtype", "out_dtype", *merge_tokenizer.KEYS, "seed",
        "align")
SLICE_KEYS = ("slices",)
REFUSED = {"modules": "per-module merges of multi-module (e.g. vision-language) architectures are not supported; "
                      "merge a decoder with 'models' or 'slices'"}
ALIGN_KEYS = ("method", "groups", "reference", "restarts", "max_iter", "seed")
DTYPES = ("float32", "float16", "bfloat16", "float64")
RECIPE_NAME, CARD_NAME = "merge_recipe.yml", "README.md"


@dataclass
class Recipe:
    """A parsed recipe: ``models`` (paths, the alignment reference first), ``refs`` (as written), ``rule``, ``base``
    (index or None), ``weights`` (per model, None where not given), ``params`` (shared), ``model_params``,
    ``dtype`` / ``out_dtype`` (names or None), ``align`` and ``groups``; ``seed`` (the run's), ``align_seed``,
    ``restarts`` and ``max_iter`` (the alignment's; None where the recipe gives none); ``tokenizer``: the tokenizer
    keys (:class:`~.merge_tokenizer.TokenizerRecipe`, models by index; None where the recipe has none); ``slices``:
    the output slices (model indices into ``models``; empty for a recipe with ``models``)."""

    models: list[Path]
    refs: list[str]
    rule: str
    base: int | None = None
    weights: list[float | None] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    model_params: list[dict[str, Any]] = field(default_factory=list)
    dtype: str | None = None
    out_dtype: str | None = None
    align: str = "weight"
    groups: Any = "permutation"
    seed: int | None = None
    align_seed: int | None = None
    restarts: int | None = None
    max_iter: int | None = None
    tokenizer: TokenizerRecipe | None = None
    slices: list[OutputSlice] = field(default_factory=list)


def load_recipe(file: Path) -> Recipe:
    """Parse and check ``file`` (see the module docstring); ConfigError naming the file and key at fault, before any
    checkpoint is read (model references are resolved to existing directories)."""
    raw = _read(file)
    refused = next((k for k in raw if k in REFUSED), None)
    if refused is not None:
        raise ConfigError(f"{file}: key {refused!r}: {REFUSED[refused]}")
    unknown = [k for k in raw if k not in KEYS + SLICE_KEYS]
    if unknown:
        raise ConfigError(f"{file}: key {unknown[0]!r} is not supported; supported keys: {', '.join(KEYS + SLICE_KEYS)}")
    if not isinstance(raw.get("merge_method"), str):
        raise ConfigError(f"{file}: 'merge_method' (a rule name such as linear, ties, slerp) is required")
    if ("models" in raw) == ("slices" in raw):
        raise ConfigError(f"{file}: give exactly one of 'models' (whole models merged layer by layer) and 'slices' "
                          "(layer ranges stacked)")
    sliced = "slices" in raw
    refs, per_model, slices = _slices(raw["slices"], file) if sliced else _models(raw.get("models"), file)
    base = raw.get("base_model")
    if base is not None and base not in refs:
        refs.append(_check_str(base, "base_model", file))
        per_model.append({})
    align = _align_section(raw.get("align"), file)
    order = _reference_first(refs, align.get("reference"), file)
    refs, per_model = [refs[i] for i in order], [per_model[i] for i in order]
    shared = _params(raw.get("parameters"), "parameters", file)
    weights = [None] * len(refs) if sliced else _weights(per_model, shared, file)
    slices = [_indexed(sl, refs, base) for sl in slices]
    tokenizer = parse_tokenizer(raw, refs, file)
    if sliced and tokenizer is not None:
        raise ConfigError(f"{file}: tokenizer keys ({', '.join(k for k in merge_tokenizer.KEYS if k in raw)}) with "
                          "'slices' are not supported: a sliced merge writes the first slice's tokenizer files")
    return Recipe(models=[resolve_model_ref(r, file) for r in refs], refs=refs, rule=raw["merge_method"],
                  base=None if base is None else refs.index(base),
                  weights=weights, params=shared,
                  model_params=per_model, dtype=_dtype(raw, "dtype", file), out_dtype=_dtype(raw, "out_dtype", file),
                  align=align.get("method", "weight"), groups=align.get("groups", "permutation"),
                  seed=_int(raw, "seed", file, 0), align_seed=_int(align, "seed", file, 0, "align."),
                  restarts=_int(align, "restarts", file, 1, "align."), max_iter=_int(align, "max_iter", file, 1, "align."),
                  tokenizer=tokenizer, slices=slices)


def _read(file: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(Path(file).read_text())
    except OSError as err:
        raise ConfigError(f"--config {file}: cannot read the recipe: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {file}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {file}: a recipe is a YAML mapping (merge_method, models, ...)")
    return raw


def _check_str(value: Any, where: str, file: Path) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{file}: {where} must be a model path or hub id (a string), got {value!r}")
    return value


def _models(entries: Any, file: Path) -> tuple[list[str], list[dict[str, Any]], list]:
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{file}: 'models' must be a list of {{model: ..., parameters: ...}} entries")
    refs = [_model_ref(e, i, file) for i, e in enumerate(entries)]
    return refs, [_params(e.get("parameters"), f"models[{i}].parameters", file) for i, e in enumerate(entries)], []


SLICE_REFUSED = {"residual_weight": "mergekit 0.1.5 reads it but never applies it; remove it"}


def _slices(entries: Any, file: Path) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """The models the slices name (in order of appearance), no per-model parameters, and each slice with its
    sources' models as references (:func:`_indexed` turns them into indices)."""
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{file}: 'slices' must be a list of {{sources: [{{model, layer_range}}, ...]}} entries")
    out = []
    for i, sl in enumerate(entries):
        where = f"slices[{i}]"
        if not isinstance(sl, dict) or not isinstance(sl.get("sources"), list) or not sl["sources"]:
            raise ConfigError(f"{file}: {where} must be a mapping with 'sources' (a list of {{model, layer_range}})")
        bad = next((k for k in sl if k not in ("sources", "parameters", "base_model")), None)
        if bad is not None:
            why = SLICE_REFUSED.get(bad, "a slice takes sources, parameters and base_model")
            raise ConfigError(f"{file}: {where}.{bad}: {why}")
        sources = [_source(src, f"{where}.sources[{j}]", file) for j, src in enumerate(sl["sources"])]
        depths = {hi - lo for _, (lo, hi), _ in sources}
        if len(depths) > 1:
            raise ConfigError(f"{file}: {where}: every source must give as many layers (layer_range), got "
                              f"{[list(r) for _, r, _ in sources]}")
        models = [m for m, _, _ in sources]
        if len(set(models)) < len(models):
            raise ConfigError(f"{file}: {where}: a model appears twice among the sources (mergekit keys a slice's "
                              "inputs by model)")
        base = sl.get("base_model")
        out.append({"sources": sources, "params": _params(sl.get("parameters"), f"{where}.parameters", file),
                    "base": None if base is None else _check_str(base, f"{where}.base_model", file)})
    refs = list(dict.fromkeys([m for sl in out for m, _, _ in sl["sources"]] + [sl["base"] for sl in out
                                                                               if sl["base"] is not None]))
    return refs, [{} for _ in refs], out


def _source(src: Any, where: str, file: Path) -> tuple[str, tuple[int, int], dict[str, Any]]:
    if not isinstance(src, dict) or "model" not in src or "layer_range" not in src:
        raise ConfigError(f"{file}: {where} must be a mapping with 'model' and 'layer_range' (and optional "
                          "'parameters')")
    bad = next((k for k in src if k not in ("model", "layer_range", "parameters")), None)
    if bad is not None:
        raise ConfigError(f"{file}: {where}.{bad} is not supported (a source takes model, layer_range, parameters)")
    rng = src["layer_range"]
    if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                            for x in rng) and 0 <= rng[0] <= rng[1]):
        raise ConfigError(f"{file}: {where}.layer_range must be [first, end) layer numbers, 0 ≤ first ≤ end, got "
                          f"{rng!r}")
    return (_check_str(src["model"], f"{where}.model", file), (rng[0], rng[1]),
            _params(src.get("parameters"), f"{where}.parameters", file))


def _indexed(sl: dict[str, Any], refs: list[str], base: str | None) -> OutputSlice:
    """A parsed slice with model indices into ``refs``; its base the slice's own, else the recipe's ``base``."""
    own = sl["base"] if sl["base"] is not None else base
    return OutputSlice(tuple(SliceSource(refs.index(m), r, p) for m, r, p in sl["sources"]), sl["params"],
                       None if own is None else refs.index(own))


def _model_ref(entry: Any, i: int, file: Path) -> str:
    if not isinstance(entry, dict) or "model" not in entry:
        raise ConfigError(f"{file}: models[{i}] must be a mapping with 'model' (and optional 'parameters')")
    extra = [k for k in entry if k not in ("model", "parameters")]
    if extra:
        raise ConfigError(f"{file}: models[{i}].{extra[0]} is not supported (only model and parameters)")
    return _check_str(entry["model"], f"models[{i}].model", file)


def _params(raw: Any, where: str, file: Path) -> dict[str, Any]:
    """Scalars, gradients (lists of scalars across layers) or mergekit's filter lists ``[{filter, value}, …]`` whose
    values are scalars or gradients."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: {where} must be a mapping of parameter names to values")
    for name, value in raw.items():
        if not _setting(value):
            raise ConfigError(f"{file}: {where}.{name}: {value!r} is not a scalar, a gradient (a list of values across "
                              "layers) or a list of {filter: ..., value: ...}")
    return dict(raw)


def _scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str))


def _gradient(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_scalar(v) for v in value)


def _setting(value: Any) -> bool:
    if _scalar(value) or _gradient(value):
        return True
    return isinstance(value, list) and bool(value) and all(
        isinstance(e, dict) and set(e) <= {"filter", "value"} and "value" in e
        and (e.get("filter") is None or isinstance(e["filter"], str)) and (_scalar(e["value"]) or _gradient(e["value"]))
        for e in value)


def _weights(per_model: list[dict[str, Any]], shared: dict[str, Any], file: Path) -> list[float | None]:
    """Each model's ``weight`` (its own, else the shared one), removed from the parameter maps, where every weight
    given is a number; where one is a gradient or a filter list the weights stay parameter settings (resolved per
    tensor) and none is returned."""
    given = [p["weight"] for p in (*per_model, shared) if "weight" in p]
    if any(not _scalar(w) for w in given):
        return [None] * len(per_model)
    for i, w in enumerate(given):
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise ConfigError(f"{file}: parameters.weight must be a number, got {w!r}")
    default = shared.pop("weight", None)
    return [None if (w := own.pop("weight", default)) is None else float(w) for own in per_model]


def _dtype(raw: dict[str, Any], key: str, file: Path) -> str | None:
    value = raw.get(key)
    if value is not None and value not in DTYPES:
        raise ConfigError(f"{file}: {key} {value!r}; valid: {', '.join(DTYPES)}")
    return value


def _int(raw: dict[str, Any], key: str, file: Path, least: int, prefix: str = "") -> int | None:
    value = raw.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not least <= value < 2**63):
        raise ConfigError(f"{file}: {prefix}{key} must be an integer ≥ {least}, got {value!r}")
    return value


def _align_section(raw: Any, file: Path) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or any(k not in ALIGN_KEYS for k in raw):
        bad = next((k for k in raw if k not in ALIGN_KEYS), None) if isinstance(raw, dict) else None
        raise ConfigError(f"{file}: align{'.' + str(bad) if bad else ''}: the align section takes "
                          f"{', '.join(ALIGN_KEYS)}")
    if raw.get("method", "weight") not in ("weight", "none"):
        raise ConfigError(f"{file}: align.method {raw['method']!r}; valid: weight, none")
    unused = [k for k in ("groups", "restarts", "max_iter", "seed") if k in raw] if raw.get("method") == "none" else []
    if unused:
        raise ConfigError(f"{file}: align.{unused[0]} applies to align.method weight (weight matching); the recipe "
                          "aligns nothing (method none)")
    return raw


def _reference_first(refs: list[str], reference: Any, file: Path) -> list[int]:
    if reference is None:
        return list(range(len(refs)))
    if reference not in refs:
        raise ConfigError(f"{file}: align.reference {reference!r} is not one of the models {refs}")
    i = refs.index(reference)
    return [i] + [j for j in range(len(refs)) if j != i]


def hub_cache() -> Path:
    """The local Hugging Face hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def resolve_model_ref(ref: str, recipe: Path) -> Path:
    """A recipe's model reference as a directory: a path relative to the recipe's directory or the working
    directory, or a hub id ``ORG/NAME[@REV]`` in the local Hugging Face cache (never downloaded). ConfigError naming
    the reference and the places looked at."""
    tried = [Path(recipe).parent / ref, Path(ref)]
    for p in tried:
        if p.is_dir():
            return p
    name, _, rev = ref.partition("@")
    entry = hub_cache() / ("models--" + name.replace("/", "--"))
    if entry.is_dir():
        snap = entry / "snapshots" / rev
        if rev and not snap.is_dir():
            raise ConfigError(f"{recipe}: model {ref!r}: revision {rev!r} is not in the cache entry {entry}")
        return snap if rev else entry
    raise ConfigError(f"{recipe}: model {ref!r} not found: looked at {', '.join(map(str, tried))} and the Hugging "
                      f"Face cache {entry} (models are never downloaded)")


def recipe_refs(models: Sequence[Path], out: Path) -> list[str]:
    """How the recipe written into ``out`` names each model so that it resolves from there
    (:func:`resolve_model_ref`): a snapshot of the local Hugging Face cache by its hub id ``ORG/NAME@REVISION`` (where
    that id finds it), any other directory by its path relative to ``out`` (never an absolute path; the bare name
    where no relative path exists, e.g. another drive)."""
    from ..io.hf import hub_id

    refs = []
    for m in models:
        ref = hub_id(m)
        if ref is None or not _resolves_to(ref, Path(out) / RECIPE_NAME, Path(m)):
            try:
                ref = Path(os.path.relpath(Path(m).resolve(), Path(out).resolve())).as_posix()
            except ValueError:
                ref = Path(m).resolve().name
        refs.append(ref)
    return refs


def _resolves_to(ref: str, recipe: Path, target: Path) -> bool:
    try:
        return resolve_model_ref(ref, recipe).resolve() == target.resolve()
    except ConfigError:
        return False


def recipe_text(rec: dict[str, Any], groups: Any = "permutation", refs: Sequence[str] | None = None) -> str:
    """The recipe a merge ran, in the supported schema, from its ``merge.json`` record: ``refs`` name the models
    (:func:`recipe_refs`; default: the record's names — never paths), with the weights as applied (a linear merge's
    with ``normalize: false``: they are the normalised ones), the seed and the alignment's settings, so that it re-runs
    to the same tensors."""
    names, base = rec["merged_from"], rec.get("base")
    refs = list(refs) if refs is not None else list(names)
    weights = rec["weights"]
    out: dict[str, Any] = {"merge_method": rec["rule"],
                           **({"base_model": refs[names.index(base)]} if base is not None else {})}
    if rec.get("slices"):
        out["slices"] = _slices_text(rec["slices"], dict(zip(names, refs, strict=True)))
    else:
        out["models"] = _models_text(rec, refs)
    out.update({k: rec[k] for k in ("dtype", "out_dtype") if rec.get(k)})
    out.update(merge_tokenizer.tokenizer_keys(rec.get("tokenizer"), names, refs))
    params = dict(rec.get("params") or {})
    if rec["rule"] == "linear" and weights is not None:
        params["normalize"] = False
    if params:
        out["parameters"] = params
    aligned = rec.get("align_settings") or {}
    seed = rec["seed"] if rec.get("seed") is not None else aligned.get("seed")
    if seed is not None:
        out["seed"] = seed
    out["align"] = {"method": rec["align"], "reference": refs[0]}
    if rec["align"] != "none":
        out["align"]["groups"] = aligned.get("groups", groups)
        out["align"].update({k: aligned[k] for k in ("restarts", "max_iter") if aligned.get(k) is not None})
        if aligned.get("seed") is not None and aligned["seed"] != seed:
            out["align"]["seed"] = aligned["seed"]
    return _dump(out)


def _models_text(rec: dict[str, Any], refs: list[str]) -> list[dict[str, Any]]:
    weights, models = rec["weights"], []
    for i, ref in enumerate(refs):
        params = dict(rec["model_params"][i]) if rec.get("model_params") else {}
        if weights is not None and weights[i] is not None:
            params["weight"] = weights[i]
        models.append({"model": ref, **({"parameters": params} if params else {})})
    return models


def _slices_text(slices: list[dict[str, Any]], refs: dict[str, str]) -> list[dict[str, Any]]:
    """The record's slices with every model named by its reference."""
    out = []
    for sl in slices:
        entry = dict(sl)
        entry["sources"] = [{**src, "model": refs[src["model"]]} for src in sl["sources"]]
        if "base_model" in sl:
            entry["base_model"] = refs[sl["base_model"]]
        out.append(entry)
    return out


class _OneLineDumper(yaml.SafeDumper):
    """A safe dumper writing strings with line breaks double-quoted on one line (escaped), so that no value starts a
    line of its own (a ``---`` or a key)."""


def _represent_str(dumper: yaml.SafeDumper, data: str):
    style = '"' if any(c in data for c in "\n\r\x85\u2028\u2029") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_OneLineDumper.add_representer(str, _represent_str)


def _dump(data: dict[str, Any]) -> str:
    return yaml.dump(data, Dumper=_OneLineDumper, sort_keys=False, allow_unicode=True, width=2**31 - 1)


def front_matter(fields: dict[str, Any]) -> str:
    """``fields`` as a model card's YAML front matter (between ``---`` lines), emitted by a YAML dumper: names with
    ``#``, ``:``, ``[`` or line breaks are quoted, never keys of their own."""
    return f"---\n{_dump(fields)}---\n"


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~])")


def markdown_escape(text: str) -> str:
    """``text`` as literal markdown inline text: characters markdown gives a meaning backslash-escaped, line breaks
    and other control characters shown as escapes (a name cannot start a heading, list, fence or HTML block)."""
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return _MARKDOWN_SPECIAL.sub(r"\\\1", shown)


def _fence(text: str, least: int) -> str:
    """Backticks delimiting ``text`` as code: more than any run of backticks inside it."""
    return "`" * max(least, 1 + max((len(r) for r in re.findall("`+", text)), default=0))


def _fenced(text: str, info: str) -> list[str]:
    fence = _fence(text, 3)
    return [fence + info, text, fence]


def _code(value: Any) -> str:
    """``value``'s repr as an inline code span (reprs escape line breaks; the delimiters outnumber its backticks)."""
    text = str(value)
    fence = _fence(text, 1)
    return f"{fence} {text} {fence}"


def _evaluation_lines(rec: dict[str, Any]) -> list[str]:
    """The card's evaluation section: the held-out scores and the lm-eval scores the merge record holds, if any."""
    lines = []
    if rec.get("test"):
        t = rec["test"]
        lines.append(f"- held-out loss: {t['loss']:.4f} nats" + (f", perplexity {t['perplexity']:.4g}"
                                                                 if "perplexity" in t else ""))
    for task, scores in ((rec.get("lm_eval") or {}).get("tasks") or {}).items():
        lines.append(f"- lm-eval {markdown_escape(task)}: " + ", ".join(f"{markdown_escape(k)} {v:.4g}"
                                                                       for k, v in scores.items()))
    return ["", "## Evaluation", "", *lines] if lines else []


def card_text(title: str, rec: dict[str, Any], recipe: str) -> str:
    """A model card (README.md) for a merged model: what was merged, how, and the recipe (names, never absolute
    paths). The front matter is emitted by a YAML dumper and names in the body are escaped, so a model or output name
    cannot break the card or add metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("modeconn")
    except PackageNotFoundError:  # pragma: no cover - source checkout without metadata
        ver = "(source)"
    names = rec["merged_from"]
    tags = ["merge", "modeconn", *(["mergekit"] if "mergekit" in rec["source"] else [])]
    aligned = ("none (merged as stored)" if rec["align"] == "none"
               else f"streaming weight matching to {markdown_escape(names[0])}")
    lines = [
        front_matter({"library_name": "transformers", "tags": tags, "base_model": list(names)}).rstrip("\n"), "",
        f"# {markdown_escape(title)}", "",
        f"Merged with modeconn {ver}: merge rule `{rec['rule']}` ({rec['source']}).", "",
        "## Inputs", "", *[f"- {markdown_escape(n)}" + (" (base)" if n == rec.get("base") else "") for n in names], "",
        "## Method", "", f"- alignment: {aligned}", f"- weights: {_code(rec['weights'])}",
        f"- parameters: {_code(rec.get('params') or {})}",
    ]
    if rec.get("seed") is not None:
        lines.append(f"- seed: {rec['seed']}")
    lines += _evaluation_lines(rec)
    lines += ["", "## Recipe", "", *_fenced(recipe.rstrip(), "yaml"), ""]
    return "\n".join(lines)
