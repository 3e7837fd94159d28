"""Reports: figures and markdown/JSON summaries."""

from .figures import plot_curves, plot_path_losses, plot_path_pca
from .tables import barrier_table, markdown_table

__all__ = ["barrier_table", "markdown_table", "plot_curves", "plot_path_losses", "plot_path_pca"]
