"""Writing a comparison's results.json, report.md and barrier.png."""

from __future__ import annotations

from pathlib import Path

from ..report import barrier_table, plot_curves
from .compare import METHOD_LABELS, Comparison
from .output import write_json


def write_comparison(directory: Path, comparison: Comparison, results: dict, title: str) -> None:
    """Write results.json, barrier.png and report.md into ``directory``."""
    write_json(directory / "results.json", results)
    plot_curves({METHOD_LABELS[m]: c for m, c in comparison.curves.items()}, directory / "barrier.png", title=title)
    (directory / "report.md").write_text(comparison_report(comparison, results))


def comparison_report(comparison: Comparison, results: dict) -> str:
    """The markdown report of a comparison (demo, barrier)."""
    ends = results["endpoints"]
    lines = [
        f"# modeconn — {results['task']}",
        "",
        f"Endpoints: A test acc {100 * ends['A']['acc']:.2f}%, B test acc {100 * ends['B']['acc']:.2f}%.",
        "",
        "Barrier definitions: `barrier_mean` = max_λ L(λ) − ½(L(0)+L(1)) (Frankle et al. 2020); "
        "`barrier_interp` = max_λ [L(λ) − ((1−λ)L(0)+λL(1))] (Entezari et al. 2022); `peak` = max_λ L(λ). "
        f"Loss = cross-entropy (nats); {len(next(iter(comparison.curves.values())).lambdas)} λ points; "
        f"BatchNorm policy `{next(iter(comparison.curves.values())).bn}`.",
        "",
    ]
    for split in ("test", "train"):
        lines += [f"## {split} split", "", barrier_table({METHOD_LABELS[m]: c for m, c in comparison.curves.items()}, split), ""]
    lines += ["## Midpoint merge (λ = ½ of the aligned pair)", "", "| method | train acc | test acc | test loss |",
              "|---|---:|---:|---:|"]
    for m, d in comparison.merged.items():
        lines.append(f"| {METHOD_LABELS[m]} | {100 * d['train']['acc']:.2f}% | {100 * d['test']['acc']:.2f}% | "
                     f"{d['test']['loss']:.4f} |")
    naive = comparison.curves.get("naive")
    if naive is not None:
        lines += ["", "## Aligned vs naive (`barrier_mean`, test loss)", ""]
        nb = naive.barrier("mean", "test")
        for m, c in comparison.curves.items():
            if m != "naive":
                b = c.barrier("mean", "test")
                lines.append(f"- {METHOD_LABELS[m]}: {b:.4f} = {100 * b / nb:.1f}% of naive ({nb:.4f})" if nb > 0
                             else f"- {METHOD_LABELS[m]}: {b:.4f} (naive {nb:.4f})")
    lines += ["", "![loss and accuracy along the path](barrier.png)", ""]
    return "\n".join(lines)
