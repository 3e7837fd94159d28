"""The registry of alignment methods: one typed entry per method, the source for CLI choices and help.

Each :class:`AlignmentMethod` records the method's name, what it needs (data? a model?), whether it streams
(works on :class:`~modeconn.io.lazy.LazyCheckpoint` endpoints), which symmetry groups it solves, its config class
(:class:`~modeconn.config.StrictConfig`), which way its objective points, its paper and the callable. Adding a method
is one module (its function and config) plus one entry here.

>>> from modeconn.match.methods import ALIGNMENT_METHODS
>>> ALIGNMENT_METHODS.names()
['activation', 'dual', 'learned', 'one-sided', 'reference', 'weight']
>>> m = ALIGNMENT_METHODS.get("weight")
>>> m.needs_data, m.streams, m.config.__name__
(False, True, 'WeightMatchingConfig')
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from ..config import StrictConfig
from ..errors import ConfigError
from ..registry import Registry
from ..symmetry import SymmetrySpec
from .activation import ActivationMatchingConfig, activation_matching
from .dual import DualMatchingConfig, dual_matching, one_sided_matching
from .learned import LearnedMatchingConfig, learned_matching
from .reference import ReferenceMatchingConfig, reference_weight_matching
from .result import Alignment
from .weight import WeightMatchingConfig, weight_matching

StateDict = Mapping[str, torch.Tensor]
Inputs = Literal["state_dicts", "models", "model_and_state_dicts"]


@dataclass(frozen=True)
class AlignmentMethod:
    """One alignment method.

    Attributes:
        name: the registry (and CLI ``--method``) name.
        summary: one line for help texts.
        fn: the function; its calling convention is ``inputs``: ``"state_dicts"`` → ``fn(spec, sd_a, sd_b, config,
            **kw)``; ``"models"`` → ``fn(spec, model_a, model_b, loader, config, **kw)``; ``"model_and_state_dicts"``
            → ``fn(spec, model, sd_a, sd_b, loader, config, **kw)``. :meth:`align` hides the difference.
        config: its :class:`~modeconn.config.StrictConfig` class (``config=`` plus keyword overrides).
        paper: the citation of the algorithm.
        needs_data: needs a data loader (and a model).
        streams: accepts lazy (:class:`~modeconn.io.lazy.LazyCheckpoint`) endpoints without loading them.
        groups: the group names it solves; None for every registered group (:data:`modeconn.symmetry.GROUPS`).
        objective_sense: ``"maximize"`` (a score) or ``"minimize"`` (a loss), as in :attr:`Alignment.objective_sense`.
        needs_continuous: the spec must have a continuous space (dual / one-sided matching learn those).
        label: a short display name for tables and figure legends (default: ``name``).
        command_line: offered by ``modeconn align`` / ``merge`` and the sweep's barrier task (the readable reference
            implementation is not).
    """

    name: str
    summary: str
    fn: Callable[..., Alignment]
    config: type[StrictConfig]
    paper: str
    needs_data: bool
    streams: bool
    groups: tuple[str, ...] | None
    objective_sense: Literal["maximize", "minimize"]
    inputs: Inputs = "state_dicts"
    needs_continuous: bool = False
    label: str = ""
    command_line: bool = True

    @property
    def display(self) -> str:
        return self.label or self.name

    def supported_groups(self) -> list[str]:
        """The group names this method solves."""
        from ..symmetry import GROUPS

        return list(self.groups) if self.groups is not None else GROUPS.names()

    def check_spec(self, spec: SymmetrySpec) -> None:
        """ConfigError naming the first space whose group this method does not solve (or, for the learned
        continuous methods, a spec without continuous spaces)."""
        supported = set(self.supported_groups())
        for s, sp in spec.spaces.items():
            if sp.group not in supported:
                raise ConfigError(f"alignment method {self.name!r} does not solve group {sp.group!r} (space {s!r}); "
                                  f"it solves {', '.join(sorted(supported))}")
        if self.needs_continuous and all(spec.group_of(s).exact for s in spec.spaces):
            raise ConfigError(f"alignment method {self.name!r} learns continuous transforms; the spec has none")

    def align(self, spec: SymmetrySpec, sd_a: StateDict, sd_b: StateDict, *, model: nn.Module | None = None,
              loader: Iterable | None = None, config: StrictConfig | Mapping[str, Any] | None = None,
              **kwargs: Any) -> Alignment:
        """Run the method on endpoints ``sd_a``, ``sd_b`` whatever its calling convention (``model``: an instance of
        the architecture, needed with ``loader`` by the data-driven methods; ``kwargs``: runtime arguments such as
        ``progress`` and option overrides). ConfigError if a model or loader it needs is missing."""
        if self.needs_data and (model is None or loader is None):
            raise ConfigError(f"alignment method {self.name!r} needs a model and a data loader")
        if self.inputs == "state_dicts":
            return self.fn(spec, sd_a, sd_b, config, **kwargs)
        if self.inputs == "models":
            return self.fn(spec, _instance(model, sd_a), _instance(model, sd_b), loader, config, **kwargs)
        return self.fn(spec, model, sd_a, sd_b, loader, config, **kwargs)


def _instance(template: nn.Module, sd: StateDict) -> nn.Module:
    m = copy.deepcopy(template)
    m.load_state_dict(sd)
    return m.eval()


ALIGNMENT_METHODS: Registry[AlignmentMethod] = Registry("alignment method")
"""Every alignment method by name (``ALIGNMENT_METHODS.get(name)``: ConfigError listing the names for a typo)."""


def command_line_methods(*, continuous: bool = False, learns: bool | None = None) -> tuple[str, ...]:
    """The names of the methods the command line offers, in registration order: those that learn continuous
    transforms (``continuous``) or not; with ``learns`` given, only those that do (or do not) train on the models
    (``inputs == "model_and_state_dicts"``)."""
    return tuple(e.name for e in ALIGNMENT_METHODS.entries()
                 if e.command_line and e.needs_continuous == continuous
                 and (learns is None or (e.inputs == "model_and_state_dicts") == learns))


def register(method: AlignmentMethod) -> AlignmentMethod:
    """Add ``method`` to :data:`ALIGNMENT_METHODS` (ConfigError for a duplicate name)."""
    return ALIGNMENT_METHODS.register(method.name)(method)


GIT_RE_BASIN = ("Ainsworth, Hayase & Srinivasa, \"Git Re-Basin: Merging Models modulo Permutation Symmetries\", "
                "ICLR 2023")
THEUS = "Theus et al., \"Generalized Linear Mode Connectivity for Transformers\", 2025"

register(AlignmentMethod(
    "weight", "weight matching: coordinate descent on Σ⟨θ_A, g·θ_B⟩ with restarts (every group; streams)",
    weight_matching, WeightMatchingConfig,
    f"{GIT_RE_BASIN}, Alg. 1; greedy start: Singh & Jaggi, NeurIPS 2020; continuous groups: {THEUS}",
    needs_data=False, streams=True, groups=None, objective_sense="maximize", label="weight matching"))
register(AlignmentMethod(
    "reference", "plain git-re-basin weight matching (permutations, one run): the readable reference",
    reference_weight_matching, ReferenceMatchingConfig, f"{GIT_RE_BASIN}, Alg. 1",
    needs_data=False, streams=False, groups=("permutation",), objective_sense="maximize",
    label="reference weight matching", command_line=False))
register(AlignmentMethod(
    "activation", "activation matching: LAP on Pearson correlations of unit activations (permutations)",
    activation_matching, ActivationMatchingConfig,
    f"{GIT_RE_BASIN}, §3.1; Li et al., \"Convergent Learning\", 2015",
    needs_data=True, streams=False, groups=("permutation",), objective_sense="maximize", inputs="models",
    label="activation matching"))
register(AlignmentMethod(
    "learned", "learned matching with the straight-through estimator (permutations projected by weight matching)",
    learned_matching, LearnedMatchingConfig, f"{GIT_RE_BASIN}, §3.3, Alg. 2",
    needs_data=True, streams=False, groups=None, objective_sense="minimize", inputs="model_and_state_dicts",
    label="learned matching (STE)"))
register(AlignmentMethod(
    "one-sided", "one-sided learned matching: B's continuous transforms learned on the path loss (transformers)",
    one_sided_matching, DualMatchingConfig, f"{THEUS} (one-sided learned matching)",
    needs_data=True, streams=False, groups=None, objective_sense="minimize", inputs="model_and_state_dicts",
    needs_continuous=True, label="one-sided learned matching"))
register(AlignmentMethod(
    "dual", "dual learned matching (LMC-DM): continuous transforms of both endpoints learned on the path loss",
    dual_matching, DualMatchingConfig, f"LMC-DM dual matching (docs/methods.md §3), after {THEUS}",
    needs_data=True, streams=False, groups=None, objective_sense="minimize", inputs="model_and_state_dicts",
    needs_continuous=True, label="dual learned matching (LMC-DM)"))
