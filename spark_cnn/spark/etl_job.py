"""The incremental ETL job: classify the images that arrived under INPUT since the last run, append them to OUTPUT.

Each run lists INPUT (recursively, `etl_listing`), takes the files its checkpoint (`etl_log`) has not taken yet
and that have settled (unchanged for `--settle-seconds`, whatever their modification time), processes them in
micro-batches of at most `max_files_per_trigger` files and `max_bytes_per_trigger` bytes, and stops, so cron or
Airflow can start it again and again. A micro-batch's rows are counted as they are written (`output_counts`), not
read back.

Exactly once, also across a run killed midway: batch N's files are written to the checkpoint before the batch
runs; the batch goes into its own directory `OUTPUT/batch=N`, written under `OUTPUT/_staging` (hidden from
readers) and renamed into place; then the checkpoint marks N done. A killed run's batch N is replayed with the
same files, and the replay replaces `batch=N` whole. So every file is in exactly one batch directory, and OUTPUT
is plain Parquet that any reader can read (hidden `.`/`_` entries are skipped, `batch` is a partition column).

A batch that fails (a model that raises on one image) fails the run and is replayed first by the next; once it
has failed `etl_isolate.MAX_BATCH_ATTEMPTS` times, its halves run on their own, recursively, and each file that
fails alone becomes an error row (the summary's `isolated`), so new files are never held back for good.

Local files are read by the tasks (LOCAL_FILES, under the --max-file-bytes guard), so a file that cannot be read,
was deleted after the listing, or is too large is a row with its error, never a failed batch. Files on other
filesystems are read by Spark (binaryFile, missing and unreadable files skipped); each planned file without a
row then gets an error row here.
"""

from __future__ import annotations

import json
import os
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_cnn.config import EtlConfig
from spark_cnn.errors import InputError
from spark_cnn.formats.encodings import ENCODED, LOCAL_FILES
from spark_cnn.spark.classify_job import SUMMARY_FILE
from spark_cnn.spark.etl_isolate import run_batch
from spark_cnn.spark.etl_listing import ListedFile, gone, list_input, micro_batches, settled
from spark_cnn.spark.etl_log import EtlLog
from spark_cnn.spark.job_io import check_local_paths, check_paths, job_session, task_error
from spark_cnn.spark.listing import Entry
from spark_cnn.spark.output_counts import OutputCounts
from spark_cnn.spark.planning import check_model, start_inference
from spark_cnn.spark.session import application_id
from spark_cnn.spark.sidecar_stats import JobSidecarStats
from spark_cnn.spark.sources import IMAGE_ROW_SCHEMA, ImageSource, listed_frame
from spark_cnn.spark.storage import HadoopFS, job_filesystem, local_path, to_uri
from spark_cnn.task.object_store import NO_STORAGE, StorageOptions, for_tasks, is_store_uri, serves
from spark_cnn.task.schema import layout_of, output_schema, spark_ddl
from spark_cnn.task.stream import InferencePlan

BATCH_COLUMN = "batch"
STAGING = "_staging"
# Spark's internal option that its own file stream source sets: the listed paths are files, not glob patterns.
NO_GLOB = "__globPaths__"


