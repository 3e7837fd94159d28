"""Writing a comparison's results.json, report.md and barrier.png."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..report import barrier_table, plot_curves
from ..report.tables import definitions, flat_at_endpoint
from ..diagnostics.compare import Comparison, method_label
from ..experiments.output import write_json


def write_comparison(directory: Path, comparison: Comparison, results: dict, title: str,
                     extra: Sequence[str] = ()) -> None:
    """Write results.json, barrier.png and report.md (with the further markdown lines ``extra`` at its end) into
    ``directory``."""
    write_json(directory / "results.json", results)
    plot_curves({method_label(m): c for m, c in comparison.curves.items()}, directory / "barrier.png", title=title,
                note=evaluated_line(comparison))
    (directory / "report.md").write_text("\n".join([comparison_report(comparison, results), *extra]))


def evaluated_line(comparison: Comparison) -> str:
    """"Evaluated — test: all 360 examples; train: …" — what every number of the comparison was measured on."""
    return "Evaluated — " + "; ".join(f"{s}: {comparison.evaluated(s)}" for s in ("test", "train") if s in comparison.examples)


def comparison_report(comparison: Comparison, results: dict) -> str:
    """The markdown report of a comparison (demo, barrier)."""
    ends = comparison.endpoints("test")
    curve = next(iter(comparison.curves.values()))
    limit = "none (every example)" if comparison.eval_limit is None else str(comparison.eval_limit)
    lines = [
        f"# modeconn — {results['task']}",
        "",
        f"{evaluated_line(comparison)}. `--eval-limit`: {limit}. Curves, endpoints, tables and merges all use these "
        "examples.",
        "",
        f"Endpoints (test): A loss {ends['A']['loss']:.4f}, acc {100 * ends['A']['acc']:.2f}%; "
        f"B loss {ends['B']['loss']:.4f}, acc {100 * ends['B']['acc']:.2f}%.",
        "",
        f"Loss = cross-entropy (nats); {len(curve.lambdas)} λ points, endpoints included; BatchNorm policy `{curve.bn}`.",
        "",
    ]
    for split in ("test", "train"):
        lines += [f"## {split} split", "", barrier_table({method_label(m): c for m, c in comparison.curves.items()}, split), ""]
    lines += ["## Definitions", "", definitions(), ""]
    lines += ["## Midpoint merge (λ = ½ of the aligned pair)", "", "| method | train acc | test acc | test loss |",
              "|---|---:|---:|---:|"]
    for m, d in comparison.merged.items():
        lines.append(f"| {method_label(m)} | {100 * d['train']['acc']:.2f}% | {100 * d['test']['acc']:.2f}% | "
                     f"{d['test']['loss']:.4f} |")
    naive = comparison.curves.get("naive")
    if naive is not None:
        lines += ["", "## Aligned vs naive (`barrier_mean`, test loss)", ""]
        nb = naive.barrier("mean", "test")
        for m, c in comparison.curves.items():
            if m != "naive":
                b = c.barrier("mean", "test")
                flat = (" — attained at an endpoint, so it is ½|L(A) − L(B)|, not a barrier; barrier_interp "
                        f"{c.barrier('interp', 'test'):.4f}" if flat_at_endpoint(c.summary()["test"]) else "")
                lines.append((f"- {method_label(m)}: {b:.4f} = {100 * b / nb:.1f}% of naive ({nb:.4f})" if nb > 0
                              else f"- {method_label(m)}: {b:.4f} (naive {nb:.4f})") + flat)
    lines += ["", "![loss and accuracy along the path](barrier.png)", ""]
    return "\n".join(lines)
