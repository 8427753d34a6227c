"""`spark-cnn doctor` on the driver: the driver's facts, one Spark task's facts from an executor (which starts
that executor's sidecar, runs one blank image through it and stops it), and the checks that failed.

The task is one `mapInArrow` partition, the path every job's tasks take, so a worker that cannot import
pyarrow or spark_cnn fails here as it would in a job. Its sidecar runs under an application id of its own, so
stopping it never touches the sidecars of a job of the same session.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import pyarrow as pa
import pyspark
from pyspark.sql import SparkSession

from spark_cnn.spark.executor import task_gpu_addresses
from spark_cnn.task.probe import probe_sidecar, process_facts
from spark_cnn.task.procs import find_executor_jvm

REPORT_SCHEMA = "report string"
# What an executor needs to run a job's tasks and its sidecar.
EXECUTOR_PACKAGES = ("pyarrow", "numpy", "pillow", "torch", "torchvision", "spark_cnn")
# The last line of a Python traceback inside Spark's error text: the worker's own exception.
_PYTHON_ERROR = re.compile(r"^\s*((?:\w+\.)*\w*(?:Error|Exception)): (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Diagnosis:
    app_id: str  # the probe sidecar's application id (its processes show it as --app-id)
    driver: dict
    executor: dict | None  # None when the probe task failed (job_error says why)
    job_error: str | None
    failures: tuple[str, ...]  # one line per failed check; empty when all is well


def diagnose(spark: SparkSession, *, device: str = "auto") -> Diagnosis:
    """Probe the driver and one executor of `spark` (one task), then check what was found."""
    driver = {**process_facts(pyspark.__version__), "spark": spark.version,
              "session": "connect" if type(spark).__module__.startswith("pyspark.sql.connect") else "classic"}
    app_id = f"doctor-{uuid.uuid4().hex[:12]}"
    try:
        rows = spark.range(1, numPartitions=1).mapInArrow(partial(_probe_task, app_id, device),
                                                           REPORT_SCHEMA).collect()
        executor, job_error = json.loads(rows[0]["report"]), None
    except Exception as e:  # py4j's, PythonException or Connect's, whichever this session raises: one line
        executor, job_error = None, worker_error(str(e))
    return Diagnosis(app_id, driver, executor, job_error, tuple(failed_checks(driver, executor, job_error)))


def _probe_task(app_id: str, device: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:  # one row: only there to make Spark run this task
        pass
    facts = process_facts(pyspark.__version__)
    facts["executor"] = find_executor_jvm().executor_id
    facts["spark_gpus"] = list(task_gpu_addresses())
    facts["sidecar"] = probe_sidecar(app_id, device, facts["spark_gpus"])
    yield pa.RecordBatch.from_pydict({"report": [json.dumps(facts)]})


def worker_error(text: str) -> str:
    """One line out of a failed Spark job's error text: the worker's Python exception when there is one."""
    found = _PYTHON_ERROR.findall(text)
    python = [f"{kind}: {message.strip()}" for kind, message in found if not kind.startswith(("org.", "java."))]
    if python:
        return python[-1]
    lines = text.strip().splitlines()
    return lines[0] if lines else "unknown error"


def failed_checks(driver: dict, executor: dict | None, job_error: str | None) -> list[str]:
    """One line per failed check, each naming where and what to do."""
    failures = []
    if driver["java"] is None and driver.get("session") != "connect":  # a Connect client starts no JVM
        failures.append(f"driver java: {driver['java_error']}")
    if driver["runtime_dir_error"]:
        failures.append(f"driver runtime dir: {driver['runtime_dir_error']}")
    if executor is None:
        failures.append(f"executor: the probe task failed: {job_error}")
        return failures
    where = f"executor {executor.get('executor', '?')} on {executor['host']}"
    missing = [name for name in EXECUTOR_PACKAGES if executor.get(name) is None]
    if missing:
        failures.append(f"{where}: {', '.join(missing)} not installed for {executor['python_path']}: "
                        f"pip install spark_cnn there, or point PYSPARK_PYTHON at a Python that has it")
    if executor["python"].rsplit(".", 1)[0] != driver["python"].rsplit(".", 1)[0]:
        failures.append(f"{where}: Python {executor['python']} where the driver has {driver['python']}: "
                        f"use the same minor version on both")
    if executor.get("spark_cnn") and executor["spark_cnn"] != driver["spark_cnn"]:
        failures.append(f"{where}: spark_cnn {executor['spark_cnn']} where the driver has {driver['spark_cnn']}: "
                        f"install the same version on both")
    if executor["runtime_dir_error"]:
        failures.append(f"{where}: runtime dir: {executor['runtime_dir_error']}")
    sidecar = executor["sidecar"]
    if not sidecar["ok"]:
        failures.append(f"{where}: the sidecar did not start or answer: {sidecar['error']}")
    return failures
