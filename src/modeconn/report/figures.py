"""Figures (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from ..path import Curve, PathCurve  # noqa: E402
from ..path import Path as PathLike  # noqa: E402


def _loss_acc_grid(curves: Mapping[str, Curve], splits: tuple[str, ...] | list[str], xlabel: str, path: str | Path,
                   title: str, ms: float) -> Path:
    """Loss (top) and accuracy (bottom) vs each curve's ``lambdas``, one column per split, one line per curve;
    a PathCurve with a continuity check also gets its segment sub-point peaks (×) on its continuity split."""
    fig, axes = plt.subplots(2, len(splits), figsize=(5 * len(splits), 7), squeeze=False, sharex=True)
    for col, split in enumerate(splits):
        for label, c in curves.items():
            (line,) = axes[0, col].plot(c.lambdas, c.values(split, "loss"), marker="o", ms=ms, label=label)
            axes[1, col].plot(c.lambdas, 100 * c.values(split, "acc"), marker="o", ms=ms, label=label)
            if isinstance(c, PathCurve) and split == c.continuity_split and len(c.segment_peaks):
                mid = (c.lambdas[:-1] + c.lambdas[1:]) / 2
                axes[0, col].plot(mid, c.segment_peaks, "x", ms=3, color=line.get_color(), alpha=0.6)
        axes[0, col].set_title(split)
        axes[0, col].set_ylabel("loss (cross-entropy, nats)")
        axes[1, col].set_ylabel("accuracy (%)")
        axes[1, col].set_xlabel(xlabel)
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_curves(curves: Mapping[str, Curve], path: str | Path, title: str = "") -> Path:
    """Loss (top) and accuracy (bottom) vs λ, one column per split, one line per method.

    ``curves``: method label → Curve (all with the same splits). Writes a PNG to ``path``.
    """
    return _loss_acc_grid(curves, next(iter(curves.values())).splits, "λ   (0 = model A, 1 = model B)", path,
                          title, ms=3)


def plot_path_losses(curves: Mapping[str, PathCurve], path: str | Path, title: str = "",
                     splits: tuple[str, ...] = ("train", "test")) -> Path:
    """Loss (top) and accuracy (bottom) along each path vs the normalised arc length t, one column per split,
    one line per method; the continuity split's panel also marks each path's sub-point peaks (×) per segment.

    ``curves``: method label → PathCurve (from :meth:`Path.evaluate`). Writes a PNG to ``path``.
    """
    splits = tuple(s for s in splits if s in next(iter(curves.values())).splits)
    return _loss_acc_grid(curves, splits, "t: normalised arc length (0 = model A, 1 = model B)", path, title, ms=2)


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
    fig, ax = plt.subplots(figsize=(6, 5))
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
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