def run_etl(config: EtlConfig, *, spark: SparkSession | None = None) -> dict:
    """One run: process every settled file not yet processed, then stop. Returns the run's summary (also written
    as JSON to OUTPUT/_summary.json and --summary)."""
    job = config.classify
    options = job.inference
    input_uri, output_uri, checkpoint_uri = to_uri(job.input), to_uri(job.output), to_uri(config.checkpoint)
    check_local_paths(input_uri, output_uri, True, checkpoint_uri=checkpoint_uri,  # appends: OUTPUT may exist
                      storage_options=job.inputs.storage_options)
    input_path = local_path(input_uri)
    storage = None  # an object store the driver lists and the tasks read (pyarrow.fs)
    if is_store_uri(input_uri):
        resolved = for_tasks(input_uri, StorageOptions.parse(job.inputs.storage_options))
        storage = resolved if serves(input_uri, resolved) else None
    if input_path is not None and not os.path.isdir(input_path):
        raise InputError(f"input {input_path} is not a folder: the ETL job watches a folder for new images")
    model = check_model(options)  # as the classify job: in a child process, before Spark starts

    with job_session(spark, master=job.master, remote=job.remote, quiet=job.quiet, app_name="spark_cnn_etl",
                     outputs=(output_uri,), checkpoints=(checkpoint_uri,)) as spark:
        app_id = application_id(spark)
        fs = job_filesystem(spark, StorageOptions.parse(job.inputs.storage_options))
        check_paths(fs, input_uri, output_uri, True, input_name=job.input, checkpoint_uri=checkpoint_uri)
        started = time.perf_counter()
        log = EtlLog(fs, checkpoint_uri)
        log.claim_input(input_uri)  # its paths are spelled as INPUT is: another spelling would take all again
        in_tasks = input_path is not None or storage is not None
        # The frame's contents do not matter to planning: only the encoding and storage (no labels, as before).
        encoding = LOCAL_FILES if in_tasks else ENCODED
        plan = start_inference(spark, options, model,
                               source=ImageSource(spark.createDataFrame([], IMAGE_ROW_SCHEMA), "images", encoding,
                                                  storage=storage or NO_STORAGE))
        stats = JobSidecarStats(spark, plan.job_id)
        writer = MicroBatchWriter(spark, fs, plan, stats, output_uri, in_tasks=in_tasks)

        pending = log.pending_batch()
        if pending is not None:  # a killed or failed run's batch: the same files again, replacing its output
            run_batch(log, writer, *pending, replay=True)
        listing = list_input(spark, input_uri, job.inputs.glob, storage)
        now_ms = int(time.time() * 1000)
        log.forget_gone(gone(log.taken, listing, job.inputs.glob), now_ms)
        ready, waiting = settled(listing.files, log.taken, log.waiting(), now_ms, int(config.settle_s * 1000))
        del listing  # a million listed files: the driver keeps only what it takes
        log.set_waiting(waiting)
        for files in micro_batches(ready, max_files=config.max_files_per_trigger,
                                   max_bytes=config.max_bytes_per_trigger):
            run_batch(log, writer, log.plan(files), files, replay=False)
        log.compact()  # once this run's batches are committed, so it folds them in too
        elapsed = time.perf_counter() - started

        summary = run_summary(writer.batches, elapsed, options.batch_size, stats.sidecars())
        summary.update(input=input_uri, output=output_uri, checkpoint=checkpoint_uri, model=options.model.source,
                       weights=model.weights_label,
                       app_id=app_id, job_id=plan.job_id, waiting=len(waiting))
        text = json.dumps(summary, indent=2)
        if writer.batches:  # a run with nothing new leaves the last run's summary in place
            fs.write_text(output_uri.rstrip("/") + "/" + SUMMARY_FILE, text)
        if job.summary:
            fs.write_text(to_uri(job.summary), text)
        return summary


