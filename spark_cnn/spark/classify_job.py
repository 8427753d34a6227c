"""The classify job: images in, one Parquet row per image out, a JSON summary beside it.

Order of work: every check that can fail (paths, model, weights, labels, options) runs before Spark does any
work; the output is written to a hidden sibling and renamed into place, so a failed job leaves nothing behind.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pyarrow as pa
from pyspark.sql import SparkSession

from spark_cnn.config import ClassifyConfig
from spark_cnn.errors import ConfigError
from spark_cnn.spark.job_io import check_local_paths, check_paths, job_session, publish, staging_uri, task_error
from spark_cnn.spark.output_counts import OutputCounts
from spark_cnn.spark.planning import check_model, read_labels, start_inference  # noqa: F401 (read_labels: API)
from spark_cnn.spark.session import application_id
from spark_cnn.spark.sidecar_stats import JobSidecarStats
from spark_cnn.spark.sources import TRUE_LABEL, ImageSource, open_source
from spark_cnn.spark.storage import job_filesystem, to_uri
from spark_cnn.task.object_store import StorageOptions
from spark_cnn.task.schema import EMBED_COLUMNS, layout_of, task_output_schema

SUMMARY_FILE = "_summary.json"  # inside the output directory; Parquet readers skip names starting with "_"


def classify(config: ClassifyConfig, *, spark: SparkSession | None = None) -> dict:
    """Run the classify job; returns the summary (also written as JSON). Raises SparkCnnError subclasses."""
    return run_job(config, spark=spark)


def embed(config: ClassifyConfig, *, spark: SparkSession | None = None) -> dict:
    """Run the embed job: `path, embedding, error` per image (embedding: `config.layer`'s output, else the
    input of the last Linear layer). Same checks, staging and summary as classify."""
    if config.partition_by is not None:
        raise ConfigError(f"--partition-by {config.partition_by}: embed writes path, embedding and error only; "
                          "partitioning applies to classify")
    if not config.inference.embeddings:
        config = replace(config, inference=replace(config.inference, embeddings=True))
    return run_job(config, spark=spark, columns=EMBED_COLUMNS)


def detect(config: ClassifyConfig, *, spark: SparkSession | None = None) -> dict:
    """Run the detect job: `path, detections, error` per image (boxes in the input image's pixels). Same checks,
    staging and summary as classify."""
    return run_job(_for_task(config, "detect"), spark=spark)


def segment(config: ClassifyConfig, *, spark: SparkSession | None = None) -> dict:
    """Run the segment job: `path, mask (PNG of class indices at the input's size), classes, error` per image."""
    return run_job(_for_task(config, "segment"), spark=spark)


def _for_task(config: ClassifyConfig, task: str) -> ClassifyConfig:
    return config if config.inference.task == task else replace(config, inference=replace(config.inference,
                                                                                          task=task))


def run_job(config: ClassifyConfig, *, spark: SparkSession | None = None,
            columns: tuple[str, ...] | None = None) -> dict:
    """Images in, one Parquet row per image out (all classify columns, or `columns`), summary beside it."""
    input_uri, output_uri = to_uri(config.input), to_uri(config.output)
    task = config.inference.task
    if config.partition_by not in (None, TRUE_LABEL) and task != "classify":
        raise ConfigError(f"--partition-by {config.partition_by}: {task} writes no such column; partition by "
                          f"{TRUE_LABEL}")
    check_local_paths(input_uri, output_uri, config.overwrite, storage_options=config.inputs.storage_options)
    options = config.inference
    model = check_model(options)
    labels = model.labels

    with job_session(spark, master=config.master, remote=config.remote, quiet=config.quiet,
                     outputs=(output_uri,)) as spark:
        fs = job_filesystem(spark, StorageOptions.parse(config.inputs.storage_options))
        check_paths(fs, input_uri, output_uri, config.overwrite, input_name=config.input, output_name=config.output)
        source = open_source(spark, input_uri, config.inputs)
        _check_partition_column(config.partition_by, source)

        plan = start_inference(spark, options, model, source=source)
        job_id = plan.job_id
        sidecar_stats = JobSidecarStats(spark, job_id)
        schema = task_output_schema(options.task, **layout_of(options))
        if source.has_labels:  # carried from the input, as the source reads it
            schema = schema.append(pa.field(TRUE_LABEL, pa.string()))
        outputs = sidecar_stats.observed(source.frame.mapInArrow(sidecar_stats.task_function(plan),
                                                                 sidecar_stats.ddl(schema)))
        counts = OutputCounts(spark, labels)
        outputs = counts.observed(outputs)
        if columns is not None:
            outputs = outputs.select(*columns)

        staging = staging_uri(output_uri, job_id)
        started = time.perf_counter()
        try:
            writer = outputs.write.partitionBy(config.partition_by) if config.partition_by else outputs.write
            writer.parquet(staging)
        except Exception as e:
            fs.delete(staging)
            raise task_error(e) from e
        elapsed = time.perf_counter() - started
        publish(fs, staging, output_uri, overwrite=config.overwrite)

        summary = _summarise(counts.totals(read_back=output_uri), elapsed, config, sidecar_stats.sidecars())
        summary.update(input=input_uri, output=output_uri, model=options.model.source,
                       weights=model.weights_label,
                       app_id=application_id(spark), job_id=job_id)
        text = json.dumps(summary, indent=2)
        fs.write_text(output_uri.rstrip("/") + "/" + SUMMARY_FILE, text)
        if config.summary:
            fs.write_text(to_uri(config.summary), text)
        return summary


def _check_partition_column(column: str | None, source: ImageSource) -> None:
    """--partition-by true_label needs an input that says what each image is."""
    if column == TRUE_LABEL and not source.has_labels:
        raise ConfigError(f"--partition-by {TRUE_LABEL}: this {source.format} input has no true labels; name its "
                          "label column with --label-column, or partition by label or label_name")


def _summarise(totals: dict, elapsed: float, config: ClassifyConfig, sidecars: list[dict]) -> dict:
    """The summary from the output's counts (`output_counts`: gathered while it was written)."""
    images, ok_rows = totals["images"], totals["ok"]
    # Accuracy only when every classified image has a true label: its ImageFolder class folder (a name from
    # --labels, or a class index), or the input's --label-column.
    accuracy = None
    if "labelled" in totals and ok_rows and totals["labelled"] == ok_rows:
        accuracy = round(totals["correct"] / ok_rows, 4)
    batch_sizes = sorted({s.get("batch_size") for s in sidecars if s.get("batch_size")})
    return {
        "images": images, "ok": ok_rows, "errors": images - ok_rows,
        "elapsed_s": round(elapsed, 3), "images_per_s": round(images / elapsed, 2) if elapsed else None,
        # the sidecars' (after any out-of-memory back-off), else the one asked for (None: auto)
        "batch_size": batch_sizes[-1] if batch_sizes else config.inference.batch_size,
        "accuracy": accuracy,
        "sidecars": sorted(sidecars, key=lambda s: (s["host"], str(s["executor"]))),
    }
