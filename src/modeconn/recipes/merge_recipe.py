"""Merge recipes: mergekit's YAML schema (a subset) plus an ``align:`` section, and what a merge writes beside its
output (the recipe it ran, a model card).

Supported subset of mergekit's ``MergeConfiguration`` (anything else is refused, naming the key)::

    merge_method: ties                      # any rule of `modeconn merge --rule` (mergekit's names)
    base_model: org/base                    # optional; added to the inputs when not listed (as mergekit does)
    models:                                 # two or more; `model:` a directory, a Hugging Face cache entry
      - model: ./a                          #   (models--ORG--NAME) or a hub id ORG/NAME[@REV] found in the
        parameters: {weight: 0.6, density: 0.5}   #   local Hugging Face cache
      - model: ./b
    parameters: {density: [{filter: mlp, value: 0.3}, {value: 0.5}], normalize: true}   # scalars or filter lists
    dtype: float32                          # inputs cast to it before the rule
    out_dtype: bfloat16                     # dtype written
    tokenizer_source: base                  # only `base` (tokenizer files come from the base, else the first model)
    align:                                  # modeconn's: not part of mergekit's schema
      method: weight                        # weight (streaming weight matching) or none
      groups: permutation                   # symmetry groups of the alignment
      reference: ./a                        # the model the others are aligned to (its layout is written)

Relative model paths are taken relative to the recipe's directory (else the working directory). Parameter
gradients (lists of numbers interpolated across layers), ``slices``, ``modules``, ``tokenizer``, ``chat_template``
and ``tokenizer_source: union`` are not supported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError

KEYS = ("merge_method", "base_model", "models", "parameters", "dtype", "out_dtype", "tokenizer_source", "align")
ALIGN_KEYS = ("method", "groups", "reference")
DTYPES = ("float32", "float16", "bfloat16", "float64")
RECIPE_NAME, CARD_NAME = "merge_recipe.yml", "README.md"


@dataclass
class Recipe:
    """A parsed recipe: ``models`` (paths, the alignment reference first), ``refs`` (as written), ``rule``, ``base``
    (index or None), ``weights`` (per model, None where not given), ``params`` (shared), ``model_params``,
    ``dtype`` / ``out_dtype`` (names or None), ``align`` and ``groups``."""

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


def load_recipe(file: Path) -> Recipe:
    """Parse and check ``file`` (see the module docstring); ConfigError naming the file and key at fault, before any
    checkpoint is read (model references are resolved to existing directories)."""
    raw = _read(file)
    unknown = [k for k in raw if k not in KEYS]
    if unknown:
        raise ConfigError(f"{file}: key {unknown[0]!r} is not supported; supported keys: {', '.join(KEYS)}")
    if not isinstance(raw.get("merge_method"), str):
        raise ConfigError(f"{file}: 'merge_method' (a rule name such as linear, ties, slerp) is required")
    entries = raw.get("models")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{file}: 'models' must be a list of {{model: ..., parameters: ...}} entries")
    refs = [_model_ref(e, i, file) for i, e in enumerate(entries)]
    per_model = [_params(e.get("parameters"), f"models[{i}].parameters", file) for i, e in enumerate(entries)]
    base = raw.get("base_model")
    if base is not None and base not in refs:
        refs.append(_check_str(base, "base_model", file))
        per_model.append({})
    align = _align_section(raw.get("align"), file)
    order = _reference_first(refs, align.get("reference"), file)
    refs, per_model = [refs[i] for i in order], [per_model[i] for i in order]
    shared = _params(raw.get("parameters"), "parameters", file)
    if raw.get("tokenizer_source") not in (None, "base", base):
        raise ConfigError(f"{file}: tokenizer_source {raw['tokenizer_source']!r}: only 'base' is supported (tokenizer "
                          "files come from the base model, else the first)")
    return Recipe(models=[resolve_model_ref(r, file) for r in refs], refs=refs, rule=raw["merge_method"],
                  base=None if base is None else refs.index(base),
                  weights=[_weight(p, shared, i, file) for i, p in enumerate(per_model)], params=shared,
                  model_params=per_model, dtype=_dtype(raw, "dtype", file), out_dtype=_dtype(raw, "out_dtype", file),
                  align=align.get("method", "weight"), groups=align.get("groups", "permutation"))


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


def _model_ref(entry: Any, i: int, file: Path) -> str:
    if not isinstance(entry, dict) or "model" not in entry:
        raise ConfigError(f"{file}: models[{i}] must be a mapping with 'model' (and optional 'parameters')")
    extra = [k for k in entry if k not in ("model", "parameters")]
    if extra:
        raise ConfigError(f"{file}: models[{i}].{extra[0]} is not supported (only model and parameters)")
    return _check_str(entry["model"], f"models[{i}].model", file)


def _params(raw: Any, where: str, file: Path) -> dict[str, Any]:
    """Scalars or mergekit's filter lists ``[{filter, value}, …]``; gradients (lists of numbers) refused."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: {where} must be a mapping of parameter names to values")
    for name, value in raw.items():
        if isinstance(value, list) and not all(isinstance(v, dict) and set(v) <= {"filter", "value"} for v in value):
            raise ConfigError(f"{file}: {where}.{name}: gradients (lists of values across layers) are not supported; "
                              "use a scalar or a list of {filter: ..., value: ...}")
        if not isinstance(value, (bool, int, float, str, list)):
            raise ConfigError(f"{file}: {where}.{name}: {value!r} is not a scalar or a filter list")
    return dict(raw)


