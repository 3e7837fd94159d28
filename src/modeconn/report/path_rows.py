"""The table of found paths (one :func:`~modeconn.path.methods.path_row` per method) for results and reports."""

from __future__ import annotations

from typing import Any

from .tables import markdown_table


ROW_COLUMNS = [("method", "method"), ("complete", "complete"), ("grad_evals", "grad evals"), ("points", "points"),
               ("peak_train_loss", "peak train loss"), ("peak_over_endpoints", "peak − max endpoint"),
               ("dense_peak_train_loss", "dense peak (train)"), ("barrier_mean_train_loss", "barrier_mean (train)"),
               ("peak_test_loss", "peak test loss"), ("min_test_acc", "min test acc"), ("length", "path length")]


def rows_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`path_row` dicts (losses in nats, accuracies as fractions)."""
    return markdown_table([c for _, c in ROW_COLUMNS], [[r[k] for k, _ in ROW_COLUMNS] for r in rows])
