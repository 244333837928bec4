"""Layers that only point down: the import graph of `autospec/` has no cycle, and no module imports a
module of a higher layer or of a sibling package (issue 14, item 1).

Every `import` / `from ... import` counts — top level, inside functions, under TYPE_CHECKING — exactly as
/work/shared/hooks/import_cycles.py reads them (an import of a module's own parent package is not an
edge). A new module must be placed in `LAYERS` (the test fails on an unplaced one).

The layers, lowest first (a module may import its own layer — within one group for the siblings — and
any lower one):

0. foundation — `errors`, `contract` (the records engines, the loop and policies exchange), `latency`,
   `telemetry`, `progress` (duration parsing and progress bars; `config` parses with it), `hub` (model
   hub ids; `config` and `artifacts` resolve pairs with it), `models` (the package: the bundled pair's
   paths, data only), `early_exit` (FASER's token-wise early-exit rules: pure functions and their
   parameter model, applied by the torch engine and named by strategies, so below both).
1. siblings — `workloads/`, `policies/`, `engines/` (torch, llama, sim, sm_split; the simulator takes
   fitted data, it does not read or fit run directories). None imports another.
2. records — `config`, `artifacts`, `calibration` (the profile's tables and fit/models.json as data),
   `summaries` (the eval and tune summary.json shapes their readers check).
   [chosen] Intended as foundation, but `config.PromptSpec.dataset_selection` builds a
   `workloads.datasets.DatasetSelection`, and `artifacts` reads `config.SCHEMA_VERSION`, so they sit just
   above the siblings; nothing below them reads a run directory.
3. serving — `serving/` (the loop, its step and state, the records it writes (`serving/records.py`),
   FASER's chunk-size rule the step applies (`serving/frontier.py`: not a policy), and runners:
   `serving/vllm/` runs vLLM — which schedules itself and so is not an `Engine` the loop can drive — with
   an online length policy in its scheduler; `serving/factory.py` builds the torch engine and its
   inputs), `strategy` (composes policies into what the loop runs).
4. stages — `profile`, `fit` (also builds a simulator from a run directory: `FittedSimEngine.from_dirs`,
   which may fit in memory), `tune`, `confirm` (tune's real-engine confirmation), `evaluate`, `deploy`,
   `report/`, `gate`, `pipeline`, `generate` (`autospec generate`'s runner). The training tools live
   outside the package (`training/`).
5. cli — `cli`, `__main__`.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = "autospec"
ROOT = Path(__file__).resolve().parent.parent / PKG

# (layer name, whether its groups are isolated from each other, {module or package: group}).
LAYERS: list[tuple[str, bool, dict[str, str]]] = [
    ("foundation", False, {m: "foundation" for m in (
        "autospec", "autospec.errors", "autospec.contract", "autospec.latency", "autospec.telemetry",
        "autospec.progress", "autospec.hub", "autospec.models", "autospec.early_exit")}),
    ("siblings", True, {"autospec.workloads": "workloads", "autospec.policies": "policies",
                        "autospec.engines": "engines"}),
    ("records", False, {m: "records" for m in ("autospec.config", "autospec.artifacts", "autospec.calibration",
                                               "autospec.summaries")}),
    ("serving", False, {m: "serving" for m in ("autospec.serving", "autospec.strategy")}),
    ("stages", False, {m: "stages" for m in (
        "autospec.profile", "autospec.fit", "autospec.tune", "autospec.evaluate", "autospec.deploy",
        "autospec.report", "autospec.gate", "autospec.pipeline", "autospec.generate", "autospec.confirm")}),
    ("cli", False, {"autospec.cli": "cli", "autospec.__main__": "cli"}),
]


def modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        name = ".".join(f.relative_to(ROOT.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def placement(name: str) -> tuple[int, str, str] | None:
    """(layer index, layer name, group) of the longest table entry naming `name` or a package holding it;
    the root package's entry names only the root itself."""
    best = None
    for index, (layer, _, groups) in enumerate(LAYERS):
        for prefix, group in groups.items():
            if name == prefix or (prefix != PKG and name.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), (index, layer, group))
    return None if best is None else best[1]


