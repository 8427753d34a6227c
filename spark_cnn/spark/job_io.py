"""What every batch job (classify, embed, to-petastorm, etl) does around its Spark work: check its paths before
any work, own or borrow the session, stage the output and publish it by a rename, and turn a task's failure
back into the error the task raised.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

from spark_cnn.errors import (
    ConfigError,
    ImageError,
    InputError,
    ModelError,
    SidecarError,
    SidecarHung,
    SidecarLost,
    SparkCnnError,
)
from spark_cnn.spark.session import spark_session
from spark_cnn.spark.storage import HadoopFS, local_path
from spark_cnn.task.launcher import stop_sidecars

_TASK_ERROR = re.compile(r"spark_cnn\.errors\.(\w+): (.+)")
_ERROR_TYPES = {cls.__name__: cls for cls in (ConfigError, ImageError, InputError, ModelError, SidecarError,
                                              SidecarHung, SidecarLost)}


def check_local_paths(input_uri: str, output_uri: str | None, overwrite: bool) -> None:
    """Fail fast, before Spark starts, on local paths (remote ones are checked once the session is up)."""
    input_path = local_path(input_uri)
    if input_path is not None and not os.path.exists(input_path):
        raise InputError(f"input {input_path} does not exist")
    output_path = local_path(output_uri) if output_uri is not None else None
    if output_path is not None and os.path.exists(output_path) and not overwrite:
        raise InputError(f"output {output_path} already exists; use --overwrite to replace it")


def check_paths(fs: HadoopFS, input_uri: str, output_uri: str | None, overwrite: bool, *, input_name: str,
                output_name: str | None = None) -> None:
    """The same checks on any filesystem, through Hadoop; `*_name` is how the user wrote each path."""
    if not fs.exists(input_uri):
        raise InputError(f"input {input_name} does not exist")
    if output_uri is not None and fs.exists(output_uri) and not overwrite:
        raise InputError(f"output {output_name or output_uri} already exists; use --overwrite to replace it")


@contextmanager
def job_session(spark: SparkSession | None, *, master: str | None, quiet: bool,
                app_name: str = "spark_cnn") -> Iterator[SparkSession]:
    """`spark` when given (the caller owns it), else a new session that is stopped at the end, after this
    host's sidecars of its application (on a cluster they exit with their executors)."""
    if spark is not None:
        yield spark
        return
    spark = spark_session(master=master, quiet=quiet, app_name=app_name)
    try:
        yield spark
    finally:
        stop_sidecars(spark.sparkContext.applicationId)
        spark.stop()


def staging_uri(output_uri: str, job_id: str) -> str:
    """A hidden sibling of the output (Spark and Parquet readers skip names starting with '.')."""
    parent, _, name = output_uri.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.spark_cnn-{job_id}.tmp"


def publish(fs: HadoopFS, staging: str, output_uri: str, *, overwrite: bool) -> None:
    """Rename the complete staging directory into place; with `overwrite`, only now remove the old output."""
    if overwrite:
        fs.delete(output_uri)
    fs.rename(staging, output_uri)


def task_error(error: Exception) -> SparkCnnError:
    """A task's spark_cnn error, re-raised on the driver as itself, without the JVM stack around it."""
    match = _TASK_ERROR.search(str(error))
    if match:
        return _ERROR_TYPES.get(match.group(1), SparkCnnError)(match.group(2).strip())
    return SparkCnnError(f"the Spark job failed: {str(error).strip().splitlines()[0]}")
