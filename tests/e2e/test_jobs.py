"""The jobs as users run them: the demo (`make run`), `spark-cnn submit` of a preset. Several executors, one sidecar
each: test_standalone_cluster.py (the detector) and test_faults.py (classify, an executor killed)."""

from __future__ import annotations

import json
import os
import re
import time

import pyarrow.parquet as pq
import pytest

from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.task.procs import ProcessId, cmdline, is_alive
from tests.e2e.conftest import BIN, run_command
from tests.sample_images import broken_files, write_files
from tests.sample_images import digits_subset as _subset

pytestmark = pytest.mark.e2e
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sidecars_of(app_id: str) -> list[int]:
    """Live sidecar processes of one application on this host, found the way an operator would (ps)."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        args = cmdline(pid)
        if ("spark_cnn.sidecar" in args and app_id in args and is_alive(ProcessId(pid, 0))):
            found.append(pid)
    return found


def _wait_until_gone(app_id: str, timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := _sidecars_of(app_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_demo_prints_the_report_and_reaches_accuracy(spark_cnn, demo_assets, tmp_path):
    summary_path = tmp_path / "summary.json"
    result = spark_cnn("demo", "--workdir", os.path.dirname(demo_assets.images), "--output", str(tmp_path / "out"),
                       "--summary", str(summary_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = dict(line.split(None, 1) for line in result.stdout.splitlines() if re.match(r"^[a-z]", line)
                  and "  " in line and not line.startswith("trained"))
    assert report["images"].strip() == "1797" and report["errors"].strip() == "0"
    assert float(report["accuracy"]) >= 0.95
    assert report["output"].strip().endswith(str(tmp_path / "out"))
    summary = json.loads(summary_path.read_text())
    assert summary["images_per_s"] > 0 and summary["batch_size"] in (1, 2, 4, 8, 16, 32, 64)
    assert _wait_until_gone(summary["app_id"]) == [], "a sidecar outlived the demo"


def test_spark_cnn_submit_runs_a_preset_with_flags_over_preset_over_spark_conf(demo_assets, tmp_path):
    """The README's line, as written, from the repository root with nothing activated or set: `spark-cnn submit`
    finds pyspark's Spark and runs the driver and the workers on this interpreter. Its job is a preset
    (`jobs/run.py`) whose options also come from `--conf spark.cnn.*` and from flags: flag > preset > Spark conf >
    default. A plain `spark-submit`: test_standalone_cluster.py and test_presets.py; the embed job's rows:
    tests/integration/test_notebook_api.py."""
    folder = write_files(_subset(demo_assets, str(tmp_path / "in"), per_class=2), broken_files())
    output, preset = tmp_path / "out", tmp_path / "digits.yaml"
    preset.write_text(f"job: classify\ninput: {folder}\noutput: {output}\nmodel: {DIGITS_FACTORY}\n"
                      f"weights: {demo_assets.weights}\nlabels: {demo_assets.labels}\ntop-k: 2\ndevice: cuda\n")
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = "/usr/bin:/bin"  # no venv on PATH: `python3` is the system's, as in a fresh shell
    result = run_command([os.path.join(BIN, "spark-cnn"), "submit", "--master", "local[2]",
                          "--conf", "spark.cnn.topK=4", "--conf", "spark.cnn.batchSize=4",
                          "--conf", "spark.cnn.device=cuda:1", "jobs/run.py", str(preset), "--device", "cpu",
                          "--quiet"], env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""  # --quiet
    summary = json.loads((output / "_summary.json").read_text())
    assert summary["images"] == 23 and summary["errors"] == 3
    assert summary["batch_size"] == 4  # Spark conf over the default (auto)
    assert [s["device"] for s in summary["sidecars"]] == ["cpu"]  # the flag over preset and Spark conf
    assert summary["sidecars"][0]["task_decode_cpu_s"] > 0  # the tasks decoded, and told their sidecar the CPU
    rows = pq.read_table(output).to_pylist()
    assert len(rows) == 23 and len({r["path"] for r in rows}) == 23
    assert sum(r["error"] is not None for r in rows) == 3
    assert {len(r["topk"]) for r in rows if r["error"] is None} == {2}  # the preset over Spark conf
    assert _wait_until_gone(summary["app_id"]) == []


@pytest.mark.parametrize("case", ["missing input", "unknown model", "output exists", "bad device", "bad max pixels"])
def test_bad_configuration_is_one_line(spark_cnn, demo_assets, tmp_path, case):
    output = tmp_path / "out"
    args = ["classify", demo_assets.images, str(output), "--model", "spark_cnn.models.digits:digits_cnn",
            "--weights", demo_assets.weights]
    if case == "missing input":
        args[1] = str(tmp_path / "nowhere")
    elif case == "unknown model":
        args[4] = "not_a_model"
    elif case == "output exists":
        output.mkdir()
    elif case == "bad max pixels":
        args += ["--max-pixels", "0"]
    else:
        args += ["--device", "tpu"]
    started = time.monotonic()
    result = spark_cnn(*args)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("spark-cnn classify: error: "), result.stderr
    assert time.monotonic() - started < 30, "the check should come before Spark starts"
    assert not output.exists() or case == "output exists"
