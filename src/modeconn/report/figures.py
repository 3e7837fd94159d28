"""Figures (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..path import Curve  # noqa: E402


def plot_curves(curves: Mapping[str, Curve], path: str | Path, title: str = "") -> Path:
    """Loss (top) and accuracy (bottom) vs λ, one column per split, one line per method.

    ``curves``: method label → Curve (all with the same splits). Writes a PNG to ``path``.
    """
    splits = next(iter(curves.values())).splits
    fig, axes = plt.subplots(2, len(splits), figsize=(4.8 * len(splits), 7), squeeze=False, sharex=True)
    for col, split in enumerate(splits):
        for label, c in curves.items():
            axes[0, col].plot(c.lambdas, c.values(split, "loss"), marker="o", ms=3, label=label)
            axes[1, col].plot(c.lambdas, 100 * c.values(split, "acc"), marker="o", ms=3, label=label)
        axes[0, col].set_title(f"{split}")
        axes[0, col].set_ylabel("loss (cross-entropy, nats)")
        axes[1, col].set_ylabel("accuracy (%)")
        axes[1, col].set_xlabel("λ   (0 = model A, 1 = model B)")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
    axes[0, 0].legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
