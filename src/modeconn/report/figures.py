"""Figures (matplotlib, headless Agg backend).

matplotlib is imported on the first figure (:func:`pyplot`), not with this module: commands that draw nothing
(streaming align / merge) never pay its import."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Mapping

import numpy as np
import torch

from ..path import Curve, PathCurve
from ..path import Path as PathLike


def pyplot():
    """``matplotlib.pyplot`` on the headless Agg backend (imported on the first call)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


ZOOM_RATIO = 4.0
"""The figure gets a zoom row (the lower curves on their own loss scale, still from 0) when, in some split, the
highest curve's peak is this many times every other curve's peak (aligned curves beside a naive peak)."""
MIN_ACC_SPAN = 10.0
"""The accuracy axes span at least this many percentage points (ending at 100 %), so a small drop looks small."""


def _finite(values) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    return v[np.isfinite(v)]


def _loss_top(curves: Mapping[str, Curve], splits) -> float:
    """5% above the highest finite loss of ``curves`` on ``splits`` (1.0 when there is none): the top of a loss axis
    that starts at 0."""
    values = np.concatenate([_finite(c.values(s, "loss")) for c in curves.values() for s in splits] or [np.zeros(0)])
    top = float(values.max()) if values.size else 0.0
    return 1.05 * top if top > 0 else 1.0


def _acc_bottom(curves: Mapping[str, Curve], splits) -> float:
    """The bottom of every accuracy axis (top 100 %): a point below the lowest accuracy, at most 100 − MIN_ACC_SPAN."""
    values = np.concatenate([_finite(100 * c.values(s, "acc")) for c in curves.values() for s in splits] or [np.zeros(0)])
    low = float(values.min()) if values.size else 0.0
    return max(0.0, min(np.floor(low) - 1.0, 100.0 - MIN_ACC_SPAN))


def _low_curves(curves: Mapping[str, Curve], splits) -> list[str]:
    """The labels of the curves a zoom row shows (empty when no curve dwarfs the others): all but the highest curve,
    when in some split its peak loss is :data:`ZOOM_RATIO` times every other curve's."""
    if len(curves) < 2:
        return []
    for split in splits:
        peaks = {label: float(v.max()) for label, c in curves.items() if (v := _finite(c.values(split, "loss"))).size}
        if len(peaks) < 2:
            continue
        highest = max(peaks, key=peaks.get)
        others = [label for label in peaks if label != highest]
        if peaks[highest] > ZOOM_RATIO * max(max(peaks[o] for o in others), 1e-12):
            return others
    return []


def _plot_row(axes, curves: Mapping[str, Curve], splits, metric: str, colors: dict[str, str], ms: float) -> None:
    """One row of panels: ``metric`` ("loss" or "acc", in %) of ``curves`` per split, in their fixed colours."""
    for ax, split in zip(axes, splits, strict=True):
        for label, c in curves.items():
            scale = 100.0 if metric == "acc" else 1.0
            ax.plot(c.lambdas, scale * c.values(split, metric), marker="o", ms=ms, color=colors[label], label=label)
            if metric == "loss" and isinstance(c, PathCurve) and split == c.continuity_split and len(c.segment_peaks):
                mid = (c.lambdas[:-1] + c.lambdas[1:]) / 2
                ax.plot(mid, c.segment_peaks, "x", ms=3, color=colors[label], alpha=0.6)
        ax.grid(alpha=0.3)


