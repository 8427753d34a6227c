"""The incremental ETL job: classify the images that arrived under INPUT since the last run, append them to OUTPUT.

A Structured Streaming file source (binaryFile, recursive) with `trigger(availableNow=True)` and a checkpoint
finds the new files, processes them in micro-batches of at most `max_files_per_trigger`, and stops, so cron or
Airflow can start the job again and again.

Exactly once, also across a run killed midway: each micro-batch goes through `foreachBatch` into its own
directory `OUTPUT/batch=N`, written under `OUTPUT/_staging` (hidden from readers) and renamed into place. Spark
records the files of batch N (offsets and source log) before the batch runs and marks it committed only after
`foreachBatch` returns; a killed run replays batch N with the same files, and the replay replaces `batch=N`
whole. So every image is in exactly one batch directory, and OUTPUT is plain Parquet that any reader can read
(Spark, pyarrow: hidden `.`/`_` entries are skipped, `batch` is a partition column).

Why not the Parquet file sink: its `_spark_metadata` log gives exactly-once only to readers that go through it,
and it cannot add rows the scan never produced. Spark's file scan drops zero-byte files; the source's own log of
the batch still lists them, so each batch adds them back (empty content, hence one row with its error), as the
batch classify job does.
"""

from __future__ import annotations

import json
import os
import time
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_cnn.config import EtlConfig, InputOptions
from spark_cnn.errors import ConfigError, InputError
from spark_cnn.formats.encodings import ENCODED
from spark_cnn.spark.accumulators import SidecarStatsParam
from spark_cnn.spark.classify_job import SUMMARY_FILE
from spark_cnn.spark.executor import SPARK_TASK
from spark_cnn.spark.job_io import check_local_paths, check_paths, job_session, task_error
from spark_cnn.spark.planning import check_model, start_inference
from spark_cnn.spark.sources import IMAGE_ROW_SCHEMA, ImageSource
from spark_cnn.spark.storage import HadoopFS, local_path, to_uri
from spark_cnn.task.schema import output_schema, spark_ddl
from spark_cnn.task.stream import InferencePlan, PartitionInference

BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length bigint, content binary"
BATCH_COLUMN = "batch"
STAGING = "_staging"
SOURCE_LOG = "sources/0"  # the file source's log inside the checkpoint: which files each of its entries took
OFFSETS_LOG = "offsets"  # the query's log: which source entries each batch covers


