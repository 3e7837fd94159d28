"""Reports: figures and markdown/JSON summaries."""

from .figures import plot_curves
from .tables import barrier_table, markdown_table

__all__ = ["barrier_table", "markdown_table", "plot_curves"]
