"""The package layout is the process layout: a test fails when an import crosses it the wrong way.

- Code that runs in Spark's Python workers (task/, imaging/, formats/, models/spec.py, config.py, options.py,
  errors.py) loads neither torch nor pyspark, directly or through another module (checked in a fresh interpreter,
  by tests/integration/test_task_side_imports.py).
- Only spark/, cli/, bench/ and the package's public API import pyspark (checked in the source, function-level
  imports included).
- Packages import downwards only, in LAYERS order; the sidecar imports from perf/ only perf.startpoint, perf/
  imports nothing from the sidecar; no import cycle between packages, nor between modules (function-level
  imports included: a circle hidden inside a function is still a circle).
- What runs in the jobs imports no tool: the modules reachable from the sidecar's entry, the task side, the
  jobs and the public API (function-level imports and the packages an import runs included) hold no
  calibration, validation, zoo or benchmark module (perf_tools/, bench/).

Every import counts but one under `if TYPE_CHECKING:`, which never runs.

The rules read the tree: every module under spark_cnn/ is checked, and a new package must be given a layer here.
"""

from __future__ import annotations

import ast
import collections
import functools
import os

PACKAGE = "spark_cnn"
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), PACKAGE)

# Lowest first. A package may import from its own layer's package and from lower layers; packages of one layer
# may import each other only where SIDEWAYS allows it. "api" is spark_cnn/__init__.py and spark_cnn/__main__.py.
LAYERS = (("errors", "paths"), ("options",), ("imaging",), ("formats",), ("models",), ("task",), ("sidecar", "perf"),
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
TORCH_FREE_PACKAGES = {"task", "imaging", "formats", "config", "errors", "options", "paths"}
TORCH_FREE_MODULES = {"spark_cnn.models.spec"}
HEAVY = ("torch", "torchvision", "pyspark", "py4j")
# Where pyspark may be imported.
PYSPARK_PACKAGES = {"spark", "cli", "bench", "api"}
# What the running system starts from: the sidecar process, the code in Spark's Python workers, the jobs and the
# notebook API. None of them may reach a tool (TOOL_PACKAGES): offline calibration, validation, the zoo and the
# benchmarks are commands, never part of a job.
RUNTIME_ROOTS = ("spark_cnn", "spark_cnn.sidecar.__main__", "spark_cnn.sidecar.server", "spark_cnn.spark.classify_job",
                 "spark_cnn.spark.etl_job", "spark_cnn.spark.udf", "spark_cnn.spark.frames")
RUNTIME_ROOT_PACKAGES = ("task",)  # every module of these
TOOL_PACKAGES = {"perf_tools", "bench"}
# ... and a module named as a tool is one wherever it lies (a calibration package, a *_bench, validation, the zoo).
TOOL_NAMES = ("calibration", "_bench", "validate", "zoo")


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


@functools.cache
def imports_of(module: str) -> set[str]:
    """Every module `module` imports, at the top or inside functions, relative imports resolved; for
    `from X import Y` X.Y where Y is a module, else X."""
    path = MODULES[module]
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in _runtime_nodes(tree):
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


def _type_checking(node: ast.AST) -> bool:
    """Whether `node` is `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): a block for type checkers only."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` at any depth (functions, classes, branches), but not the body of an
    `if TYPE_CHECKING:` block (its `else:` runs, so it is walked)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if _type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


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


def module_graph() -> dict[str, set[str]]:
    """spark_cnn module -> the spark_cnn modules it imports (at any depth), itself left out."""
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for importer, imported in package_imports():
        if imported in MODULES and imported != importer:
            graph[importer].add(imported)
    return graph


def parents(module: str) -> list[str]:
    """The packages Python runs before `module`: `a.b.c` -> [`a`, `a.b`] (those under spark_cnn/)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in MODULES]


def reachable(roots: list[str], graph: dict[str, set[str]]) -> dict[str, str | None]:
    """Every module that importing `roots` may run, counting function-level imports and the packages an import
    runs first, each with the module it was reached from (None for a root)."""
    via: dict[str, str | None] = dict.fromkeys(roots)
    todo = collections.deque(roots)  # breadth first: each module's chain is a shortest one
    while todo:
        module = todo.popleft()
        for nxt in sorted(graph[module] | set(parents(module))):
            if nxt not in via:
                via[nxt] = module
                todo.append(nxt)
    return via


def chain(module: str, via: dict[str, str | None]) -> str:
    path = [module]
    while via[path[-1]] is not None:
        path.append(via[path[-1]])
    return " -> ".join(reversed(path))


def is_tool(module: str) -> bool:
    return package_of(module) in TOOL_PACKAGES or any(mark in part for part in module.split(".")[1:]
                                                       for mark in TOOL_NAMES)


def runtime_roots() -> list[str]:
    roots = [m for m in MODULES if package_of(m) in RUNTIME_ROOT_PACKAGES]
    return sorted({*roots, *RUNTIME_ROOTS})


# --- the rules --------------------------------------------------------------------------------------------------

def test_the_tree_is_read():
    """The walk finds the packages named in the rules, so that a rule cannot pass by checking nothing."""
    packages = {package_of(module) for module in MODULES}
    assert packages >= {"task", "imaging", "formats", "models", "sidecar", "perf", "spark", "cli", "bench", "config",
                        "errors", "api", "perf_tools"}
    assert TORCH_FREE_MODULES <= set(MODULES)
    assert set(RUNTIME_ROOTS) <= set(MODULES)
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


def test_no_import_cycle_between_modules():
    """No two modules import each other, directly or around a circle, counting imports inside functions: a
    circle is cut by moving the shared piece to where it belongs, not by hiding an import in a function."""
    graph = module_graph()
    edges = {(a, b) for a, targets in graph.items() for b in targets if (a, b) not in KNOWN_EXCEPTIONS}
    found = cycles(edges)
    shown = [" <-> ".join(group) + ": " + ", ".join(f"{a} -> {b}" for a, b in sorted(edges)
                                                     if a in group and b in group) for group in found]
    assert not found, "modules that import each other:\n" + "\n".join(shown)


def test_the_runtime_reaches_no_tool():
    """The sidecar, the tasks, the jobs and the notebook API never import a calibration benchmark, validation,
    the zoo or a benchmark, not even from inside a function."""
    via = reachable(runtime_roots(), module_graph())
    assert "spark_cnn.perf.startpoint" in via and "spark_cnn.task.stream" in via  # the walk reaches the runtime
    wrong = sorted(chain(m, via) for m in via if is_tool(m))
    assert not wrong, "the runtime imports tools:\n" + "\n".join(wrong)


def test_perf_holds_the_runtime_part_only():
    """perf/ is what the sidecar and the driver run (profile data, layer analysis, time model, tuner, start
    point): each of its modules is reached from the runtime; the offline part lies in perf_tools/."""
    via = reachable(runtime_roots(), module_graph())
    offline = sorted(m for m in MODULES if package_of(m) == "perf" and m not in via)
    assert not offline, f"perf/ modules the runtime never imports (move them to perf_tools/): {offline}"


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