def _weight(own: dict[str, Any], shared: dict[str, Any], i: int, file: Path) -> float | None:
    """Model ``i``'s ``weight`` (its own, else the shared one; removed from both parameter maps)."""
    value = own.pop("weight", shared.get("weight"))
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigError(f"{file}: models[{i}].parameters.weight must be a number, got {value!r}")
    return None if value is None else float(value)


def _dtype(raw: dict[str, Any], key: str, file: Path) -> str | None:
    value = raw.get(key)
    if value is not None and value not in DTYPES:
        raise ConfigError(f"{file}: {key} {value!r}; valid: {', '.join(DTYPES)}")
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


def recipe_text(rec: dict[str, Any], groups: Any = "permutation") -> str:
    """The recipe a merge ran, in the supported schema, from its ``merge.json`` record (model names, never paths)."""
    names, base = rec["merged_from"], rec.get("base")
    models = []
    for i, name in enumerate(names):
        params = dict(rec["model_params"][i]) if rec.get("model_params") else {}
        if rec["weights"] is not None and (base is None or name != base):
            params["weight"] = rec["weights"][i]
        models.append({"model": name, **({"parameters": params} if params else {})})
    out: dict[str, Any] = {"merge_method": rec["rule"], **({"base_model": base} if base else {}), "models": models}
    out.update({k: rec[k] for k in ("dtype", "out_dtype") if rec.get(k)})
    if rec.get("params"):
        out["parameters"] = rec["params"]
    out["align"] = {"method": rec["align"], "reference": names[0], **({"groups": groups} if rec["align"] != "none" else {})}
    return yaml.safe_dump(out, sort_keys=False, allow_unicode=True)


def card_text(title: str, rec: dict[str, Any], recipe: str) -> str:
    """A model card (README.md) for a merged model: what was merged, how, and the recipe (names, never paths)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("modeconn")
    except PackageNotFoundError:  # pragma: no cover - source checkout without metadata
        ver = "(source)"
    names = rec["merged_from"]
    tags = "merge, modeconn" + (", mergekit" if "mergekit" in rec["source"] else "")
    aligned = "none (merged as stored)" if rec["align"] == "none" else f"streaming weight matching to `{names[0]}`"
    lines = [
        "---", "library_name: transformers", f"tags: [{tags}]", "base_model:", *[f"- {n}" for n in names], "---", "",
        f"# {title}", "", f"Merged with modeconn {ver}: merge rule `{rec['rule']}` ({rec['source']}).", "",
        "## Inputs", "", *[f"- `{n}`" + (" (base)" if n == rec.get("base") else "") for n in names], "",
        "## Method", "", f"- alignment: {aligned}", f"- weights: {rec['weights']}",
        f"- parameters: {rec.get('params') or {}}",
    ]
    if rec.get("seed") is not None:
        lines.append(f"- seed: {rec['seed']}")
    lines += ["", "## Recipe", "", "```yaml", recipe.rstrip(), "```", ""]
    return "\n".join(lines)
