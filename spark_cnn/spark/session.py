"""Create (or join) the SparkSession the jobs run in, pointed at this package's interpreter; and what differs
between a classic session (a SparkContext and a JVM in this process) and a Spark Connect one (a gRPC client of a
server elsewhere: no SparkContext, no py4j, no accumulators). Code that needs one of those asks here."""

from __future__ import annotations

import os
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Iterable

from pyspark.sql import SparkSession

from spark_cnn.config import REMOTE_ENV, check_remote
from spark_cnn.spark import jvm_archive

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
# The JVM's optimising compiler (C2) spent about half of a local job's JVM CPU compiling Spark's per-job paths
# (0.5-0.7 ms per image over 4,096 images with a near-free model); ten times its thresholds leave those paths to
# the quick compiler and still compile what is really hot (docs/benchmarks.md, the framework's CPU per image).
JIT_THRESHOLD_SCALING = "-XX:CompileThresholdScaling=10"


def driver_java_options() -> str:
    """The options of a driver JVM this process starts: a readable console, less JIT work and, once built for
    this JDK and these jars, the archive of Spark's classes (spark/jvm_archive.py)."""
    options = f"-Dlog4j2.configurationFile=file:{LOG4J2_CONFIG} {JIT_THRESHOLD_SCALING} {jvm_archive.java_options()}"
    return options.rstrip()


def spark_session(*, master: str | None = None, remote: str | None = None, app_name: str = "spark_cnn",
                  quiet: bool = False, conf: dict | None = None) -> SparkSession:
    """A SparkSession whose Python workers run this interpreter (so pyarrow and spark_cnn import there).

    `remote`: a Spark Connect server (`sc://host:port`, or `local[N]` to start one here, as pyspark does);
    with SPARK_REMOTE set, pyspark connects there without it. The server's own Python workers need pyarrow
    and spark_cnn installed: a server started here (`local[N]`) runs them with this interpreter.

    >>> spark = spark_session(master="local[2]")  # doctest: +SKIP
    >>> spark = spark_session(remote="sc://127.0.0.1:15002")  # doctest: +SKIP
    """
    check_remote(master, remote)
    # Without this, workers run `python3`, which may lack pyarrow ("No module named 'pyarrow'" in a task).
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if remote:
        # A local server is a local master: its tasks get retries as with_task_retries gives a local master.
        builder = builder.remote(with_task_retries(remote) if remote.startswith("local") else remote)
    elif master:
        builder = builder.master(with_task_retries(master))
    settings = {
        "spark.pyspark.python": python,
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_MAX_RECORDS_PER_BATCH),
        "spark.sql.execution.arrow.maxBytesPerBatch": str(ARROW_MAX_BYTES_PER_BATCH),
        "spark.sql.files.openCostInBytes": str(IMAGE_FILE_OPEN_COST_BYTES),
        "spark.ui.showConsoleProgress": "false" if quiet else "true",
    }
    if SparkSession.getActiveSession() is None and "SPARK_CONF_DIR" not in os.environ:
        # A readable console (warnings and errors only) and less JIT work. Applies when this process starts the
        # driver JVM and the user has no Spark conf dir of their own (whose spark-defaults would be overridden).
        settings["spark.driver.extraJavaOptions"] = driver_java_options()
    if (remote or os.environ.get(REMOTE_ENV) or "").startswith("sc://"):
        # A server elsewhere has its own static settings (its workers' Python, its console, its JVM): a session
        # sets only SQL settings there (pyspark would warn about each of the others).
        settings = {key: value for key, value in settings.items() if key.startswith("spark.sql.")}
    for key, value in {**settings, **(conf or {})}.items():
        builder = builder.config(key, value)
    with warnings.catch_warnings():
        # A local Connect server gets every setting when it starts; pyspark then sets them again on the session
        # and warns about each static one ("Failed to set spark.pyspark.python ...").
        warnings.filterwarnings("ignore", message="Failed to set spark\\.", category=UserWarning)
        return builder.getOrCreate()


def is_connect(spark: SparkSession) -> bool:
    """A Spark Connect session (pyspark.sql.connect): no SparkContext, JVM or accumulators in this process."""
    connect = sys.modules.get("pyspark.sql.connect.session")  # loaded by any Connect session; needs grpc
    return connect is not None and isinstance(spark, connect.SparkSession)


def application_id(spark: SparkSession) -> str:
    """The Spark application the session's tasks run in (sidecars are keyed by it)."""
    if is_connect(spark):
        return spark.conf.get("spark.app.id")
    return spark.sparkContext.applicationId


def owns_executors(spark: SparkSession) -> bool:
    """Whether the session's executors end with this process: a classic session, or a Connect server that
    pyspark started here (`local[N]`); not a shared server elsewhere, whose sidecars serve its other clients."""
    return not is_connect(spark) or "SPARK_LOCAL_REMOTE" in os.environ  # pyspark sets it for a server it starts


_connect_shipped: dict[str, set[str]] = {}  # Connect session id -> names shipped to it
_classic_shipped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # SparkContext -> names shipped to it
_shipped_lock = threading.Lock()


def ship_files(spark: SparkSession, paths: Iterable[str]) -> None:
    """Make each file available to the session's tasks under its base name (`SparkFiles.get(name)` in a task;
    a Connect session's files land in its own folder, which SparkFiles points at there). A name shipped
    before is skipped: callers name files by their contents, so the same name is the same bytes."""
    paths = list(paths)
    with _shipped_lock:
        if is_connect(spark):
            shipped = _connect_shipped.setdefault(spark.session_id, set())

            def add(path: str) -> None:
                spark.addArtifacts(path, file=True)
        else:
            context = spark.sparkContext
            shipped = _classic_shipped.get(context)
            if shipped is None:  # read once per context: listFiles costs a py4j call per file shipped so far
                shipped = _classic_shipped[context] = {uri.rstrip("/").rpartition("/")[2]
                                                       for uri in context.listFiles}
            add = context.addFile
        for path in paths:
            name = os.path.basename(path)
            if name not in shipped:
                add(path)
                shipped.add(name)


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