class MicroBatchWriter:
    """Batch N's files -> OUTPUT/batch=N, replacing any earlier attempt at N; one row per file."""

    def __init__(self, spark: SparkSession, fs: HadoopFS, plan: InferencePlan, stats: JobSidecarStats,
                 output_uri: str, *, in_tasks: bool):
        self.spark, self.fs, self.plan, self.stats, self.in_tasks = spark, fs, plan, stats, in_tasks
        self.output_uri = output_uri.rstrip("/")
        endpoint = plan.endpoint
        self.schema = output_schema(**layout_of(endpoint))
        self.batches: list[dict] = []  # {batch, images, errors, elapsed_s[, isolated]}, this run's
        self._started: dict[int, float] = {}  # batch -> when its attempt began (perf_counter)
        self._parts: dict[int, tuple[int, int]] = {}  # batch -> (rows, error rows) written so far

    def write(self, batch_id: int, files: list[ListedFile]) -> None:
        """The whole batch in one Spark job."""
        self.begin(batch_id)
        staging = self._staging(batch_id)
        self._parts[batch_id] = self._rows(files, staging)
        self._publish(batch_id, files, staging, [])

    # A batch that keeps failing (`etl_isolate.run_batch`): `begin`, `write_part` per group of its files, `finish`.

    def begin(self, batch_id: int) -> None:
        self._started[batch_id] = time.perf_counter()
        self._parts[batch_id] = (0, 0)
        self.fs.delete(self._staging(batch_id))  # a killed attempt's leftovers

    def write_part(self, batch_id: int, files: list[ListedFile]) -> None:
        """Some of the batch's files in a Spark job of their own, added to its staging folder once all their
        rows are written (a failed job adds nothing); raises when the job fails."""
        staging = self._staging(batch_id)
        part = f"{staging}.part"
        self.fs.delete(part)
        try:
            written, failed = self._rows(files, part)
            if written != len(files):
                raise RuntimeError(f"a part of micro-batch {batch_id} wrote {written} rows for {len(files)} files")
        except BaseException:
            self.fs.delete(part)
            raise
        if self.fs.exists(staging):  # each job names its files uniquely (part-N-<job uuid>): no clash
            for name in self.fs.list_names(part):
                if not name.startswith(("_", ".")):  # Hadoop moves a file's checksum file with it
                    self.fs.rename(f"{part}/{name}", f"{staging}/{name}")
            self.fs.delete(part)
        else:
            self.fs.rename(part, staging)
        done, errors = self._parts[batch_id]
        self._parts[batch_id] = (done + written, errors + failed)

    def finish(self, batch_id: int, files: list[ListedFile], errors: list[tuple[str, str]]) -> None:
        """Publish the parts written, with an error row for each file in `errors` (path, error)."""
        staging = self._staging(batch_id)
        if errors:
            self._append(self._error_rows(errors), staging)
            done, failed = self._parts[batch_id]
            self._parts[batch_id] = (done + len(errors), failed + len(errors))
        self._publish(batch_id, files, staging, [path for path, _ in errors])

    def _staging(self, batch_id: int) -> str:
        # Under `_staging`, which readers of OUTPUT skip; the batch's own folder name stays readable for the count.
        return f"{self.output_uri}/{STAGING}/{BATCH_COLUMN}={batch_id}"

    def _rows(self, files: list[ListedFile], uri: str) -> tuple[int, int]:
        """One row per file of `files` written to the new folder `uri`: (rows, error rows)."""
        counts = OutputCounts(self.spark)
        self._classify(self._images(files), uri, counts)
        if self.in_tasks and counts.observing:  # the tasks wrote one row per file they were given (place_rows)
            totals = counts.totals()
            written, failed, unread = totals["images"], totals["images"] - totals["ok"], []
        else:  # read by Spark (other filesystems): what its scan skipped still gets its row
            rows = self.spark.read.parquet(uri).select("path", F.col("error").isNotNull().alias("failed"))
            rows = rows.collect()
            written, failed = len(rows), sum(row.failed for row in rows)
            unread = sorted({f.path for f in files} - {row.path for row in rows})
        if unread:
            sizes = {f.path: f.size for f in files}
            self._append(self._error_rows([(p, unread_error(sizes[p], self.plan.decode_options.max_file_bytes))
                                           for p in unread]), uri)
        return written + len(unread), failed + len(unread)

    def _publish(self, batch_id: int, files: list[ListedFile], staging: str, isolated: list[str]) -> None:
        written, failed = self._parts.pop(batch_id)
        if written != len(files):
            raise RuntimeError(f"micro-batch {batch_id} wrote {written} rows for {len(files)} "
                               "files; nothing was committed, so the next run redoes it")
        target = f"{self.output_uri}/{BATCH_COLUMN}={batch_id}"
        self.fs.delete(target)  # an earlier attempt at this batch, killed before the checkpoint marked it done
        self.fs.rename(staging, target)
        started = self._started.pop(batch_id)
        self.batches.append({"batch": batch_id, "images": len(files), "errors": failed,
                             "elapsed_s": round(time.perf_counter() - started, 3),
                             **({"isolated": isolated} if isolated else {})})

    def _images(self, files: list[ListedFile]) -> DataFrame:
        """(path, content[, size]): no content for files the tasks read (packed as classify packs a listing);
        else read by Spark here."""
        if self.in_tasks:
            return listed_frame(self.spark, [Entry(f.path, f.size) for f in files])
        limit = self.plan.decode_options.max_file_bytes
        readable = [f.path for f in files if 0 < f.size <= limit]
        if not readable:
            return self.spark.createDataFrame([], IMAGE_ROW_SCHEMA)
        return (self.spark.read.format("binaryFile").option(NO_GLOB, "false").option("ignoreMissingFiles", "true")
                .option("ignoreCorruptFiles", "true").load(readable).select("path", "content"))

    def _classify(self, images: DataFrame, uri: str, counts: OutputCounts) -> None:
        stats = self.stats
        outputs = stats.observed(images.mapInArrow(stats.task_function(self.plan), stats.ddl(self.schema)))
        self._save(counts.observed(outputs), uri, "error")

    def _append(self, rows: DataFrame, uri: str) -> None:
        self._save(rows, uri, "append")

    def _save(self, frame: DataFrame, uri: str, mode: str) -> None:
        try:
            frame.write.mode(mode).parquet(uri)
        except Exception as e:
            self.fs.delete(uri)
            raise task_error(e) from e

    def _error_rows(self, errors: list[tuple[str, str]]) -> DataFrame:
        """Output rows with only `path` and `error` set."""
        rows = [tuple(path if field.name == "path" else error if field.name == "error" else None
                      for field in self.schema) for path, error in errors]
        return self.spark.createDataFrame(rows, spark_ddl(self.schema))


def unread_error(size: int, max_file_bytes: int) -> str:
    """Why Spark's scan gave no row for a listed file of `size` bytes (the task's wording for the same cases)."""
    if size == 0:
        return "empty file (0 bytes)"
    if size > max_file_bytes:
        return f"file too large: {size} bytes, more than --max-file-bytes {max_file_bytes}"
    return "cannot read file: it was gone or unreadable when its micro-batch ran"


def run_summary(batches: list[dict], elapsed: float, batch_size: int | None, sidecars: list[dict]) -> dict:
    """What one run did: new images, errors, rate, micro-batches, sidecars."""
    images = sum(b["images"] for b in batches)
    errors = sum(b["errors"] for b in batches)
    isolated = [path for b in batches for path in b.get("isolated", [])]
    sizes = sorted({s.get("batch_size") for s in sidecars if s.get("batch_size")})
    return {
        "images": images, "ok": images - errors, "errors": errors,
        "elapsed_s": round(elapsed, 3), "images_per_s": round(images / elapsed, 2) if elapsed and images else None,
        "batch_size": sizes[-1] if sizes else batch_size,
        "accuracy": None,
        "micro_batches": batches,
        "isolated": isolated,  # files whose micro-batch kept failing and that failed alone: error rows
        "sidecars": sorted(sidecars, key=lambda s: (s["host"], str(s["executor"]))),
    }
