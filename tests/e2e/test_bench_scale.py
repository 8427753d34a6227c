"""`spark-cnn bench-scale --quick` end to end on a few hundred files: generated, classified, measured from Spark's
event log and the process tree, reported, and nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e
FILES = 300
TIMEOUT_S = 600  # ~25 s on an idle 2-core host (one session, one model check, one job); minutes when loaded


def test_bench_scale_quick_classifies_every_file_once_and_measures_the_run(tmp_path):
    out = tmp_path / "scale.json"
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "spark-cnn"), "bench-scale", "--quick",
                             "--files", str(FILES), "--data-dir", str(tmp_path / "data"), "--json", str(out)],
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "steady images/s" in result.stdout and "planning at 300 files" in result.stdout
    report = json.loads(out.read_text())
    [(name, run)] = report["runs"].items()
    assert name == f"classify-{FILES}" and run["leftover_processes"] == []
    summary = run["summary"]
    assert (summary["images"], summary["errors"]) == (FILES, 0)  # counted while writing
    assert run["output"]["rows"] == FILES and run["output"]["files"] == run["rate"]["tasks"] == 2
    assert 0 < run["first_task_s"] <= run["first_inference_task_s"] < run["call_s"]  # from the event log
    assert run["rate"]["steady"] > 0 and run["peak_rss_mb"]["driver"] > 0 and run["peak_rss_mb"]["jvm"] > 0
    assert all(t["met"] for t in report["targets"]), report["targets"]
