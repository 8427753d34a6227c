"""The task side loads neither torch nor pyspark: its modules are imported in a fresh interpreter (a process, so
not a unit test), which names the import chain of any heavy package that one of them pulls in. Which modules are
the task side is tests/unit/test_architecture.py's declaration."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.unit.test_architecture import HEAVY, PACKAGE_DIR, torch_free_modules

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


def test_task_side_modules_load_neither_torch_nor_pyspark():
    modules = torch_free_modules()
    assert len(modules) >= 20
    loaded = heavy_imports(modules)
    wrong = [f"{module} loads {name}, via:\n    " + "\n    ".join(chain)
             for module, heavy in loaded.items() for name, chain in heavy.items()]
    assert not wrong, "\n".join(wrong)


# Every `spark-cnn` command builds the parser of every command; a driver's checks run in a child process
# (models/resolve_isolated.py) so that the driver never loads torch: its parser must not load it either
# (bench-sidecar's option table once did, through bench/tiny.py: 2.6 s and ~300 MB in every job's driver).
_PARSER_PROBE = """
import sys, traceback
first = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not first:
            stack = traceback.extract_stack()[:-1]
            first.extend(f"{f.filename}:{f.lineno}" for f in stack if "spark_cnn" in f.filename)
        return None
sys.meta_path.insert(0, Watch())
from spark_cnn.cli import build_parser
build_parser().parse_args(["classify", "in", "out"])
print("torch loaded via: " + " <- ".join(reversed(first)) if first or "torch" in sys.modules else "torch-free")
"""


def test_building_the_command_lines_parser_loads_no_torch():
    pythonpath = os.pathsep.join(p for p in (os.path.dirname(PACKAGE_DIR), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-c", _PARSER_PROBE], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": pythonpath})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "torch-free", result.stdout


def test_a_sidecar_serving_a_factory_model_loads_no_torchvision():
    """torchvision costs a sidecar 2.3 s of start (its ops import torch._dynamo); only torchvision models need it."""
    probe = ("import sys\n"
             "import spark_cnn.sidecar.server\n"
             "from spark_cnn.models.loader import build_module\n"
             "build_module('spark_cnn.models.digits:digits_cnn', None)\n"
             "print('torchvision' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
