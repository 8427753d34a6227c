"""The classify job: images in, one Parquet row per image out, a JSON summary beside it.

Order of work: every check that can fail (paths, model, weights, labels, options) runs before Spark does any
work; the output is written to a hidden sibling and renamed into place, so a failed job leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_cnn.config import ClassifyConfig
from spark_cnn.errors import ConfigError, ImageError, InputError, ModelError, SidecarError, SparkCnnError
from spark_cnn.sidecar.launcher import LaunchOptions, stop_sidecars
from spark_cnn.spark.inference import InferencePlan, PartitionInference, spark_ddl
from spark_cnn.spark.session import spark_session
from spark_cnn.spark.sources import read_images
from spark_cnn.spark.stats import SidecarStatsParam
from spark_cnn.spark.storage import HadoopFS, local_path, to_uri

SUMMARY_FILE = "_summary.json"  # inside the output directory; Parquet readers skip names starting with "_"
_TASK_ERROR = re.compile(r"spark_cnn\.errors\.(\w+): (.+)")
_ERROR_TYPES = {cls.__name__: cls for cls in (ConfigError, ImageError, InputError, ModelError, SidecarError)}


def read_labels(path: str | None) -> tuple[str, ...] | None:
    """Class names, one per line (blank lines ignored)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            names = tuple(line.strip() for line in f if line.strip())
    except OSError as e:
        raise InputError(f"--labels {path}: {e.strerror}") from e
    if not names:
        raise InputError(f"--labels {path}: the file has no class names (expected one per line)")
    return names


def classify(config: ClassifyConfig, *, spark: SparkSession | None = None) -> dict:
    """Run the classify job; returns the summary (also written as JSON). Raises SparkCnnError subclasses."""
    from spark_cnn.models.resolve_isolated import resolve_endpoint_isolated  # torch stays out of the driver

    input_uri, output_uri = to_uri(config.input), to_uri(config.output)
    _check_local_paths(input_uri, output_uri, config.overwrite)
    labels = read_labels(config.labels)
    resolved = resolve_endpoint_isolated(config.model, top_k=config.top_k, logits=config.logits,
                                         embeddings=config.embeddings)
    if labels is not None and len(labels) != resolved.num_classes:
        raise ConfigError(f"--labels {config.labels} has {len(labels)} names but the model has "
                          f"{resolved.num_classes} classes")

    own_session = spark is None
    spark = spark or spark_session(master=config.master, quiet=config.quiet)
    app_id = spark.sparkContext.applicationId
    try:
        fs = HadoopFS(spark)
        if not fs.exists(input_uri):
            raise InputError(f"input {config.input} does not exist")
        if fs.exists(output_uri) and not config.overwrite:
            raise InputError(f"output {config.output} already exists; use --overwrite to replace it")
        for path in resolved.endpoint.files:
            spark.sparkContext.addFile(path)  # executors find their copy with SparkFiles.get(name)

        job_id = uuid.uuid4().hex[:12]
        plan = InferencePlan(
            endpoint=resolved.endpoint,
            launch=LaunchOptions(app_id=app_id, device=config.device, idle_timeout_s=config.idle_timeout_s,
                                 threads=config.threads),
            job_id=job_id, options=config.run_options.to_dict(), decode=config.decode, on_error=config.on_error,
            label_names=labels,
            request_rows=config.request_rows, max_in_flight=config.max_in_flight)
        sidecar_stats = spark.sparkContext.accumulator({}, SidecarStatsParam())
        outputs = read_images(spark, input_uri).mapInArrow(
            PartitionInference(plan, sidecar_stats), spark_ddl(logits=config.logits, embeddings=config.embeddings))

        staging = _staging_uri(output_uri, job_id)
        started = time.perf_counter()
        try:
            outputs.write.parquet(staging)
        except Exception as e:
            fs.delete(staging)
            raise _task_error(e) from e
        elapsed = time.perf_counter() - started
        if config.overwrite:
            fs.delete(output_uri)
        fs.rename(staging, output_uri)

        summary = _summarise(spark, output_uri, labels, elapsed, config, list(sidecar_stats.value.values()))
        summary.update(input=input_uri, output=output_uri, model=config.model.source, app_id=app_id, job_id=job_id)
        text = json.dumps(summary, indent=2)
        fs.write_text(output_uri.rstrip("/") + "/" + SUMMARY_FILE, text)
        if config.summary:
            fs.write_text(to_uri(config.summary), text)
        return summary
    finally:
        if own_session:
            stop_sidecars(app_id)  # this host's sidecars; on a cluster they exit with their executors
            spark.stop()


def _check_local_paths(input_uri: str, output_uri: str, overwrite: bool) -> None:
    """Fail fast, before Spark starts, on local paths (remote ones are checked once the session is up)."""
    input_path, output_path = local_path(input_uri), local_path(output_uri)
    if input_path is not None and not os.path.exists(input_path):
        raise InputError(f"input {input_path} does not exist")
    if output_path is not None and os.path.exists(output_path) and not overwrite:
        raise InputError(f"output {output_path} already exists; use --overwrite to replace it")


def _staging_uri(output_uri: str, job_id: str) -> str:
    parent, _, name = output_uri.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.spark_cnn-{job_id}.tmp"


def _task_error(error: Exception) -> SparkCnnError:
    """A task's spark_cnn error, re-raised on the driver as itself, without the JVM stack around it."""
    match = _TASK_ERROR.search(str(error))
    if match:
        return _ERROR_TYPES.get(match.group(1), SparkCnnError)(match.group(2).strip())
    return SparkCnnError(f"the Spark job failed: {str(error).strip().splitlines()[0]}")


def _summarise(spark: SparkSession, output_uri: str, labels, elapsed: float, config: ClassifyConfig,
               sidecars: list[dict]) -> dict:
    rows = spark.read.parquet(output_uri)
    parent = F.element_at(F.split("path", "/"), -2)
    aggregates = [F.count(F.lit(1)).alias("images"), F.count_if(F.col("error").isNull()).alias("ok")]
    if labels is not None:
        ok = F.col("error").isNull()
        aggregates += [F.count_if(ok & parent.isin(list(labels))).alias("labelled"),
                       F.count_if(ok & (F.col("label_name") == parent)).alias("correct")]
    totals = rows.agg(*aggregates).first().asDict()
    images, ok_rows = totals["images"], totals["ok"]
    # Accuracy only when the folders are the classes (ImageFolder layout): every classified image sits in a
    # folder named after one of the labels.
    accuracy = None
    if labels is not None and ok_rows and totals["labelled"] == ok_rows:
        accuracy = round(totals["correct"] / ok_rows, 4)
    batch_sizes = sorted({s.get("batch_size") for s in sidecars if s.get("batch_size")})
    return {
        "images": images, "ok": ok_rows, "errors": images - ok_rows,
        "elapsed_s": round(elapsed, 3), "images_per_s": round(images / elapsed, 2) if elapsed else None,
        "batch_size": batch_sizes[-1] if batch_sizes else config.batch_size,  # after any out-of-memory back-off
        "accuracy": accuracy,
        "sidecars": sorted(sidecars, key=lambda s: (s["host"], str(s["executor"]))),
    }
