"""The experiment registry: every named experiment is one typed :class:`Experiment` entry.

An experiment module defines its sizes (``quick`` for CI, ``full`` for the report), a runner and a report, and
registers one entry with :func:`register_experiment`; ``modeconn experiment NAME`` and its ``--help`` are generated
from the entries. Adding an experiment touches its own module and one name in the import of ``experiments/__init__.py``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..registry import Registry

Log = Callable[[str], None]
SIZE_OPTIONS = ("pairs", "epochs", "width", "limit_train")
"""The size settings the command line can override (``--pairs``, ``--epochs``, ``--width``, ``--limit-train``)."""


@dataclass(frozen=True)
class Experiment:
    """One named experiment.

    Attributes:
        name: the registry name (``modeconn experiment NAME``).
        doc: its description; the first paragraph, without a leading "`modeconn experiment NAME`: ", is the
            :attr:`summary` that ``modeconn list experiments`` prints, naming the docs/methods.md section whose
            claim it checks.
        sizes: ``{"quick": size, "full": size, ...}``, frozen dataclasses of the run's settings; sizes beyond
            ``quick`` and ``full`` are picked by name (``--size NAME``).
        run: ``run(out, *, size, data, overwrite, log) -> results`` writing ``results.json``, ``report.md`` and its
            figures into ``out`` atomically.
        report: ``report(results) -> markdown``.
        outputs: the files and folders ``run`` writes.
        overrides: size setting (one of :data:`SIZE_OPTIONS`) → dotted field of the size (``"lm.hidden_size"``); a
            setting not listed does not apply, and ``why_not`` says why.
        why_not: why the unlisted settings do not apply (e.g. "it trains three models A, B, C").
    """

    name: str
    doc: str
    sizes: Mapping[str, Any]
    run: Callable[..., dict[str, Any]]
    report: Callable[[dict[str, Any]], str]
    outputs: tuple[str, ...]
    overrides: Mapping[str, str] = field(default_factory=dict)
    why_not: str = ""

    @property
    def summary(self) -> str:
        first = " ".join(self.doc.strip().split("\n\n")[0].split())
        return first.split("`: ", 1)[-1] if first.startswith("`modeconn") else first

    def size_name(self, quick: bool = False, name: str | None = None) -> str:
        """The name of the size to run: ``name`` if given, else ``"quick"`` or ``"full"``.

        Raises:
            ConfigError: ``name`` is not one of :attr:`sizes` (the valid names are listed), or ``quick`` with a
                ``name`` other than ``"quick"``.
        """
        if name is None:
            return "quick" if quick else "full"
        if name not in self.sizes:
            raise ConfigError(f"unknown size {name!r} of experiment {self.name}; valid sizes: {', '.join(self.sizes)}")
        if quick and name != "quick":
            raise ConfigError(f"--quick and --size {name} contradict each other; give one of them")
        return name

    def size(self, quick: bool = False, size_name: str | None = None, **settings: Any) -> Any:
        """The size named ``size_name`` (default: quick or full, :meth:`size_name`) with the given settings
        (``None`` = keep) applied.

        Raises:
            ConfigError: an unknown size name (valid names listed), or a setting that does not apply to this
                experiment (named, with the reason).
        """
        size = self.sizes[self.size_name(quick, size_name)]
        for option, value in settings.items():
            if value is None:
                continue
            if option not in self.overrides:
                flag = "--" + option.replace("_", "-")
                raise ConfigError(f"{flag} does not apply to {self.name} ({self.why_not or 'not a setting of it'})")
            size = _replace_dotted(size, self.overrides[option].split("."), value)
        return size

    def __call__(self, out: str | os.PathLike, *, quick: bool = False, size_name: str | None = None,
                 data: str | os.PathLike | None = None, overwrite: bool = False, log: Log = print,
                 **settings: Any) -> dict[str, Any]:
        """Run at the quick, full or named size (:meth:`size`) with ``settings`` overrides; returns the results dict."""
        size = self.size(quick, size_name, **settings)
        return self.run(Path(out), size=size, data=data, overwrite=overwrite, log=log)


def size_label(sizes: Mapping[str, Any], size: Any) -> str:
    """``"quick"``, ``"full"``, or the nearest of them with the settings that differ (``"quick with overrides
    {'epochs': 3}"``): what a report states about the size it ran."""
    def diff(base: Any) -> dict[str, Any]:
        return {f.name: getattr(size, f.name) for f in dataclasses.fields(size)
                if getattr(size, f.name) != getattr(base, f.name)}

    name = min(sizes, key=lambda n: len(diff(sizes[n])))
    changed = diff(sizes[name])
    return name + (f" with overrides {changed}" if changed else "")


def _replace_dotted(obj: Any, path: list[str], value: Any) -> Any:
    head, *rest = path
    new = _replace_dotted(getattr(obj, head), rest, value) if rest else value
    return dataclasses.replace(obj, **{head: new})


EXPERIMENTS: Registry[Experiment] = Registry("experiment")
"""Every registered experiment, by name."""


def register_experiment(experiment: Experiment) -> Experiment:
    """Add ``experiment`` to :data:`EXPERIMENTS` (ConfigError for a duplicate name); returns it."""
    EXPERIMENTS.register(experiment.name)(experiment)
    return experiment

