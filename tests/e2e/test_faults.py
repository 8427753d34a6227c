"""Faults during real `spark-cnn classify` runs, each compared with the clean output of the same input (computed
in-process by the same decoding and model code, tests/fault_tools.py: a clean Spark run of it is compared in
tests/integration/test_job_faults.py):
an executor JVM killed under local-cluster; under local[2,2] (Spark retries a failed task once), an injected device
out-of-memory in every sidecar and a sidecar that hangs (SIGSTOP), in one run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from spark_cnn.sidecar.fault_injection import INJECT_OOM_ENV
from spark_cnn.task.launcher import RUNTIME_DIR_ENV
from spark_cnn.task.procs import ProcessId, is_alive
from tests.e2e.conftest import BIN, JOB_TIMEOUT_S
from tests.fault_tools import (
    argument,
    assert_same_output,
    committed_tasks,
    read_rows,
    reference_rows,
    sidecar_processes,
    wait_for,
)
from tests.sample_images import broken_files, digits_subset, write_files

pytestmark = pytest.mark.e2e

# 30 digits per class and three broken files: ~20 tasks of ~15 images with SMALL_PARTITIONS, so a fault lands with
# many tasks still to run (twice the images only made each task longer).
IMAGES = 303
# Spark's split size for these jobs: partitions of ~15 images, so that a job still has tasks to run after its
# first commit (at the default split, a few hundred tiny files make two tasks that finish together; and at least 20
# partitions, which the listing's merging of small files keeps).
SMALL_PARTITIONS = "spark.sql.files.maxPartitionBytes 8m\nspark.sql.files.minPartitionNum 20\n"
# The executor's sidecar polls its JVM every 0.5 s; on a loaded host it must still notice within this.
SIDECAR_EXIT_BOUND_S = 10.0
HANG_TIMEOUT_S = 5  # --request-timeout of the hang test
OOM_ABOVE_ROWS = 4


@pytest.fixture(scope="module")
def digits(demo_assets, tmp_path_factory) -> str:
    folder = digits_subset(demo_assets, str(tmp_path_factory.mktemp("digits")), per_class=30)
    return write_files(folder, broken_files())


def classify_args(demo_assets, folder: str, output: str, *extra: str) -> list[str]:
    return [os.path.join(BIN, "spark-cnn"), "classify", folder, output, "--model", "spark_cnn.models.digits:digits_cnn",
            "--weights", demo_assets.weights, "--labels", demo_assets.labels, "--logits", "--quiet", *extra]


@pytest.fixture(scope="module")
def clean(demo_assets, digits) -> dict[str, dict]:
    rows = reference_rows(digits, demo_assets.weights, demo_assets.labels)
    assert len(rows) == IMAGES
    return rows


def _summary(output: str) -> dict:
    with open(os.path.join(output, "_summary.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def small_partitions(tmp_path_factory) -> dict:
    """The environment of a job whose Spark reads SMALL_PARTITIONS from its spark-defaults.conf."""
    conf_dir = tmp_path_factory.mktemp("conf")
    (conf_dir / "spark-defaults.conf").write_text(SMALL_PARTITIONS)
    return {**os.environ, "SPARK_CONF_DIR": str(conf_dir)}


def _watch_job(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(job: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = job.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        job.kill()
        _, err = job.communicate()
        pytest.fail(f"the job did not finish within {JOB_TIMEOUT_S} s: {err[-3000:]}")
    return job.returncode, err


def test_killed_executor_jvm_tasks_rerun_its_sidecar_exits_output_exact(demo_assets, digits, clean, tmp_path,
                                                                         small_partitions):
    output = str(tmp_path / "out")
    runtime = os.environ[RUNTIME_DIR_ENV]
    before = set(sidecar_processes(runtime))
    job = _watch_job(classify_args(demo_assets, digits, output, "--master", "local-cluster[2,1,1024]"),
                     env=small_partitions)
    try:
        ready = wait_for(lambda: committed_tasks(output) >= 1 and len(set(sidecar_processes(runtime)) - before) >= 2,
                         JOB_TIMEOUT_S)
        assert ready, "the job never ran tasks on two executors"
        pid, args = sorted((p, a) for p, a in sidecar_processes(runtime).items() if p not in before)[0]
        executor = ProcessId(int(argument(args, "--watch-pid")), int(argument(args, "--watch-start-time")))
        assert is_alive(executor)
        os.kill(executor.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        exited_after = wait_for(lambda: not is_alive(ProcessId(pid, 0)) and time.monotonic() - killed_at,
                                SIDECAR_EXIT_BOUND_S, poll_s=0.05)
        tasks_at_kill = committed_tasks(output)
    finally:
        returncode, err = _finish(job)

    assert exited_after, f"the dead executor's sidecar {pid} still ran {SIDECAR_EXIT_BOUND_S} s later"
    assert returncode == 0, err[-3000:]
    rows = read_rows(output)
    assert_same_output(clean, rows)
    summary = _summary(output)
    assert summary["images"] == IMAGES and summary["errors"] == 3
    assert not set(sidecar_processes(runtime)) - before, "a sidecar outlived the job"
    print(f"\nexecutor kill: rows in {IMAGES}, rows out {len(rows)}, duplicates 0, {tasks_at_kill} tasks committed "
          f"at the kill, its sidecar exited {exited_after:.2f} s after, job {summary['elapsed_s']:.1f} s")


def test_hung_sidecar_fails_the_task_naming_it_and_the_retry_succeeds_under_injected_out_of_memory(
        demo_assets, digits, clean, tmp_path, small_partitions):
    """Two faults in one run (each run starts its own Spark): every sidecar's device runs out of memory above
    OOM_ABOVE_ROWS rows (it halves its batches from 16), and one sidecar hangs (SIGSTOP) mid-job."""
    output = str(tmp_path / "out")
    runtime = os.environ[RUNTIME_DIR_ENV]
    before = set(sidecar_processes(runtime))
    # local[2,2]: two cores, and a failed task is tried once more.
    job = _watch_job(classify_args(demo_assets, digits, output, "--master", "local[2,2]", "--batch-size", "16",
                                   "--request-timeout", str(HANG_TIMEOUT_S)),
                     env={**small_partitions, INJECT_OOM_ENV: str(OOM_ABOVE_ROWS)})
    try:
        assert wait_for(lambda: committed_tasks(output) >= 1 and set(sidecar_processes(runtime)) - before,
                        JOB_TIMEOUT_S), "the job committed no task"
        [hung] = set(sidecar_processes(runtime)) - before
        os.kill(hung, signal.SIGSTOP)
        stopped_at = time.monotonic()
        replaced_after = wait_for(lambda: (set(sidecar_processes(runtime)) - before - {hung})
                                  and time.monotonic() - stopped_at, JOB_TIMEOUT_S)
    finally:
        returncode, err = _finish(job)
        if is_alive(ProcessId(hung, 0)):  # never leave a stopped process behind, whatever happened
            os.kill(hung, signal.SIGKILL)

    assert returncode == 0, err[-3000:]
    assert f"the sidecar pid {hung} at {runtime}" in err, err[-3000:]
    assert f"did not answer within {HANG_TIMEOUT_S} s" in err
    assert replaced_after, "no new sidecar replaced the hung one"
    rows = read_rows(output)
    assert_same_output(clean, rows)
    summary = _summary(output)
    assert hung not in {s["pid"] for s in summary["sidecars"]} or len(summary["sidecars"]) > 1
    assert summary["batch_size"] == OOM_ABOVE_ROWS and summary["errors"] == 3
    assert all(s["oom_backoffs"] >= 1 and s["errors"] == 0 for s in summary["sidecars"]), summary["sidecars"]
    print(f"\nhung sidecar: rows in {IMAGES}, rows out {len(rows)}, duplicates 0, new sidecar "
          f"{replaced_after:.1f} s after SIGSTOP (timeout {HANG_TIMEOUT_S} s), job {summary['elapsed_s']:.1f} s; "
          f"injected OOM: batch 16 -> {summary['batch_size']}, "
          f"back-offs {sum(s['oom_backoffs'] for s in summary['sidecars'])}")
