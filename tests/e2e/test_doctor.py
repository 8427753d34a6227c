"""`spark-cnn doctor` for real on local[2]: the versions it prints are this environment's, the executor's
sidecar starts, answers and is gone afterwards; a runtime directory open to others fails the checks with one
line each and exit status 1."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys

import pyspark
import pytest

from spark_cnn import __version__
from tests.e2e.conftest import run_command
from tests.sidecar_harness import sidecar_pids

pytestmark = pytest.mark.e2e
FAILED = "spark-cnn doctor: FAILED "


def _doctor(tmp_path, **env) -> tuple:
    found = tmp_path / "doctor.json"
    done = run_command([sys.executable, "-m", "spark_cnn", "doctor", "--master", "local[2]", "--device", "cpu",
                        "--json", str(found)], env={**os.environ, **env})
    return done, json.loads(found.read_text())


def test_doctor_reports_this_environment_and_a_sidecar_that_starts_and_stops(tmp_path):
    done, found = _doctor(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert FAILED not in done.stderr and found["failures"] == []
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[1:]}
    expected = {"python": platform.python_version(), "pyspark": pyspark.__version__, "spark_cnn": __version__,
                "torch": importlib.metadata.version("torch"), "pyarrow": importlib.metadata.version("pyarrow"),
                "torchvision": importlib.metadata.version("torchvision")}
    for name, version in expected.items():
        assert rows[name][:2] == [version, version], (name, rows[name])  # driver, executor
        assert found["driver"][name] == found["executor"][name] == version
    assert found["driver"]["java"] and found["driver"]["java"] == found["executor"]["java"]
    assert found["executor"]["runtime_dir"] == os.environ["SPARK_CNN_RUNTIME_DIR"]
    sidecar = found["executor"]["sidecar"]
    assert sidecar["ok"] and sidecar["device"] == "cpu" and sidecar["pid"] > 0
    assert rows["sidecar"][:4] == ["-", "ok:", "pid", str(sidecar["pid"])]
    assert sidecar_pids(found["app_id"]) == [], "the probe's sidecar outlived the doctor"


def test_a_runtime_dir_open_to_others_fails_with_one_line_per_check(tmp_path):
    runtime = tmp_path / "open"
    runtime.mkdir()
    runtime.chmod(0o777)
    done, found = _doctor(tmp_path, SPARK_CNN_RUNTIME_DIR=str(runtime))
    assert done.returncode == 1, done.stderr[-3000:]
    failures = [line.removeprefix(FAILED) for line in done.stderr.splitlines() if line.startswith(FAILED)]
    assert failures == found["failures"] and len(failures) == 3, done.stderr[-3000:]
    assert failures[0].startswith("driver runtime dir: ") and "open to other users" in failures[0]
    assert all(str(runtime) in line for line in failures)
    assert "runtime dir: " in failures[1] and "the sidecar did not start" in failures[2]
    assert "FAILED" in done.stdout.splitlines()[-1]  # the table's sidecar row
