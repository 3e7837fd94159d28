"""The tables the commands print."""

from __future__ import annotations

from rich.table import Table


def barrier_table(comparison, split: str = "test") -> Table:
    from ..experiments.compare import METHOD_LABELS

    table = Table(title=f"barriers on the {split} split (loss = cross-entropy; error = 1 − acc)")
    for col in ("method", "barrier_mean (loss)", "barrier_interp (loss)", "peak (loss)", "barrier_mean (error)",
                "midpoint acc", "merged acc"):
        table.add_column(col, justify="right" if col != "method" else "left")
    for m, c in comparison.curves.items():
        s = c.summary()[split]
        table.add_row(METHOD_LABELS[m], f"{s['barrier_mean_loss']:.4f}", f"{s['barrier_interp_loss']:.4f}",
                      f"{s['peak_loss']:.4f}", f"{s['barrier_mean_error']:.4f}", f"{100 * s['midpoint_acc']:.2f}%",
                      f"{100 * comparison.merged[m][split]['acc']:.2f}%")
    return table


def demo_table(results: dict) -> Table:
    from ..experiments.compare import METHOD_LABELS

    table = Table(title="barrier_mean on test loss (cross-entropy); merged = midpoint of the aligned pair")
    for col in ("method", "barrier_mean (test loss)", "barrier_interp (test loss)", "barrier_mean (test error)",
                "merged test acc"):
        table.add_column(col, justify="right" if col != "method" else "left")
    for m, s in results["barriers"].items():
        t = s["test"]
        table.add_row(METHOD_LABELS[m], f"{t['barrier_mean_loss']:.4f}", f"{t['barrier_interp_loss']:.4f}",
                      f"{t['barrier_mean_error']:.4f}", f"{100 * results['midpoint_merge'][m]['test']['acc']:.2f}%")
    return table
