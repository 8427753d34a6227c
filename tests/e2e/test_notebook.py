"""examples/quickstart.ipynb run as a user runs it: a real Jupyter kernel on this environment's Python, every
cell executed in order by nbclient; any failing cell (the notebook asserts its own results) fails the test."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.e2e.conftest import sidecars_left_since, sidecars_now

pytestmark = pytest.mark.e2e

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "quickstart.ipynb")
# A cell slower than this is stuck (the slowest, the first Spark job, takes ~30 s on 2 idle cores).
CELL_TIMEOUT_S = 300
KERNEL_NAME = "spark_cnn_test"


@pytest.fixture
def kernel_on_this_python(tmp_path, monkeypatch) -> str:
    """A kernelspec that starts ipykernel with this interpreter (not whatever `python3` is on PATH)."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "spark_cnn test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL_NAME


def test_quickstart_notebook_runs_every_cell(kernel_on_this_python, demo_assets, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    # The kernel inherits the environment: this run's private sidecar directory, the demo trained once per test
    # session (training takes most of a minute on a busy 2-core machine), and a folder for the notebook's files.
    monkeypatch.setenv("SPARK_CNN_DEMO_DIR", os.path.dirname(demo_assets.images))
    monkeypatch.setenv("QUICKSTART_DIR", str(tmp_path / "quickstart"))
    # A kernel shut down by its client runs no atexit: its shipped model copies would stay in /tmp until the next
    # driver sweeps them (spark/shipped_copies.py). Here they go with the test's folder.
    (tmp_path / "kernel_tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "kernel_tmp"))
    repo = os.path.abspath(os.path.join(os.path.dirname(NOTEBOOK), ".."))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([repo, *filter(None, [os.environ.get("PYTHONPATH")])]))
    sidecars_before = sidecars_now()
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(notebook, kernel_name=kernel_on_this_python, timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, naming the cell, when one fails

    outputs = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for out in cell.get("outputs", []))
    assert "101 files under" in outputs and "1 error(s)" in outputs and "(64, 32)" not in outputs
    assert "64 features per image; 32 with layer='features'" in outputs
    assert sidecars_left_since(sidecars_before) == set(), "the notebook left a sidecar running"
