"""report.md, check.png and the printed summary of ``modeconn check`` (from its results dict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..report import markdown_table

_PREDICTIONS = (("unaligned", "merged as they are (identity)"), ("weight_matched", "after weight matching"),
                ("activation_matched", "after activation matching"),
                ("twin", "an independently trained twin of A, merged as it is"))


def _f(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "—"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _evaluated(results: dict[str, Any]) -> str:
    """Which points between the endpoints of an interpolation path were evaluated (the aligned paths' midpoints)."""
    mid = results["prediction"].get("endpoint_features", {}).get("midpoint_barrier", {})
    label = dict(_PREDICTIONS)
    names = [label.get(k, k.replace("_", " ")) for k, v in mid.items() if v is not None]
    if not names:
        return "No point between the endpoints of an interpolation path was evaluated."
    return (f"Between the endpoints only the midpoint of each path was evaluated ({'; '.join(names)}), on the "
            "evaluation examples: a one-point measurement the predictions read.")


def _yes_no(x: bool | None) -> str:
    return "—" if x is None else "yes" if x else "no"


def _interval(p: dict[str, Any]) -> str:
    return f"predicted barrier_mean {p['barrier_mean']:.3f} nats, interval {p['low']:.3f}–{p['high']:.3f}"


_ALIGNED = (("weight_matched", "weight matching"), ("activation_matched", "activation matching"))


def verdict(results: dict[str, Any]) -> str:
    """One line: go / no-go as the models are and, for a pair predicted not to merge as it is, "GO after" the first
    alignment predicted below the threshold, else the predicted barriers after alignment (or not applicable, and
    why); the recommended method."""
    p, rec = results["prediction"], results["recommendation"]
    pair = bool(results["pair"])
    what = "merging these two" if pair else "merging A with an independently trained twin of it"
    tail = f"; recommended: {rec['method']} — {rec['advice']}"
    if p["go"] is None:
        return (f"NOT APPLICABLE: whether {what} works without alignment cannot be predicted — "
                f"{p['not_applicable']}; no barrier is predicted. Recommended: {rec['method']} — {rec['advice']}")
    own = p["unaligned" if pair else "twin"]
    as_is = f"as {'they are' if pair else 'it is'} ({_interval(own)}; go below {p['threshold']})"
    if p["go"]:
        return f"GO: {what} {as_is} is predicted to work{tail}"
    after = next(((k, label) for k, label in _ALIGNED if pair and p[k]["barrier_mean"] is not None
                  and p[k]["barrier_mean"] < p["threshold"]), None)
    if after is not None:
        return (f"NO-GO as they are, GO after {after[1]}: {what} is predicted to fail {as_is} and to work after "
                f"{after[1]} ({_interval(p[after[0]])}){tail}")
    if not pair:
        return f"NO-GO: {what} is predicted to fail {as_is}{tail}"
    aligned = "; ".join(f"after {label} {_interval(p[k])}" if p[k]["barrier_mean"] is not None else
                        f"after {label} not predicted" for k, label in _ALIGNED)
    return f"NO-GO as they are: {what} is predicted to fail {as_is}; {aligned}{tail}"


def summary_lines(results: dict[str, Any]) -> list[str]:
    """What the command prints: the verdict, the relationship, the predicted barriers (a table row fits in 80
    columns; a prediction that does not exist is "n/a" with its reason)."""
    lines = [verdict(results)]
    if results["pair"]:
        rel = results["pair"]["relationship"]
        lines.append(f"relationship: {rel['name']} ({rel['advice']})")
    for key, label in _PREDICTIONS:
        if key in results["prediction"]:
            p = results["prediction"][key]
            if p["barrier_mean"] is None:
                lines.append(f"  {key:<19} B_mean     n/a  ({p['not_applicable']})")
                continue
            lines.append(f"  {key:<19} B_mean {p['barrier_mean']:7.3f}  [{p['low']:.3f}, {p['high']:.3f}]")
    lines.append("B_mean: predicted test-loss barrier_mean (nats) [5 %–95 % interval of the held-out residuals]")
    return lines


def _pair_sections(pair: dict[str, Any]) -> list[str]:
    f = pair["features"]
    spaces = [[s, v["n"], _f(v["identity_ratio"]), _f(v["q_identity"]), _f(v["q_weight"]), _f(v["q_optimal"]), _f(v["cka"]),
               "; ".join(dict.fromkeys(v.get("undefined", {}).values()))] for s, v in pair["spaces"].items()]
    weights = [[k, _f(v["identity"]), _f(v["weight_matched"]), v.get("undefined") or ""] for k, v in pair["weights"].items()]
    return [
        "## Relationship", "",
        f"**{pair['relationship']['name']}** — {pair['relationship']['advice']}. Mean identity weight cosine "
        f"{_f(f['weight_cosine_identity'])} (after weight matching {_f(f['weight_cosine_matched'])}); mean identity / "
        f"optimal activation-matching ratio {_f(f['identity_ratio'])}; mean linear CKA {_f(f['cka'])}; permutation "
        f"share q̄(optimal permutation) / q̄(optimal orthogonal map) {_f(f['permutation_share'])}.", "",
        "## Per space (activations on training data)", "",
        "identity ratio: activation-matching objective of the identity / of the optimal permutation; q: mean "
        "correlation of matched units under the identity, weight matching's and the optimal permutation; CKA: "
        "linear CKA of the two representations.", "",
        markdown_table(["space", "units", "identity ratio", "q identity", "q weight matching", "q optimal", "CKA",
                        "undefined"], spaces),
        "", "## Per layer: weight cosine of A and B", "",
        markdown_table(["tensor", "cosine at the identity", "cosine after weight matching", "undefined"], weights), ""]


def report(results: dict[str, Any]) -> str:
    """The markdown report of one check."""
    p = results["prediction"]
    preds = [[label, "not applicable", p[k]["not_applicable"]] if p[k]["barrier_mean"] is None else
             [label, _f(p[k]["barrier_mean"]), f"{_f(p[k]['low'])}–{_f(p[k]['high'])}"] for k, label in _PREDICTIONS if k in p]
    ends = [[i, _f(e["test_loss"]), _f(100 * e["test_acc"], 2)] for i, e in zip("AB", results["endpoints"], strict=False)]
    layers = [[n, v["fan_in"], v["neurons"], "yes" if v["asymmetric"] else "no", _f(v["k"]), _f(v["coherence"], 2),
               _f(v["relative_swap_cost"]), _f(v["swap_positive_fraction"]), _yes_no(v["identity_optimal"]),
               _f(v["relative_margin"]), _f(v["center_nn_ratio"]), v.get("undefined") or ""]
              for n, v in results["layers"].items()]
    lines = [
        "# modeconn check", "", f"Models: {', '.join(results['models'])}; dataset {results['dataset']}; "
        f"{results['seconds']:.1f} s. {_evaluated(results)}", "",
        f"**{verdict(results)}**", "",
        "## Predicted test-loss barrier_mean (nats)", "",
        "From the stated predictor (modeconn.diagnostics.predictor: B̂ = exp(intercept) · x^slope · Π z^c; "
        "a pair, as they are and after an alignment: x = the path's barrier over its endpoints and midpoint, "
        "measured on the evaluation examples; twin: x = min relative swap cost of A's layers, z: the endpoints' mean "
        "test loss, the entropy of the training labels and their difference), one line per prediction, fitted by "
        "`modeconn experiment check-calibration`; interval: conformal 5 %–95 % bounds of the residuals on families "
        "each line was not fitted on (for a pair widened by the midpoint's sampling error).", "",
        markdown_table(["interpolation", "predicted barrier_mean", "interval"], preds), "",
        markdown_table(["model", "test loss on the evaluated examples (nats)", "test accuracy %"], ends), ""]
    if results["pair"]:
        lines += _pair_sections(results["pair"])
    lines += [
        "## Per layer of A: symmetry breaking on the data (realization costs, docs/methods.md §1)", "",
        "k: PCA dimensions of the layer's inputs explaining 90 % of the variance (estimated intrinsic dimension); ν: "
        "subspace coherence ν(U); relative swap cost: median swap cost Δ / median self cost (0: every neuron realises "
        "every feature equally cheaply, symmetry unbroken); identity optimal: the identity is the cheapest assignment "
        "of features to neurons; margin: (second-best − best assignment cost) / (neurons · median self cost); centers: "
        "mean nearest-neighbour distance of projected fixed centers Uᵀf_i / their mean norm.", "",
        markdown_table(["layer", "fan-in", "neurons", "W-asymmetric", "k", "ν(U)", "relative swap cost", "fraction Δ > 0",
                        "identity optimal", "margin", "centers", "undefined"], layers), "", "![diagnostics](check.png)", ""]
    return "\n".join(lines)


def _plot_swap_costs(ax, layers: dict[str, Any]) -> None:
    """Per layer of A, the relative swap cost; where every defined cost is 0 (a standard network: nothing breaks its
    permutation symmetry) the panel says so instead of drawing bars of height 0."""
    costs = [np.nan if v["relative_swap_cost"] is None else v["relative_swap_cost"] for v in layers.values()]
    ax.set_title("per layer of A: relative swap cost")
    defined = [c for c in costs if not np.isnan(c)]
    if not defined or not any(defined):
        why = ("no layer has a defined swap cost" if not defined else
               "0 in every layer: no symmetry breaking\n(a standard network: every unit\npermutation keeps the function)")
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    ax.bar(range(len(costs)), costs)
    ax.set_xticks(range(len(costs)), list(layers), rotation=30, fontsize=7)


def plot(results: dict[str, Any], path: Path) -> None:
    """Predicted barriers with intervals; per space q and CKA (pair); per layer relative swap cost."""
    from ..report.figures import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    p = results["prediction"]
    keys = [k for k, _ in _PREDICTIONS if k in p and p[k]["barrier_mean"] is not None]
    mid = [p[k]["barrier_mean"] for k in keys]
    err = [[m - p[k]["low"] for k, m in zip(keys, mid, strict=True)], [p[k]["high"] - m for k, m in zip(keys, mid, strict=True)]]
    axes[0].errorbar(range(len(keys)), mid, yerr=err, fmt="o", capsize=4)
    axes[0].axhline(p["threshold"], color="grey", ls=":", label="go threshold")
    axes[0].set_xticks(range(len(keys)), keys, rotation=20)
    axes[0].set_yscale("log")
    axes[0].set_title("predicted barrier_mean (test loss, nats)")
    axes[0].legend()
    if results["pair"]:
        sp = results["pair"]["spaces"]
        x = np.arange(len(sp))
        for i, key in enumerate(("q_identity", "q_weight", "q_optimal", "cka")):
            axes[1].bar(x + 0.2 * i - 0.3, [np.nan if v[key] is None else v[key] for v in sp.values()], 0.2, label=key)
        axes[1].set_xticks(x, list(sp), rotation=30, fontsize=7)
        axes[1].legend(fontsize=7)
    axes[1].set_title("per space: mean unit correlation q, CKA")
    _plot_swap_costs(axes[2], results["layers"])
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
