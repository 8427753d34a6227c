"""What every batch job (classify, embed, to-petastorm, etl) does around its Spark work: check its paths before
any work, own or borrow the session, stage the output and publish it by a rename, and turn a task's failure
back into the error the task raised.

Publishing with `--overwrite` never deletes before the new output is in place: the old output is moved to a
hidden sibling `.NAME.spark_cnn-JOB.aside`, the staged one moved in, OUTPUT marked complete (`COMPLETE_MARKER`,
written last), then the old one deleted. On an object store each move copies and deletes object by object, so a
run killed midway leaves the files of one output split between two names; markers say which move was under way
(the aside is marked once the old output is wholly there). The next job writing the same OUTPUT (holding its
lock, `job_lock`) finishes the work (`recover_output`): with OUTPUT marked it deletes the old output, otherwise
it puts the old output back whole, merging its files from both names.
"""

from __future__ import annotations

import logging
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
from spark_cnn.spark.job_lock import job_locks
from spark_cnn.spark.listing import check_store_input
from spark_cnn.spark.locations import check_checkpoint_location, check_output_location
from spark_cnn.spark.session import application_id, owns_executors, spark_session
from spark_cnn.spark.storage import ArrowFS, HadoopFS, local_path
from spark_cnn.task.launcher import stop_sidecars
from spark_cnn.task.object_store import StorageOptions, for_tasks, is_store_uri, serves

_log = logging.getLogger(__name__)
_TASK_ERROR = re.compile(r"spark_cnn\.errors\.(\w+): (.+)")
_ERROR_TYPES = {cls.__name__: cls for cls in (ConfigError, ImageError, InputError, ModelError, SidecarError,
                                              SidecarHung, SidecarLost)}


def check_local_paths(input_uri: str, output_uri: str | None, overwrite: bool, *,
                      checkpoint_uri: str | None = None, storage_options=()) -> None:
    """Fail fast, before Spark starts: where the output (and an ETL checkpoint) may go, on any filesystem; that
    local paths exist or not as needed, and an object-store input (read through pyarrow.fs with
    `storage_options`) is there; Hadoop's filesystems are checked once the session is up."""
    if output_uri is not None:
        check_output_location(input_uri, output_uri)
    if checkpoint_uri is not None:
        check_checkpoint_location(input_uri, checkpoint_uri, output_uri)
    input_path = local_path(input_uri)
    if input_path is not None and not os.path.exists(input_path):
        raise InputError(f"input {input_path} does not exist")
    if is_store_uri(input_uri):
        storage = for_tasks(input_uri, StorageOptions.parse(storage_options))
        if serves(input_uri, storage):
            check_store_input(input_uri, storage)
    output_path = local_path(output_uri) if output_uri is not None else None
    if output_path is not None and os.path.exists(output_path) and not overwrite:
        raise InputError(f"output {output_path} already exists; use --overwrite to replace it")


def check_paths(fs: HadoopFS, input_uri: str, output_uri: str | None, overwrite: bool, *, input_name: str,
                output_name: str | None = None, checkpoint_uri: str | None = None) -> None:
    """The same checks on any filesystem, through Hadoop (paths as its FileSystem qualifies them); `*_name` is
    how the user wrote each path. An old output left aside by a killed publish is restored or removed first."""
    in_store = is_store_uri(input_uri) and not isinstance(fs, ArrowFS) and serves(input_uri)
    qualified_input = ArrowFS().qualify(input_uri) if in_store else fs.qualify(input_uri)
    if output_uri is not None:
        check_output_location(qualified_input, fs.qualify(output_uri))
    if checkpoint_uri is not None:
        check_checkpoint_location(qualified_input, fs.qualify(checkpoint_uri),
                                  fs.qualify(output_uri) if output_uri is not None else None)
    if not in_store and not fs.exists(input_uri):  # a store input was checked before the session started
        raise InputError(f"input {input_name} does not exist")
    if output_uri is None:
        return
    recover_output(fs, output_uri)
    if fs.exists(output_uri) and not overwrite:
        raise InputError(f"output {output_name or output_uri} already exists; use --overwrite to replace it")


@contextmanager
def job_session(spark: SparkSession | None, *, master: str | None, quiet: bool, app_name: str = "spark_cnn",
                remote: str | None = None, outputs: tuple[str, ...] = (),
                checkpoints: tuple[str, ...] = ()) -> Iterator[SparkSession]:
    """`spark` when given (the caller owns it), else a new session (on `remote`, a Spark Connect server, when
    given) that is stopped at the end, and then this host's sidecars of its application when the session's
    executors end with it (on a cluster they exit with their executors; on a shared Connect server they serve
    its other clients until they idle out). The job's `outputs` and `checkpoints` are locked (`job_lock`) before
    the session starts and until it ends, so a second job writing one of them stops at once."""
    with job_locks(outputs, checkpoints):
        if spark is not None:
            yield spark
            return
        spark = spark_session(master=master, remote=remote, quiet=quiet, app_name=app_name)
        try:
            yield spark
        finally:
            # asked before the stop, which ends what they read (a local Connect server and its variable); the
            # sidecars go after it: a task of a failed job still running could start one between the two
            app_id = application_id(spark) if owns_executors(spark) else None
            spark.stop()
            if app_id is not None:
                stop_sidecars(app_id)