def loss_acc_figure(curves: Mapping[str, Curve], splits: tuple[str, ...] | list[str], xlabel: str, title: str = "",
                    ms: float = 3, note: str = ""):
    """Loss (top) and accuracy (bottom) vs each curve's ``lambdas``, one column per split, one line per curve;
    a PathCurve with a continuity check also gets its segment sub-point peaks (×) on its continuity split.

    Honest scales: every loss axis starts at 0 and is shared by the splits; every accuracy axis ends at 100 % and
    spans at least :data:`MIN_ACC_SPAN` points. When one curve dwarfs the others (:func:`_low_curves`) a middle
    row shows the others alone, on their own loss scale from 0. One legend for the whole figure; ``note`` (what
    was evaluated) is the title's second line. Returns the matplotlib Figure (rows: loss, [zoom,] accuracy;
    one column per split)."""
    plt = pyplot()
    low = _low_curves(curves, splits)
    rows = [("loss", curves)] + ([("zoom", {k: curves[k] for k in low})] if low else []) + [("acc", curves)]
    fig, axes = plt.subplots(len(rows), len(splits), figsize=(5 * len(splits), 3.4 * len(rows) + 0.8), squeeze=False,
                             sharex=True)
    colors = {label: f"C{i}" for i, label in enumerate(curves)}
    for r, (kind, shown) in enumerate(rows):
        _plot_row(axes[r], shown, splits, "acc" if kind == "acc" else "loss", colors, ms)
        for col, ax in enumerate(axes[r]):
            if kind == "acc":
                ax.set_ylim(_acc_bottom(curves, splits), 100.5)
                ax.set_ylabel("accuracy (%)")
            else:
                ax.set_ylim(0, _loss_top(shown, splits))
                ax.set_ylabel("loss (cross-entropy, nats)" if kind == "loss" else "loss, zoom (nats)")
            if r == 0:
                ax.set_title(splits[col])
            if kind == "zoom":
                ax.set_title(f"{splits[col]}: zoom on " + ", ".join(low), fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    handles = [plt.Line2D([], [], color=colors[label], marker="o", ms=ms, label=label) for label in curves]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    fig.suptitle("\n".join(t for t in (title, note) if t), fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def _loss_acc_grid(curves: Mapping[str, Curve], splits: tuple[str, ...] | list[str], xlabel: str, path: str | Path,
                   title: str, ms: float, note: str = "") -> Path:
    """:func:`loss_acc_figure` saved as a PNG at ``path`` (110 dpi)."""
    fig = loss_acc_figure(curves, splits, xlabel, title, ms, note)
    path = Path(path)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def plot_curves(curves: Mapping[str, Curve], path: str | Path, title: str = "", note: str = "") -> Path:
    """Loss (top) and accuracy (bottom) vs λ, one column per split, one line per method.

    ``curves``: method label → Curve (all with the same splits); ``note``: a second title line (what was
    evaluated, e.g. the ``--eval-limit``). Writes a PNG to ``path``.
    """
    return _loss_acc_grid(curves, next(iter(curves.values())).splits, "λ   (0 = model A, 1 = model B)", path,
                          title, ms=3, note=note)


def plot_path_losses(curves: Mapping[str, PathCurve], path: str | Path, title: str = "",
                     splits: tuple[str, ...] = ("train", "test"), note: str = "") -> Path:
    """Loss (top) and accuracy (bottom) along each path vs the normalised arc length t, one column per split,
    one line per method; the continuity split's panel also marks each path's sub-point peaks (×) per segment.

    ``curves``: method label → PathCurve (from :meth:`Path.evaluate`); ``note``: a second title line (what was
    evaluated). Writes a PNG to ``path``.
    """
    splits = tuple(s for s in splits if s in next(iter(curves.values())).splits)
    return _loss_acc_grid(curves, splits, "t: normalised arc length (0 = model A, 1 = model B)", path, title, ms=2,
                          note=note)


def plot_path_pca(paths: Mapping[str, PathLike], path: str | Path, title: str = "", keys: list[str] | None = None) -> Path:
    """The paths projected on the first two principal components of all their points (scikit-learn PCA,
    centred at the mean point), endpoints marked A and B. ``paths``: label → :class:`~modeconn.path.Path`;
    ``keys``: the coordinates (default: every floating tensor shared by the first point of each path)."""
    from sklearn.decomposition import PCA

    first = {label: p[0] for label, p in paths.items()}
    keys = keys or sorted(k for k, v in next(iter(first.values())).items() if v.is_floating_point())
    flat = {label: np.stack([torch.cat([pt[k].detach().float().reshape(-1) for k in keys]).numpy() for pt in p])
            for label, p in paths.items()}
    pca = PCA(n_components=2).fit(np.concatenate(list(flat.values())))
    fig, ax = pyplot().subplots(figsize=(6, 5))
    for label, pts in flat.items():
        z = pca.transform(pts)
        ax.plot(z[:, 0], z[:, 1], marker="o", ms=2, label=label)
    ends = pca.transform(next(iter(flat.values()))[[0, -1]])
    for (x, y), name in zip(ends, "AB", strict=False):
        ax.annotate(name, (x, y), fontsize=12, fontweight="bold")
    ev = pca.explained_variance_ratio_
    ax.set_xlabel(f"PC1 ({100 * ev[0]:.1f}% of variance)")
    ax.set_ylabel(f"PC2 ({100 * ev[1]:.1f}% of variance)")
    ax.grid(alpha=0.3)
    return _save_axes(fig, ax, path, title)


def plot_peak_bars(bars: Mapping[str, Mapping[str, tuple[float, float]]], path: str | Path, ylabel: str,
                   title: str = "") -> Path:
    """Grouped bars: one group per key of ``bars`` (e.g. "architecture/pair"), one bar per method with its value
    and error bar (``{group: {method: (value, std)}}``, every group with the same methods). Symmetric-log y axis
    (linear within ±0.01), so a large barrier and small peaks are readable side by side. Writes a PNG to ``path``."""
    groups = list(bars)
    methods = list(next(iter(bars.values())))
    width = 0.8 / len(methods)
    fig, ax = pyplot().subplots(figsize=(max(6.0, 0.9 * len(groups) + 2), 4.5))
    x = np.arange(len(groups))
    for i, m in enumerate(methods):
        vals = [bars[g][m][0] for g in groups]
        errs = [bars[g][m][1] for g in groups]
        ax.bar(x + (i - (len(methods) - 1) / 2) * width, vals, width, yerr=errs, capsize=2, label=m)
    ax.set_yscale("symlog", linthresh=0.01)
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xticks(x, groups, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    return _save_axes(fig, ax, path, title)


def plot_peak_vs_budget(curves: Mapping[str, Mapping[str, list[tuple[int, float, float]]]], path: str | Path,
                        margin: float) -> Path:
    """One panel per key of ``curves`` (a pair of endpoints): per method its dense peak over the higher endpoint
    against the budget, ``{panel: {method: [(budget, mean, std), …]}}`` (log-x, symmetric-log y), with the low-loss
    ``margin`` as a dashed line. Writes a PNG to ``path``."""
    panels = list(curves) or ["(no paths)"]
    fig, axes = pyplot().subplots(1, len(panels), figsize=(4.0 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for method, pts in curves.get(panel, {}).items():
            b, m, s = (np.asarray(v, dtype=float) for v in zip(*pts, strict=True))
            ax.errorbar(b, m, yerr=s, marker="o", capsize=2, label=method)
        ax.axhline(margin, color="black", ls="--", lw=0.8, label=f"endpoints + {margin:g}")
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_xlabel("gradient evaluations")
        ax.set_title(panel, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("dense peak train loss − max endpoint")
    fig.tight_layout()
    fig.savefig(Path(path), dpi=110)
    pyplot().close(fig)
    return Path(path)


def _save_axes(fig, ax, path: str | Path, title: str) -> Path:
    """Legend and ``title`` on the single axes ``ax``, then ``fig`` saved as a PNG at ``path`` (110 dpi) and closed."""
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
