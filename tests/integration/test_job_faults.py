"""A sidecar killed (SIGKILL) in the middle of a classify job on the shared local Spark: the tasks reconnect to a
new sidecar, send their requests in flight again, and the output equals a clean run's. Also: the sidecar's
access token appears in neither its log nor the job summary."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.classify_job import SUMMARY_FILE, classify
from spark_cnn.task.launcher import find_sidecars
from spark_cnn.task.procs import ProcessId, is_alive
from tests.fault_tools import assert_same_output, committed_tasks, read_rows, wait_for
from tests.sample_images import digits_subset

pytestmark = pytest.mark.spark

# The job below has ~19 tasks; killing after the first commits leaves most of them to run on the new sidecar.
KILL_AFTER_COMMITTED_TASKS = 2
# A classify job of 600 digits takes ~10-30 s here; with a sidecar restart (~3-10 s) it must end well within.
JOB_BOUND_S = 240.0


@pytest.fixture(scope="module")
def digits(demo_assets, tmp_path_factory) -> str:
    return digits_subset(demo_assets, str(tmp_path_factory.mktemp("digits")), per_class=60)


@pytest.fixture
def many_partitions(spark):
    """~30 digits per partition (20 tasks) instead of Spark's packing of small files into two: the kill must
    land with some tasks committed and others still to run. (At least 20 partitions asked for: the listing
    otherwise merges small files into three partitions per core.)"""
    settings = {"spark.sql.files.maxPartitionBytes": str(8 * 1024 * 1024), "spark.sql.files.minPartitionNum": "20"}
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def test_sigkill_of_the_sidecar_mid_job_gives_the_clean_runs_output(spark, demo_assets, digits, tmp_path,
                                                                    many_partitions):
    spec = ModelSpec(DIGITS_FACTORY, demo_assets.weights)
    clean_output, fault_output = str(tmp_path / "clean"), str(tmp_path / "fault")
    clean = classify(ClassifyConfig(digits, clean_output, InferenceOptions(spec, logits=True)), spark=spark)
    app_id = spark.sparkContext.applicationId
    outcome: dict = {}

    def run_job() -> None:
        try:
            outcome["summary"] = classify(ClassifyConfig(digits, fault_output, InferenceOptions(spec, logits=True)),
                                          spark=spark)
        except BaseException as e:  # reported by the main thread
            outcome["error"] = e

    job = threading.Thread(target=run_job)
    started = time.monotonic()
    job.start()
    try:
        assert wait_for(lambda: committed_tasks(fault_output) >= KILL_AFTER_COMMITTED_TASKS, JOB_BOUND_S), \
            "the job committed no task"
        [victim] = find_sidecars(app_id)
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        tasks_before_kill = committed_tasks(fault_output)
    finally:
        job.join(JOB_BOUND_S)
    assert not job.is_alive(), "the job did not finish after the sidecar was killed"
    assert "error" not in outcome, f"the job failed: {outcome.get('error')!r}"
    summary = outcome["summary"]

    assert not is_alive(ProcessId(victim.pid, 0))
    [successor] = find_sidecars(app_id)
    assert successor.pid != victim.pid
    assert any(s["pid"] == successor.pid for s in summary["sidecars"]), "no task finished on the new sidecar"
    clean_rows, fault_rows = read_rows(clean_output), read_rows(fault_output)
    assert len(clean_rows) == summary["images"] == clean["images"] == 600
    assert_same_output(clean_rows, fault_rows)
    print(f"\nsigkill sidecar: rows in 600, rows out {len(fault_rows)}, duplicates 0, killed after "
          f"{tasks_before_kill} committed tasks, job {time.monotonic() - started:.1f} s "
          f"({time.monotonic() - killed_at:.1f} s after the kill; clean run {clean['elapsed_s']:.1f} s)")


def test_the_sidecar_token_is_in_neither_its_log_nor_the_job_summary(spark, demo_assets, digits, tmp_path):
    output = str(tmp_path / "out")
    summary_file = str(tmp_path / "summary.json")
    classify(ClassifyConfig(digits, output, InferenceOptions(ModelSpec(DIGITS_FACTORY, demo_assets.weights)),
                            summary=summary_file), spark=spark)
    sidecars = find_sidecars(spark.sparkContext.applicationId)
    assert sidecars, "the session's sidecar should still run (it is stopped when the session ends)"

    for info in sidecars:
        with open(os.path.splitext(info.socket)[0] + ".log") as f:
            log_text = f.read()
        assert "serving on" in log_text  # the right file, with content
        for path in (summary_file, os.path.join(output, SUMMARY_FILE)):
            with open(path) as f:
                text = f.read()
            assert info.token not in text, f"the token leaked into {path}"
            assert json.loads(text)["sidecars"]
        assert info.token not in log_text, "the token leaked into the sidecar log"