def run_etl(config: EtlConfig, *, spark: SparkSession | None = None) -> dict:
    """One run: process every file not yet processed, then stop. Returns the run's summary (also written as JSON
    to OUTPUT/_summary.json and --summary)."""
    job = config.classify
    options = job.inference
    input_uri, output_uri, checkpoint_uri = to_uri(job.input), to_uri(job.output), to_uri(config.checkpoint)
    check_local_paths(input_uri, output_uri, True, checkpoint_uri=checkpoint_uri)  # appends: OUTPUT may exist
    input_path = local_path(input_uri)
    if input_path is not None and not os.path.isdir(input_path):
        raise InputError(f"input {input_path} is not a folder: the ETL job watches a folder for new images")
    model = check_model(options)  # as the classify job: in a child process, before Spark starts

    with job_session(spark, master=job.master, quiet=job.quiet, app_name="spark_cnn_etl") as spark:
        app_id = spark.sparkContext.applicationId
        fs = HadoopFS(spark)
        check_paths(fs, input_uri, output_uri, True, input_name=job.input, checkpoint_uri=checkpoint_uri)
        source = new_images(spark, input_uri, job.inputs, config.max_files_per_trigger)
        plan = start_inference(spark, options, model, source=source)
        stats = spark.sparkContext.accumulator({}, SidecarStatsParam())
        writer = MicroBatchWriter(spark, fs, plan, stats, output_uri, checkpoint_uri)

        started = time.perf_counter()
        query = (source.frame.writeStream.foreachBatch(writer).option("checkpointLocation", checkpoint_uri)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination()
        except Exception as e:
            raise task_error(e) from e
        elapsed = time.perf_counter() - started

        summary = run_summary(writer.batches, elapsed, options.batch_size, list(stats.value.values()))
        summary.update(input=input_uri, output=output_uri, checkpoint=checkpoint_uri, model=options.model.source,
                       app_id=app_id, job_id=plan.job_id)
        text = json.dumps(summary, indent=2)
        if writer.batches:  # a run with nothing new leaves the last run's summary in place
            fs.write_text(output_uri.rstrip("/") + "/" + SUMMARY_FILE, text)
        if job.summary:
            fs.write_text(to_uri(job.summary), text)
        return summary


def new_images(spark: SparkSession, input_uri: str, inputs: InputOptions, max_files_per_trigger: int) -> ImageSource:
    """The stream of image files under `input_uri` not yet taken by the checkpoint's query, as (path, content,
    ...) rows: binaryFile, recursive, names matching `inputs.glob` (EtlConfig admits image-file inputs only)."""
    reader = (spark.readStream.format("binaryFile").schema(BINARY_FILE_SCHEMA).option("recursiveFileLookup", "true")
              .option("maxFilesPerTrigger", max_files_per_trigger))
    if inputs.glob:
        reader = reader.option("pathGlobFilter", inputs.glob)
    return ImageSource(reader.load(input_uri), format="images", encoding=ENCODED)


class MicroBatchWriter:
    """The foreachBatch function: batch N's images -> OUTPUT/batch=N, replacing any earlier attempt at N."""

    def __init__(self, spark: SparkSession, fs: HadoopFS, plan: InferencePlan, stats, output_uri: str,
                 checkpoint_uri: str):
        self.spark, self.fs, self.plan, self.stats = spark, fs, plan, stats
        self.output_uri, self.checkpoint_uri = output_uri.rstrip("/"), checkpoint_uri.rstrip("/")
        self.batches: list[dict] = []  # {batch, images, errors, elapsed_s}, this run's

    def __call__(self, files: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        target = f"{self.output_uri}/{BATCH_COLUMN}={batch_id}"
        # Under `_staging`, which readers of OUTPUT skip; the batch's own folder name stays readable for the count.
        staging = f"{self.output_uri}/{STAGING}/{BATCH_COLUMN}={batch_id}"
        self.fs.delete(staging)  # a killed attempt's leftovers
        self._classify(files.select("path", "content"), staging, mode="error")
        written = self.spark.read.parquet(staging).select("path", F.col("error").isNotNull().alias("failed")).collect()
        unread = sorted(set(self._taken_files(batch_id)) - {row.path for row in written})
        if unread:  # zero-byte files: the scan drops them, the contract wants one row each (with its error)
            self._classify(self.spark.createDataFrame([(p, b"") for p in unread], IMAGE_ROW_SCHEMA), staging,
                           mode="append")
        errors = sum(row.failed for row in written) + len(unread)
        self.fs.delete(target)  # an earlier attempt at this batch, killed before Spark committed it
        self.fs.rename(staging, target)
        self.batches.append({"batch": batch_id, "images": len(written) + len(unread), "errors": errors,
                             "elapsed_s": round(time.perf_counter() - started, 3)})

    def _classify(self, images: DataFrame, uri: str, *, mode: str) -> None:
        endpoint = self.plan.endpoint
        outputs = images.mapInArrow(PartitionInference(self.plan, self.stats, SPARK_TASK),
                                    spark_ddl(output_schema(logits=endpoint.logits, embeddings=endpoint.embeddings)))
        try:
            outputs.write.mode(mode).parquet(uri)
        except Exception as e:
            self.fs.delete(uri)
            raise task_error(e) from e

    def _taken_files(self, batch_id: int) -> list[str]:
        """The files the stream's source took into this batch, from its logs in the checkpoint.

        Batch N covers the source's log entries after batch N-1's end offset up to its own (offsets/N): usually
        the one entry N, but more when a killed run had logged files it never got to."""
        end = self._source_offset(batch_id)
        start = self._source_offset(batch_id - 1) if batch_id > 0 else -1
        folder = f"{self.checkpoint_uri}/{SOURCE_LOG}"
        names = self.fs.list_names(folder)
        texts: dict[str, str] = {}
        paths: list[str] = []
        for entry in range(start + 1, end + 1):
            name = source_log_file(names, entry)
            if name is None:
                raise ConfigError(f"the checkpoint's source log {folder} has no entry {entry}: is this checkpoint "
                                  "from another Spark version? Start a new one with --checkpoint")
            if name not in texts:
                texts[name] = self.fs.read_text(f"{folder}/{name}")
            paths += source_log_paths(texts[name], entry)
        return paths

    def _source_offset(self, batch_id: int) -> int:
        return source_offset(self.fs.read_text(f"{self.checkpoint_uri}/{OFFSETS_LOG}/{batch_id}"))


def source_offset(text: str) -> int:
    """The file source's end offset in an offsets log file: a version line, the batch metadata, then one line
    per source (`{"logOffset": K}`)."""
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        return int(json.loads(lines[-1])["logOffset"])
    except (IndexError, ValueError, KeyError, TypeError) as e:
        raise ConfigError("the checkpoint's offsets log is not in a format this version reads; start a new "
                          "checkpoint") from e


def source_log_file(names: list[str], batch_id: int) -> str | None:
    """Which file of the source log holds entry `batch_id`: its own file, or (after compaction) the first
    `K.compact` with K >= batch_id."""
    if str(batch_id) in names:
        return str(batch_id)
    compacted = sorted(int(n.split(".")[0]) for n in names if n.endswith(".compact") and n.split(".")[0].isdigit())
    return next((f"{k}.compact" for k in compacted if k >= batch_id), None)


def source_log_paths(text: str, batch_id: int) -> list[str]:
    """The files of source log entry `batch_id` in a source log file (a version line, then one JSON entry per
    file), spelled as Spark's binaryFile `path` column spells them."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("v"):
        raise ConfigError("the checkpoint's source log is not in a format this version reads; start a new one")
    paths = []
    for line in lines[1:]:
        if line.strip():
            entry = json.loads(line)
            if entry.get("batchId") == batch_id:
                paths.append(hadoop_path(entry["path"]))
    return paths


def hadoop_path(uri: str) -> str:
    """The log's URL-encoded URI (file:///a%20b) as Hadoop's Path prints it (file:/a b)."""
    parsed = urlparse(uri)
    path = unquote(parsed.path)
    return f"{parsed.scheme}://{parsed.netloc}{path}" if parsed.netloc else f"{parsed.scheme}:{path}"


def run_summary(batches: list[dict], elapsed: float, batch_size: int | None, sidecars: list[dict]) -> dict:
    """What one run did: new images, errors, rate, micro-batches, sidecars."""
    images = sum(b["images"] for b in batches)
    errors = sum(b["errors"] for b in batches)
    sizes = sorted({s.get("batch_size") for s in sidecars if s.get("batch_size")})
    return {
        "images": images, "ok": images - errors, "errors": errors,
        "elapsed_s": round(elapsed, 3), "images_per_s": round(images / elapsed, 2) if elapsed and images else None,
        "batch_size": sizes[-1] if sizes else batch_size,
        "accuracy": None,
        "micro_batches": batches,
        "sidecars": sorted(sidecars, key=lambda s: (s["host"], str(s["executor"]))),
    }
