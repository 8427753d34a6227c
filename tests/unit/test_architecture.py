"""The package layout is the process layout: a test fails when an import crosses it the wrong way.

- Code that runs in Spark's Python workers (task/, imaging/, formats/, models/spec.py, config.py, options.py,
  errors.py) loads neither torch nor pyspark, directly or through another module (checked in a fresh interpreter).
- Only spark/, cli/, bench/ and the package's public API import pyspark (checked in the source, function-level
  imports included).
- Packages import downwards only, in LAYERS order; the sidecar imports from perf/ only perf.startpoint, perf/
  imports nothing from the sidecar; no import cycle between packages.

The rules read the tree: every module under spark_cnn/ is checked, and a new package must be given a layer here.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

PACKAGE = "spark_cnn"
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), PACKAGE)

# Lowest first. A package may import from its own layer's package and from lower layers; packages of one layer
# may import each other only where SIDEWAYS allows it. "api" is spark_cnn/__init__.py and spark_cnn/__main__.py.
LAYERS = (("errors",), ("options",), ("imaging",), ("formats",), ("models",), ("task",), ("sidecar", "perf"),
          ("config",), ("spark",), ("cli", "bench", "perf_tools"), ("api",))
# Imports between packages of one layer: (importer, imported) -> the modules it may import (None: any).
SIDEWAYS = {
    ("sidecar", "perf"): {"spark_cnn.perf.startpoint"},  # the predicted starting batch size, its one runtime entry
    ("cli", "bench"): None,  # the bench commands run the benchmarks
    ("cli", "perf_tools"): None,  # profile, plan and validate run calibration and validation
    ("bench", "perf_tools"): None,  # the bench calibrates the device it reports on
}
# Imports allowed to break a rule while they are being removed, each with why; drop an entry once its import is
# gone (a test checks). None today.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()

# Modules that run in Spark's Python workers, and what they must not load.
TORCH_FREE_PACKAGES = {"task", "imaging", "formats", "config", "errors", "options"}
TORCH_FREE_MODULES = {"spark_cnn.models.spec"}
HEAVY = ("torch", "torchvision", "pyspark", "py4j")
# Where pyspark may be imported.
PYSPARK_PACKAGES = {"spark", "cli", "bench", "api"}


# --- reading the tree -------------------------------------------------------------------------------------------

def package_modules() -> dict[str, str]:
    """Module name -> file, for every .py file under spark_cnn/ (namespace subpackages included)."""
    modules = {}
    for folder, _, names in os.walk(PACKAGE_DIR):
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            parts = [PACKAGE, *os.path.relpath(path, PACKAGE_DIR)[:-3].split(os.sep)]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = package_modules()


def package_of(module: str) -> str:
    """The top-level package (or module) of spark_cnn that `module` belongs to; "api" for spark_cnn itself."""
    parts = module.split(".")
    return "api" if len(parts) == 1 or parts[1] == "__main__" else parts[1]


def imports_of(module: str) -> set[str]:
    """Every module `module` imports, at the top or inside functions, relative imports resolved; for
    `from X import Y` X.Y where Y is a module, else X."""
    path = MODULES[module]
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
            submodules = [name for name in names if name in MODULES]
            found.update(submodules)
            if len(submodules) < len(names):  # some names are the package's own, not submodules
                found.add(base)
    return found


def package_imports() -> list[tuple[str, str]]:
    """(importer, imported) for every import of one spark_cnn module by another."""
    return sorted((module, target) for module in MODULES for target in imports_of(module)
                  if target.split(".")[0] == PACKAGE)


def layer_of(package: str) -> int:
    for rank, packages in enumerate(LAYERS):
        if package in packages:
            return rank
    raise AssertionError(f"spark_cnn/{package} has no layer: add it to LAYERS in {__file__}")


def wrong_way(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None if it may."""
    source, target = package_of(importer), package_of(imported)
    if source == target or (importer, imported) in KNOWN_EXCEPTIONS:
        return None
    if layer_of(target) < layer_of(source):
        return None
    if layer_of(target) > layer_of(source):
        return f"{source} (layer {layer_of(source)}) imports {target} (layer {layer_of(target)}), a higher layer"
    if (source, target) not in SIDEWAYS:
        return f"{source} imports {target}, a package of its own layer"
    allowed = SIDEWAYS[(source, target)]
    if allowed is not None and imported not in allowed:
        return f"{source} may import from {target} only {sorted(allowed)}"
    return None


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Every strongly connected group of more than one node (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# --- the rules --------------------------------------------------------------------------------------------------

def test_the_tree_is_read():
    """The walk finds the packages named in the rules, so that a rule cannot pass by checking nothing."""
    packages = {package_of(module) for module in MODULES}
    assert packages >= {"task", "imaging", "formats", "models", "sidecar", "perf", "spark", "cli", "bench", "config",
                        "errors", "api", "perf_tools"}
    assert TORCH_FREE_MODULES <= set(MODULES)
    assert len(package_imports()) > 100


def test_every_package_has_a_layer():
    for module in MODULES:
        layer_of(package_of(module))


def test_packages_import_only_downwards():
    wrong = [f"{importer} -> {imported}: {why}" for importer, imported in package_imports()
             if (why := wrong_way(importer, imported))]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_import_cycle_between_packages():
    edges = {(package_of(a), package_of(b)) for a, b in package_imports()
             if package_of(a) != package_of(b) and (a, b) not in KNOWN_EXCEPTIONS}
    found = cycles(edges)
    assert not found, f"packages that import each other, directly or around a circle: {found}"


def test_only_the_spark_side_imports_pyspark():
    wrong = sorted(f"{module} imports {name}" for module in MODULES if package_of(module) not in PYSPARK_PACKAGES
                   for name in imports_of(module) if name.split(".")[0] in ("pyspark", "py4j"))
    assert not wrong, "pyspark outside spark/, cli/, bench/:\n" + "\n".join(wrong)


def test_the_known_exceptions_still_exist():
    """An exception whose import is gone must leave the list, so that it cannot hide a new one."""
    present = set(package_imports())
    assert KNOWN_EXCEPTIONS <= present, f"drop from KNOWN_EXCEPTIONS: {sorted(KNOWN_EXCEPTIONS - present)}"


def torch_free_modules() -> list[str]:
    return sorted(m for m in MODULES if package_of(m) in TORCH_FREE_PACKAGES or m in TORCH_FREE_MODULES)


# Imports the modules one after another in one fresh interpreter; prints, per module, each heavy package whose
# first import happened while importing it, with the spark_cnn frames that imported it (so that a failure names
# the import chain). One interpreter answers as one per module would: a heavy package is loaded by the first
# module that needs it, which is named, and a module whose imports were loaded before it loaded nothing heavy
# through them then either (a fresh interpreter per module cost ~10 s here).
_PROBE = """
import importlib, json, sys, traceback
HEAVY = set(sys.argv[2].split(","))
first = {}
class Watch:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in HEAVY and top not in sys.modules and top not in first:
            stack = traceback.extract_stack()[:-1]
            first[top] = [f"{f.filename}:{f.lineno}" for f in stack if "spark_cnn" in f.filename]
        return None
sys.meta_path.insert(0, Watch())
loaded = {}
for module in sys.argv[1].split(","):
    first = {}
    importlib.import_module(module)
    loaded[module] = first
print(json.dumps(loaded))
"""


def heavy_imports(modules: list[str]) -> dict[str, dict[str, list[str]]]:
    pythonpath = os.pathsep.join(p for p in (os.path.dirname(PACKAGE_DIR), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-c", _PROBE, ",".join(modules), ",".join(HEAVY)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": pythonpath})
    assert result.returncode == 0, f"importing {modules} failed:\n{result.stderr[-2000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_task_side_modules_load_neither_torch_nor_pyspark():
    modules = torch_free_modules()
    assert len(modules) >= 20
    loaded = heavy_imports(modules)
    wrong = [f"{module} loads {name}, via:\n    " + "\n    ".join(chain)
             for module, heavy in loaded.items() for name, chain in heavy.items()]
    assert not wrong, "\n".join(wrong)
