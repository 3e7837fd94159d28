"""The house drawn from the code's own imports: every import of ``src/modeconn`` (module level and inside functions)
points down the layer table below, and no two top-level packages import each other, directly or around a circle.

Layer table (higher imports lower; one layer may hold several packages, which may import each other as long as no
circle forms). It is ``../shared/DESIGN.md``'s drawing adapted to the tree as it is:

====  ==========================================================================================================
rank  top-level packages / modules of ``modeconn``
====  ==========================================================================================================
13    ``cli``, ``__main__``
12    ``recipes``                      every command's back-end
11    ``checkpoints``                  checkpoint kinds
10    ``experiments``                  registered experiments only; never a recipe
9     ``modeconn`` (``__init__``)      the public façade (``import modeconn as mc`` in an experiment)
8     ``report``, ``diagnostics``      figures, tables, "will these merge?", the alignment comparison
7     ``stream``, ``train``, ``moe``   out-of-core align/apply/merge; training (uses ``path``'s BatchNorm policies);
                                       dense → Mixture-of-Experts
6     ``path``                         interpolation, merge rules, LLPF, curves, AutoNEB, the path-method registry
5     ``identifiability``              realization / swap cost (reads ``match``'s LAP solvers, so above ``match``;
                                       DESIGN.md draws it below)
4     ``match``                        weight / activation / learned / dual matching, LAP solvers
3     ``symmetry``                     the group-action IR, tracing, HF family tables, absorption
2     ``io``                           safe reading and atomic writing of checkpoint directories, lazy checkpoints,
                                       Hugging Face directory reading, modeconn checkpoints as models, vocabularies
1     ``models``, ``data``, ``config``  leaves: architectures, datasets, the strict config base
0     ``_util``, ``registry``,         written once, imported by everyone
      ``checks``, ``errors``,
      ``nn_utils``
====  ==========================================================================================================
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "modeconn"

LAYERS: dict[str, int] = {
    "cli": 13, "__main__": 13,
    "recipes": 12,
    "checkpoints": 11,
    "experiments": 10,
    "modeconn": 9,
    "report": 8, "diagnostics": 8,
    "stream": 7, "train": 7, "moe": 7,
    "path": 6,
    "identifiability": 5,
    "match": 4,
    "symmetry": 3,
    "io": 2,
    "models": 1, "data": 1, "config": 1,
    "_util": 0, "registry": 0, "checks": 0, "errors": 0, "nn_utils": 0,
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_targets(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Every ``modeconn`` module ``tree`` imports, anywhere in it (functions included), as absolute names;
    ``from X import name`` counts as importing ``X.name`` where that is a module, else ``X``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "modeconn"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "modeconn":
                out |= {f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names}
    return out


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Module → the modeconn modules it imports."""
    files = sorted(root.rglob("*.py"))
    known = {module_name(p, root) for p in files}
    return {module_name(p, root): import_targets(ast.parse(p.read_text()), module_name(p, root),
                                                 p.name == "__init__.py", known) for p in files}


def unit(module: str) -> str:
    """The top-level package or module of ``module`` (``modeconn`` itself for the package's ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def unit_edges(graph: Mapping[str, set[str]]) -> dict[tuple[str, str], tuple[str, str]]:
    """(importing unit, imported unit) → one (module, imported module) that draws the edge."""
    edges = {}
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            if unit(a) != unit(b):
                edges.setdefault((unit(a), unit(b)), (a, b))
    return edges


def upward_imports(graph: Mapping[str, set[str]], layers: Mapping[str, int]) -> list[str]:
    """Every import from a lower layer into a higher one (and every unit missing from ``layers``), in words."""
    problems = []
    for (ua, ub), (a, b) in unit_edges(graph).items():
        if ua not in layers or ub not in layers:
            problems.append(f"{a} imports {b}: {ua if ua not in layers else ub} has no layer in the table")
        elif layers[ua] < layers[ub]:
            problems.append(f"{a} (layer {layers[ua]}, {ua}) imports {b} (layer {layers[ub]}, {ub}): upward")
    return problems


def unit_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The circles among top-level units: strongly connected components of more than one unit (Tarjan)."""
    succ: dict[str, set[str]] = {}
    for ua, ub in unit_edges(graph):
        succ.setdefault(ua, set()).add(ub)
        succ.setdefault(ub, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_points_up(graph):
    assert upward_imports(graph, LAYERS) == []


def test_no_circle_across_packages(graph):
    assert unit_cycles(graph) == []


def test_every_layer_entry_is_a_real_package_or_module(graph):
    units = {unit(m) for m in graph}
    assert set(LAYERS) - units == set()


def test_function_level_imports_are_seen():
    tree = ast.parse("def f():\n    from ..recipes.align import align\n")
    assert import_targets(tree, "modeconn.symmetry.spec", False, set()) == {"modeconn.recipes.align"}


# ------------------------------------------------------------------------------------------- negative controls
def test_negative_control_an_upward_edge_is_reported():
    graph = {"modeconn.symmetry.spec": {"modeconn.match.weight"}, "modeconn.match.weight": {"modeconn.symmetry"}}
    problems = upward_imports(graph, LAYERS)
    assert len(problems) == 1 and "modeconn.symmetry.spec" in problems[0] and "upward" in problems[0]


def test_negative_control_a_circle_is_reported():
    graph = {"modeconn.report.tables": {"modeconn.diagnostics.check"},
             "modeconn.diagnostics.check": {"modeconn.report"}}
    assert upward_imports(graph, LAYERS) == []  # one layer: only the circle check catches it
    assert unit_cycles(graph) == [["diagnostics", "report"]]


def test_negative_control_an_unlisted_package_is_reported():
    graph = {"modeconn.newpkg.x": {"modeconn.io"}}
    assert "no layer" in upward_imports(graph, LAYERS)[0]


def test_negative_control_the_real_tree_with_one_upward_import_fails(graph):
    broken = {**graph, "modeconn.symmetry.absorb": graph["modeconn.symmetry.absorb"] | {"modeconn.stream"}}
    assert any("modeconn.symmetry.absorb" in p for p in upward_imports(broken, LAYERS))