def imports(mods: dict[str, Path]) -> list[tuple[str, str, int, str]]:
    """(importer, imported module, line, source of the import statement) for every intra-package import."""
    edges = []
    for cur, path in sorted(mods.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = node.module or ""
                if node.level:
                    parts = cur.split(".") if path.name == "__init__.py" else cur.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                names = {base} | {f"{base}.{a.name}" for a in node.names}
            else:
                continue
            targets = set()
            for n in names:
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and (n == PKG or n.startswith(PKG + ".")):
                    targets.add(n)
            for t in sorted(targets):
                # a module importing its own package's __init__ face is not an edge (as the hook script)
                if t != cur and not cur.startswith(t + "."):
                    edges.append((cur, t, node.lineno, ast.unparse(node)))
    return edges


def cycles(mods: dict[str, Path], edges: list[tuple[str, str, int, str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for src, dst, _, _ in edges:
        graph[src].add(dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def violations(mods: dict[str, Path], edges: list[tuple[str, str, int, str]]) -> list[str]:
    isolated = {name for name, iso, _ in LAYERS if iso}
    out = []
    for src, dst, line, text in edges:
        a, b = placement(src), placement(dst)
        if a is None or b is None:
            continue  # reported by test_every_module_is_placed
        where = f"{mods[src].relative_to(ROOT.parent)}:{line} `{text}`"
        if b[0] > a[0]:
            out.append(f"{src} ({a[1]}) imports {dst} ({b[1]}, a higher layer): {where}")
        elif b[0] == a[0] and a[1] in isolated and a[2] != b[2]:
            out.append(f"{src} ({a[2]}) imports {dst} ({b[2]}, a sibling package): {where}")
    return out


def test_every_module_is_placed():
    unplaced = sorted(m for m in modules() if placement(m) is None)
    assert not unplaced, f"modules missing from tests/test_layers.py LAYERS: {unplaced}"


def test_no_import_cycles():
    mods = modules()
    found = cycles(mods, imports(mods))
    assert not found, "import cycles (modules that import each other in a loop):\n" + "\n".join(
        ", ".join(c) for c in found)


def test_imports_only_point_down():
    mods = modules()
    bad = violations(mods, imports(mods))
    assert not bad, "imports that do not point down:\n" + "\n".join(bad)


def test_the_checks_catch_an_upward_import_a_sibling_import_and_a_cycle():
    """The checks themselves on a made-up graph: each kind of fault is reported, naming the import."""
    mods = {m: ROOT / (m.replace(".", "/") + ".py") for m in (
        "autospec.errors", "autospec.engines.sim", "autospec.policies.static", "autospec.fit", "autospec.profile")}
    edges = [("autospec.errors", "autospec.fit", 3, "from autospec.fit import load_fit"),
             ("autospec.engines.sim", "autospec.policies.static", 9, "from autospec.policies import static"),
             ("autospec.fit", "autospec.profile", 1, "import autospec.profile"),
             ("autospec.profile", "autospec.fit", 2, "import autospec.fit")]
    bad = violations(mods, edges)
    assert len(bad) == 2
    assert "autospec.errors (foundation) imports autospec.fit (stages, a higher layer)" in bad[0]
    assert "from autospec.fit import load_fit" in bad[0] and "errors.py:3" in bad[0]
    assert "autospec.engines.sim (engines) imports autospec.policies.static (policies, a sibling" in bad[1]
    assert cycles(mods, edges) == [["autospec.fit", "autospec.profile"]]
    assert placement("autospec.generate")[1] == "stages" and placement("autospec.models")[1] == "foundation"
    assert placement("autospec.nowhere") is None
