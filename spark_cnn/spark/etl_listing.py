"""Which files under the ETL's INPUT are there, and which of them are ready to be taken.

The ETL lists INPUT itself (not through Spark's file stream source): Spark's source skips files whose
modification time is older than its `maxFileAge` window behind the newest file it has seen, and it takes a
file the moment it is listed, half-written or not. Here every visible file is a candidate whatever its
modification time, and a file is taken only once it has settled: nothing has changed it for the settle time.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from spark_cnn.spark.listing import list_objects, matches_glob, walk_files
from spark_cnn.spark.storage import hadoop_files, local_path
from spark_cnn.task.object_store import StorageOptions


@dataclass(frozen=True, slots=True)
class ListedFile:
    """A file as one listing saw it: `path` spelled as Spark's file listing spells it (`file:/a b.jpg`)."""

    path: str
    size: int
    mtime_ms: int


@dataclass(frozen=True)
class Listing:
    """One listing of INPUT: its visible files, and the folders it could not list (spelled as the paths are),
    whose files are neither new nor gone."""

    files: list[ListedFile]
    unlisted: tuple[str, ...] = field(default=())


def list_input(spark: SparkSession, input_uri: str, glob: str | None,
               storage: StorageOptions | None = None) -> Listing:
    """Every visible file under `input_uri`, recursively (Spark's hidden-name rule; names matching `glob`).
    `storage`: the input is an object store read through pyarrow.fs (one paginated listing)."""
    local = local_path(input_uri)
    if local is not None:
        unlisted: list[str] = []
        files = list_local(local, glob, unlisted=unlisted)
        return Listing(files, tuple(unlisted))
    if storage is not None:
        return Listing([ListedFile(e.path, e.size, e.mtime_ms) for e in list_objects(input_uri, storage, glob=glob)])
    return Listing([ListedFile(path, size, mtime_ms) for path, size, mtime_ms in hadoop_files(spark, input_uri, glob)])


def list_local(folder: str, glob: str | None, *, unlisted: list[str] | None = None) -> list[ListedFile]:
    """The visible files under a local folder, as classify's listing walks it (regular files, and dangling links,
    whose rows say so; each real folder once). An unreadable folder is left out, so its files come once it can be
    read; it is added to `unlisted` (as `file:/folder`) when given."""
    files = []
    for entry in walk_files(folder, glob=glob, prefix="file:"):
        if entry.error is None:
            files.append(ListedFile(entry.path, entry.size, entry.mtime_ms))
        elif unlisted is not None:
            unlisted.append(entry.path)
    return files


def micro_batches(files: list[ListedFile], *, max_files: int, max_bytes: int) -> list[list[ListedFile]]:
    """`files` in order, cut into micro-batches of at most `max_files` files and `max_bytes` bytes (a file larger
    than `max_bytes` is a batch of its own).

    >>> [len(b) for b in micro_batches([ListedFile(str(i), 10, 0) for i in range(7)], max_files=3, max_bytes=25)]
    [2, 2, 2, 1]
    """
    batches: list[list[ListedFile]] = []
    current: list[ListedFile] = []
    size = 0
    for f in files:
        if current and (len(current) >= max_files or size + f.size > max_bytes):
            batches.append(current)
            current, size = [], 0
        current.append(f)
        size += f.size
    if current:
        batches.append(current)
    return batches


def gone(taken: Iterable[str], listing: Listing, glob: str | None) -> set[str]:
    """Taken files this listing did not find: not listed, not under a folder it could not list, and named as
    `glob` lets it see (a file the glob hides may still be there). The checkpoint forgets a file gone from every
    listing for a week (`EtlLog.forget_gone`), so it holds what INPUT holds, not every file it ever took."""
    listed = {f.path for f in listing.files}
    hidden_under = tuple(folder.rstrip("/") + "/" for folder in listing.unlisted)
    return {path for path in taken
            if path not in listed and not (hidden_under and path.startswith(hidden_under))
            and matches_glob(posixpath.basename(path), glob)}


@dataclass(frozen=True)
class Waiting:
    """A file not yet settled: its size and modification time when first seen so, and when that was."""

    size: int
    mtime_ms: int
    since_ms: int


def settled(listed: list[ListedFile], taken: set[str], waiting: dict[str, Waiting], now_ms: int,
            settle_ms: int) -> tuple[list[ListedFile], dict[str, Waiting]]:
    """The files not yet taken that are ready (oldest first), and those still waiting.

    Ready: modified at least `settle_ms` ago, or seen with the same size and modification time by a run at least
    `settle_ms` ago (a modification time in the future, from an archive or a clock ahead of ours)."""
    ready, still = [], {}
    for f in listed:
        if f.path in taken:
            continue
        before = waiting.get(f.path)
        unchanged = before is not None and (before.size, before.mtime_ms) == (f.size, f.mtime_ms)
        if settle_ms <= 0 or f.mtime_ms <= now_ms - settle_ms or (unchanged and now_ms - before.since_ms >= settle_ms):
            ready.append(f)
        else:
            still[f.path] = before if unchanged else Waiting(f.size, f.mtime_ms, now_ms)
    ready.sort(key=lambda f: (f.mtime_ms, f.path))
    return ready, still
