"""Align two models with several methods and evaluate every linear path (shared by `demo` and `barrier`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from ..config import StrictConfig
from ..data import DatasetBundle, make_loader
from ..errors import ConfigError
from ..match import Alignment
from ..match.methods import ALIGNMENT_METHODS
from ..match.progress import reporter
from ..path import Curve, evaluate_model, evaluate_path, merge
from ..path.batchnorm import fixed_batches
from ..symmetry import SymmetrySpec, symmetry_spec
from ..io.models import check_input_shape



def comparison_methods() -> tuple[str, ...]:
    """``naive`` (no alignment) and every registered alignment method a permutation spec admits (the learned continuous
    methods, one-sided and dual, need the transformer group and run through ``modeconn align`` / the lmc-dm
    experiments), read from the registry when asked."""
    return ("naive", *(n for n in ALIGNMENT_METHODS if not ALIGNMENT_METHODS.get(n).needs_continuous))


def method_label(method: str) -> str:
    """The display name of a comparison method (``naive``, or its registry entry's label)."""
    return "naive" if method == "naive" else ALIGNMENT_METHODS.get(method).display


def method_labels() -> dict[str, str]:
    """Every comparison method → its display name."""
    return {m: method_label(m) for m in comparison_methods()}


def __getattr__(name: str) -> Any:
    """``METHODS`` and ``METHOD_LABELS``, read from the registry when asked (:func:`comparison_methods`)."""
    if name == "METHODS":
        return comparison_methods()
    if name == "METHOD_LABELS":
        return method_labels()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


StateDict = Mapping[str, torch.Tensor]
BN_BATCHES = 20
"""Training batches (drawn once per comparison) that BatchNorm statistics and REPAIR are estimated on."""


def check_methods(methods: Sequence[str]) -> list[str]:
    """Validate method names before any heavy work (ConfigError naming the bad one)."""
    valid = comparison_methods()
    bad = [m for m in methods if m not in valid]
    if bad:
        raise ConfigError(f"unknown alignment method(s) {bad}; valid: {', '.join(valid)}")
    if not methods:
        raise ConfigError("no alignment method given")
    return list(dict.fromkeys(methods))


@dataclass
class Comparison:
    """Per method: the alignment (None for naive), the path curve and the midpoint merge's metrics."""

    spec: SymmetrySpec
    examples: dict[str, tuple[int, int]] = field(default_factory=dict)
    """split → (examples evaluated, examples in the split): curves, endpoints and merges use the same examples."""
    eval_limit: int | None = None
    alignments: dict[str, Alignment | None] = field(default_factory=dict)
    curves: dict[str, Curve] = field(default_factory=dict)
    merged: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    aligned_b: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def evaluated(self, split: str) -> str:
        """What was evaluated on ``split``, in words: "all 360 examples" or "first 2000 of 48600 examples,
        --eval-limit 2000"."""
        n, total = self.examples[split]
        return f"all {total} examples" if n == total else f"first {n} of {total} examples, --eval-limit {self.eval_limit}"

    def endpoints(self, split: str = "test") -> dict[str, dict[str, float]]:
        """Loss and accuracy of A (λ=0) and B (λ=1) on the evaluated examples of ``split``: the curves' ends
        (λ=0 and λ=1 evaluate the given models exactly), so they agree with the curves and the tables."""
        curve = next(iter(self.curves.values()))
        ends = curve.summary()[split]
        return {name: {"loss": ends["endpoint_loss"][i], "acc": ends["endpoint_acc"][i]} for i, name in enumerate("AB")}

    def to_json(self) -> dict:
        return {
            "eval_limit": self.eval_limit,
            "evaluated": {s: self.evaluated(s) for s in self.examples},
            "examples": {s: {"evaluated": n, "total": t} for s, (n, t) in self.examples.items()},
            "methods": list(self.curves),
            "barriers": {m: c.summary() for m, c in self.curves.items()},
            "curves": {m: c.to_json() for m, c in self.curves.items()},
            "alignment": {
                m: (None if a is None else {"objective": a.objective, "history": a.history,
                                            "stats": _jsonable(a.stats)})
                for m, a in self.alignments.items()
            },
            "midpoint_merge": self.merged,
        }


def _jsonable(stats: dict) -> dict:
    return {k: (v if isinstance(v, (int, float, str, bool, list, dict)) or v is None else str(v)) for k, v in stats.items()}


def align(method: str, spec: SymmetrySpec, model: nn.Module, sd_a: StateDict, sd_b: StateDict,
          bundle: DatasetBundle, *, seed: int = 0, batch_size: int = 256, learned_steps: int = 300,
          device: str | None = None, overrides: Mapping[str, Any] | None = None,
          config: StrictConfig | None = None, progress: Callable[..., None] | bool = False) -> Alignment | None:
    """Run one alignment method of :data:`METHODS` through its registry entry (``naive`` returns None).

    Methods that read activations get the training split in order (batches of ``batch_size``); methods that learn
    get it shuffled with ``seed`` (batches of 128) and ``learned_steps`` steps; ``seed`` goes to every method whose
    config has one; ``device`` (score products there) to a method whose config has that field — ConfigError naming
    ``--device`` for any other method. ``overrides``: further fields of the method's config class (a ``seed`` there
    replaces ``seed``, data order included; ConfigError naming an unknown field). ``config``: instead of
    ``overrides``, the method's validated config object (its fields set there win; ``seed`` and ``learned_steps``
    fill the ones it leaves unset). ``progress``: the method's progress (:mod:`modeconn.match.progress`), given to
    the methods that report it (the data-driven ones)."""
    if method == "naive":
        return None
    entry = ALIGNMENT_METHODS.get(method)
    fields = entry.config.model_fields
    options = {k: v for k, v in (("seed", seed), ("steps", learned_steps)) if k in fields} | dict(overrides or {})
    if device is not None:
        if "device" not in fields:
            raise ConfigError(f"--device applies to weight matching; --method {method} runs on the models' device")
        options["device"] = device
    if config is not None:
        config = config.model_copy(update={k: v for k, v in options.items() if k not in config.model_fields_set})
        options = {}
    seed = getattr(config, "seed", options.get("seed", seed))
    loader = None
    if entry.needs_data:
        learns = entry.inputs == "model_and_state_dicts"
        loader = (make_loader(bundle.train, 128, shuffle=True, seed=seed) if learns
                  else make_loader(bundle.train, batch_size, shuffle=False))
    runtime = {"progress": progress} if entry.needs_data else {}
    return entry.align(spec, sd_a, sd_b, model=model, loader=loader, config=config, **options, **runtime)


def _instance(template: nn.Module, sd: StateDict) -> nn.Module:
    import copy

    m = copy.deepcopy(template)
    m.load_state_dict(sd)
    return m.eval()


def compare_alignments(
    model: nn.Module,
    sd_a: StateDict,
    sd_b: StateDict,
    bundle: DatasetBundle,
    methods: Sequence[str] = ("naive", "weight", "activation"),
    *,
    lambdas: int = 25,
    bn: str = "reset",
    seed: int = 0,
    batch_size: int = 512,
    eval_limit: int | None = None,
    learned_steps: int = 300,
    on_step: Callable[[str], None] | None = None,
    progress: Callable[..., None] | bool = True,
    configs: Mapping[str, StrictConfig] | None = None,
    on_merge: Callable[[str, nn.Module], None] | None = None,
) -> Comparison:
    """Align B to A with each method, evaluate the linear path on train and test, merge at λ=½.

    ``eval_limit`` evaluates on the first examples of each split only (quick runs); the comparison records how
    many (:meth:`Comparison.evaluated`). BatchNorm statistics
    are re-estimated (``bn``) on one fixed list of shuffled (``seed``) training batches, drawn once and shared
    by every method's path and midpoint merge: the merge at λ=½ is the path's point at λ=½ (same weights, same
    BN batches), so its loss equals the curve's there whenever the λ grid contains ½. Returns a
    :class:`Comparison`. ``configs``: per method its validated config object (:func:`align`'s ``config``).
    ``progress``: ``progress(stage, done, total, **metrics)`` (:mod:`modeconn.match.progress`) through each method's
    alignment (the data-driven ones report theirs) and its path points; True (default): tqdm bars on stderr;
    False: silent. Raises
    ConfigError when the bundle's examples do not have the model's ``in_shape``
    (before tracing); NonFiniteError (naming λ/split, or the merged model and split) for a NaN/Inf
    logit or loss.
    """
    methods = check_methods(methods)
    x0 = bundle.train.tensors[0][:2]
    check_input_shape(getattr(model, "modeconn_config", {}).get("kwargs", {}).get("in_shape"), x0.shape[1:],
                      f"the model ({type(model).__name__})", f"dataset {bundle.name!r}")
    spec = symmetry_spec(model, x0)
    train_eval, test_eval = bundle.train, bundle.test
    if eval_limit is not None:
        train_eval = torch.utils.data.Subset(bundle.train, range(min(eval_limit, len(bundle.train))))
        test_eval = torch.utils.data.Subset(bundle.test, range(min(eval_limit, len(bundle.test))))
    loaders = {"train": make_loader(train_eval, batch_size), "test": make_loader(test_eval, batch_size)}
    bn_loader = fixed_batches(make_loader(bundle.train, batch_size, shuffle=True, seed=seed), BN_BATCHES)
    result = Comparison(spec=spec, eval_limit=eval_limit,
                        examples={"train": (len(train_eval), len(bundle.train)), "test": (len(test_eval), len(bundle.test))})
    tick = reporter(progress)
    for method in methods:
        if on_step:
            on_step(f"aligning: {method_label(method)}")
        res = align(method, spec, model, sd_a, sd_b, bundle, seed=seed, learned_steps=learned_steps,
                    config=(configs or {}).get(method), progress=tick)
        sd_b_aligned = dict(sd_b) if res is None else res.apply(sd_b)
        result.alignments[method] = res
        result.aligned_b[method] = sd_b_aligned
        if on_step:
            on_step(f"evaluating path: {method_label(method)}")
        result.curves[method] = evaluate_path(
            model, sd_a, sd_b_aligned, loaders, lambdas=lambdas, bn=bn, bn_loader=bn_loader, spec=spec,
            progress=lambda done, total, m=method: tick(f"path points ({m})", done, total),
        )
        merged = merge([sd_a, sd_b_aligned], model=model, bn=bn, bn_loader=bn_loader, spec=spec)
        m = _instance(model, merged)
        result.merged[method] = {s: evaluate_model(m, ld, where=f"merged model ({method}, λ=0.5), split {s!r}")
                                 for s, ld in loaders.items()}
        if on_merge is not None:
            on_merge(method, m)
    return result
