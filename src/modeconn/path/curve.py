"""Loss/accuracy along a path and the barrier definitions (always reported by name).

- ``mean`` (Frankle et al. 2020; git-re-basin): ``max_λ L(λ) − ½(L(0) + L(1))``
- ``interp`` (Entezari et al. 2022): ``max_λ [L(λ) − ((1−λ)L(0) + λL(1))]``
- ``peak`` (AutoNEB, LLPF): ``max_λ L(λ)``
- relative accuracy drop (neuron identifiability): ``(max(acc(0), acc(1)) − min_λ acc(λ)) / max(acc(0), acc(1))·100``
  (positive = a drop, in percent)

Every figure computed from a curve (barriers, peak, accuracy drop, summary) refuses a curve holding NaN/Inf:
:class:`~modeconn.errors.NonFiniteError` names the split, metric and λ instead of reporting a NaN barrier.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, NonFiniteError

BARRIERS = ("mean", "interp")


@dataclass
class Curve:
    """Metrics along a path. ``lambdas``: (L,) in [0, 1]; ``metrics[split][metric]``: (L,) arrays with
    metric ``loss`` (mean cross-entropy, nats) and ``acc`` (fraction correct); ``error`` = 1 − acc."""

    lambdas: np.ndarray
    metrics: dict[str, dict[str, np.ndarray]]
    bn: str = "reset"
    info: dict = field(default_factory=dict)

    @property
    def splits(self) -> list[str]:
        return list(self.metrics)

    def values(self, split: str | None = None, metric: str = "loss") -> np.ndarray:
        """The (L,) values of ``metric`` (loss/acc/error) on ``split`` (default: the first split)."""
        split = self.splits[0] if split is None else split
        if split not in self.metrics:
            raise ConfigError(f"unknown split {split!r}; this curve has {self.splits}")
        if metric == "error":
            return 1.0 - self.metrics[split]["acc"]
        if metric not in self.metrics[split]:
            raise ConfigError(f"unknown metric {metric!r}; valid: {sorted(self.metrics[split]) + ['error']}")
        return self.metrics[split][metric]

    def finite_values(self, split: str | None = None, metric: str = "loss") -> np.ndarray:
        """:meth:`values`, or NonFiniteError naming the split, metric and first λ with a NaN/Inf value."""
        v = self.values(split, metric)
        bad = ~np.isfinite(v)
        if bad.any():
            i = int(np.argmax(bad))
            name = self.splits[0] if split is None else split
            raise NonFiniteError(f"{metric} on split {name!r} is {v[i]} at λ={float(self.lambdas[i]):g} ({int(bad.sum())} "
                                 f"of {len(v)} points non-finite): no barrier is computed from a non-finite curve")
        return v

    def barrier(self, kind: str = "mean", split: str | None = None, metric: str = "loss") -> float:
        """Barrier of ``kind`` ('mean' or 'interp') on ``split``/``metric`` (same units as the metric).
        Raises ConfigError (unknown kind/split/metric), NonFiniteError (a NaN/Inf value, naming λ and split)."""
        if kind not in BARRIERS:
            raise ConfigError(f"unknown barrier kind {kind!r}; valid: {', '.join(BARRIERS)} (and .peak())")
        v, lam = self.finite_values(split, metric), self.lambdas
        if kind == "mean":
            return float(v.max() - 0.5 * (v[0] + v[-1]))
        return float((v - ((1 - lam) * v[0] + lam * v[-1])).max())

    def peak(self, split: str | None = None, metric: str = "loss") -> float:
        """``max_λ`` of the metric (absolute, the AutoNEB/LLPF figure)."""
        return float(self.finite_values(split, metric).max())

    def accuracy_drop(self, split: str | None = None) -> float:
        """Relative accuracy drop along the path in percent (positive = worse than the best endpoint)."""
        acc = self.finite_values(split, "acc")
        best_end = max(acc[0], acc[-1])
        return float((best_end - acc.min()) / best_end * 100.0) if best_end > 0 else 0.0

    def summary(self) -> dict:
        """All barrier forms per split: loss (mean/interp/peak) and error (mean/interp), accuracy drop."""
        out = {}
        for s in self.splits:
            out[s] = {
                "barrier_mean_loss": self.barrier("mean", s),
                "barrier_interp_loss": self.barrier("interp", s),
                "peak_loss": self.peak(s),
                "barrier_mean_error": self.barrier("mean", s, "error"),
                "barrier_interp_error": self.barrier("interp", s, "error"),
                "accuracy_drop_pct": self.accuracy_drop(s),
                "endpoint_loss": [float(self.values(s)[0]), float(self.values(s)[-1])],
                "endpoint_acc": [float(self.values(s, "acc")[0]), float(self.values(s, "acc")[-1])],
                "midpoint_acc": float(np.interp(0.5, self.lambdas, self.values(s, "acc"))),
            }
        return out

    def to_json(self) -> dict:
        return {
            "lambdas": self.lambdas.tolist(),
            "bn": self.bn,
            "metrics": {s: {m: v.tolist() for m, v in d.items()} for s, d in self.metrics.items()},
            "summary": self.summary(),
            "info": self.info,
        }

    @classmethod
    def from_json(cls, d: dict) -> Curve:
        return cls(
            lambdas=np.asarray(d["lambdas"]),
            metrics={s: {m: np.asarray(v) for m, v in ms.items()} for s, ms in d["metrics"].items()},
            bn=d.get("bn", "reset"),
            info=d.get("info", {}),
        )