def staging_uri(output_uri: str, job_id: str) -> str:
    """A hidden sibling of the output (Spark and Parquet readers skip names starting with '.')."""
    parent, _, name = output_uri.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.spark_cnn-{job_id}{STAGING_SUFFIX}"


STAGING_SUFFIX = ".tmp"  # the new output while it is written
ASIDE_SUFFIX = ".aside"  # the old output while the new one is moved in
LEGACY_ASIDE_SUFFIX = ".old"  # what versions before the completion marker left aside (no marker, no torn renames)
# Written into OUTPUT as the last step of a publish: OUTPUT is whole. Into an aside folder once the old output is
# wholly there. Readers skip names starting with "_" (Spark's own _SUCCESS moves with the files, so proves nothing).
COMPLETE_MARKER = "_SPARK_CNN_COMPLETE"


def aside_uri(staging: str) -> str:
    """Where `publish` keeps the old output of the job staged at `staging`: the same hidden name, `.aside`."""
    return staging.removesuffix(STAGING_SUFFIX) + ASIDE_SUFFIX


def _marker(folder: str) -> str:
    return folder.rstrip("/") + "/" + COMPLETE_MARKER


def publish(fs: HadoopFS, staging: str, output_uri: str, *, overwrite: bool) -> None:
    """Move the complete staging folder into place, then mark OUTPUT complete (`COMPLETE_MARKER`). With
    `overwrite`, the old output is first moved aside (a hidden sibling) and deleted only once OUTPUT carries the
    marker; a failure in between puts it back, and a killed run leaves it for `recover_output`.

    On an object store a folder's rename copies and deletes object by object, so a killed move leaves the files
    split between both names. The markers say which move was under way: the old output's marker is deleted
    before it moves, the aside is marked once the old output is wholly there (an empty aside when there was
    none), OUTPUT is marked once the new output is wholly there."""
    aside = aside_uri(staging)
    if overwrite and fs.exists(output_uri):
        fs.delete(_marker(output_uri))
        fs.rename(output_uri, aside)
    fs.write_text(_marker(aside), "")
    try:
        fs.rename(staging, output_uri)
    except BaseException as e:
        try:
            _restore(fs, aside, output_uri)
        except Exception:
            raise InputError(f"could not publish {output_uri} ({e}); the old output is at {aside}: the next job "
                             f"writing {output_uri} puts it back, or move it back to {output_uri}") from e
        raise
    fs.write_text(_marker(output_uri), "")
    fs.delete(aside)


def recover_output(fs: HadoopFS, output_uri: str) -> None:
    """Finish what a publish killed midway left (run by the next job writing OUTPUT, holding its lock): with
    OUTPUT marked complete the old output aside is deleted; otherwise OUTPUT is a part of either output and the
    old one is put back whole. That job's staged output is deleted."""
    parent, _, name = output_uri.rstrip("/").rpartition("/")
    prefix = f".{name}.spark_cnn-"
    for entry in sorted(fs.list_names(parent)):
        left = f"{parent}/{entry}"
        if not entry.startswith(prefix):
            continue
        if entry.endswith(ASIDE_SUFFIX):
            if fs.exists(_marker(output_uri)):
                _log.warning("deleting %s: the old output a killed job had replaced %s with", left, output_uri)
                fs.delete(left)
            else:
                _log.warning("restoring %s from %s, where a killed job had moved it", output_uri, left)
                _restore(fs, left, output_uri)
        elif entry.endswith(LEGACY_ASIDE_SUFFIX):
            if not fs.exists(output_uri):
                _log.warning("restoring %s from %s, where a killed job had moved it", output_uri, left)
                fs.rename(left, output_uri)
            fs.delete(left)
        else:
            continue
        fs.delete(left.rpartition(".")[0] + STAGING_SUFFIX)


def _restore(fs: HadoopFS, aside: str, output_uri: str) -> None:
    """Put the old output back at OUTPUT whole, whatever step of `publish` (or of an earlier `_restore`) was
    killed; each step leaves a state this function restores from."""
    if fs.exists(_marker(aside)):  # the old output is wholly aside: OUTPUT holds a part of the new one, if any
        fs.delete(output_uri)
        fs.delete(_marker(aside))
    # From here the old output's files are split between the aside and OUTPUT, each in one place or both.
    files = fs.list_files(aside)
    if not files:
        pass
    elif not fs.exists(output_uri):
        fs.rename(aside, output_uri)
    else:
        for relative in files:  # a file in both places was copied whole (an object copy is atomic)
            source, target = f"{aside}/{relative}", f"{output_uri.rstrip('/')}/{relative}"
            if fs.exists(target):
                fs.delete(source)
            else:
                fs.rename(source, target)
    fs.delete(aside)
    if fs.exists(output_uri):
        fs.write_text(_marker(output_uri), "")


def task_error(error: Exception) -> SparkCnnError:
    """A task's spark_cnn error, re-raised on the driver as itself, without the JVM stack around it."""
    match = _TASK_ERROR.search(str(error))
    if match:
        return _ERROR_TYPES.get(match.group(1), SparkCnnError)(match.group(2).strip())
    return SparkCnnError(f"the Spark job failed: {str(error).strip().splitlines()[0]}")
