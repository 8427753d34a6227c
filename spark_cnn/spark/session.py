"""Create (or join) the SparkSession the jobs run in, pointed at this package's interpreter."""

from __future__ import annotations

import os
import re
import sys

from pyspark.sql import SparkSession

# Image rows are large (a JPEG is ~100 KB): Spark's default of 10,000 rows per Arrow batch would put ~1 GB in
# one batch. 64 rows keeps a batch near 6 MB and still amortises the per-batch cost; the byte bound catches
# large photos.
ARROW_MAX_RECORDS_PER_BATCH = 64
ARROW_MAX_BYTES_PER_BATCH = 64 << 20
# Spark counts each file as at least 4 MB when it packs files into partitions (openCostInBytes), so small images
# get ~32 per partition and every task's fixed cost (scheduling, a Python worker, a sidecar connection) is
# shared by few; at 256 KB partitions hold ~440 images and the per-image JVM and worker CPU halves
# (docs/benchmarks.md). Large datasets still split at maxPartitionBytes (128 MB).
IMAGE_FILE_OPEN_COST_BYTES = 256 << 10
# Attempts per task under a local master: Spark's cluster default (spark.task.maxFailures), which local masters
# ignore (they allow one attempt unless the master says `local[N,F]`). A task fails on purpose when its sidecar
# hangs, dies past the failover's bound or hits a device error; its retry runs on a new sidecar.
LOCAL_TASK_MAX_FAILURES = 4
_LOCAL_MASTER = re.compile(r"local(?:\[(\*|\d+)\])?")
LOG4J2_CONFIG = os.path.join(os.path.dirname(__file__), "log4j2.properties")


def spark_session(*, master: str | None = None, app_name: str = "spark_cnn", quiet: bool = False,
                  conf: dict | None = None) -> SparkSession:
    """A SparkSession whose Python workers run this interpreter (so pyarrow and spark_cnn import there).

    >>> spark = spark_session(master="local[2]")  # doctest: +SKIP
    """
    # Without this, workers run `python3`, which may lack pyarrow ("No module named 'pyarrow'" in a task).
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(with_task_retries(master))
    settings = {
        "spark.pyspark.python": python,
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_MAX_RECORDS_PER_BATCH),
        "spark.sql.execution.arrow.maxBytesPerBatch": str(ARROW_MAX_BYTES_PER_BATCH),
        "spark.sql.files.openCostInBytes": str(IMAGE_FILE_OPEN_COST_BYTES),
        "spark.ui.showConsoleProgress": "false" if quiet else "true",
    }
    if SparkSession.getActiveSession() is None and "SPARK_CONF_DIR" not in os.environ:
        # A readable console: warnings and errors only. Applies when this process starts the driver JVM and
        # the user has no Spark conf dir of their own (whose spark-defaults would be overridden here).
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{LOG4J2_CONFIG}"
    for key, value in {**settings, **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def with_task_retries(master: str) -> str:
    """`local` and `local[N]` as `local[N,F]` with F = LOCAL_TASK_MAX_FAILURES, so a failed task is retried as
    on a cluster; other masters (a given `local[N,F]`, `local-cluster`, clusters) as they are.

    >>> with_task_retries("local[2]")
    'local[2,4]'
    """
    match = _LOCAL_MASTER.fullmatch(master.strip())
    if match is None:
        return master
    return f"local[{match.group(1) or 1},{LOCAL_TASK_MAX_FAILURES}]"
