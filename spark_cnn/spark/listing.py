"""Listing a local image folder: one entry per reachable file, one per folder that cannot be listed.

Spark's own listing (Hadoop's local filesystem) fails the whole job on one unreadable subfolder, follows a
symlink loop until the path is too long (listing the same files again at each turn), and its scan drops
zero-byte files. This walk follows symlinked folders but lists each real folder once (by device and inode: a
loop, or a second link to a folder already listed, adds nothing), keeps zero-byte files, and turns a folder it
cannot list into one entry with the reason, which becomes that folder's error row. Names Spark hides (`.x`,
`_x`, `x._COPYING_`) are skipped as Spark skips them; FIFOs, sockets and devices are not image files and are
skipped too (reading one could block a task). Object stores and HDFS (`list_objects`) are listed through
`pyarrow.fs` with the same hidden-name and glob rules, one recursive (paginated) listing per input. Pure: no Spark.
"""

from __future__ import annotations

import fnmatch
import heapq
import math
import os
import posixpath
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from spark_cnn.errors import InputError
from spark_cnn.task.object_store import StorageOptions, filesystem, join_uri, split_uri, storage_error

_scandir = os.scandir  # module attribute, so a test can make one folder fail as an unreadable one does

# Files the tasks read themselves (no content in the row) need not be packed by bytes: a task streams them one
# request at a time, so only the output decides how many files a partition should hold. Each task writes one
# output file, ~20 bytes of Parquet per classify row (`bench-scale --files 1000000`, docs/benchmarks.md): 20,000
# files per task make a million images 50 files of 0.4 MB instead of 1,954 of 10 KB, and a retried task redoes
# ~15 s of one core here at the near-free model's rate; fewer files per task only add tiny files and task costs.
MIN_FILES_PER_TASK = 20_000
# ... but never fewer partitions than this many per core (Spark's default parallelism, or
# spark.sql.files.minPartitionNum when set), Spark's tuning guide's 2-3 tasks per core: a slow task then leaves
# the other cores work ...
TASKS_PER_CORE = 3
# ... once there are this many files per core for each of those waves of tasks. An executor's tasks share one
# sidecar, so they progress together and end together, and each boundary between two waves idles every core of
# the executor for ~0.15 s (the old tasks' output committed, the new ones started). In 4,096-image jobs on the
# 2-core guest, 6 tasks gave a 0.77 useful share of the cores where 2 tasks gave 0.80 (docs/benchmarks.md); with
# 2,048 files a task lasts ~14 s a core there, and a boundary costs about 1% of it.
FILES_PER_CORE_PER_WAVE = 2048


@dataclass(frozen=True, slots=True)  # slots: a million entries of a listing cost ~100 MB less on the driver
class Entry:
    """A file to read (`error` None; `size` in bytes, 0 when it cannot be stat'ed; `mtime_ms` its modification
    time, the link's own for a dangling link) or a folder that could not be listed (`error` says why)."""

    path: str
    size: int = 0
    error: str | None = None
    mtime_ms: int = 0


def is_hidden(name: str) -> bool:
    """Spark's rule for names its file listing skips: `_x` (but not `k=v` partitions), `.x`, `x._COPYING_`."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")


def matches_glob(name: str, glob: str | None) -> bool:
    """Hadoop's file-name glob (as Spark's pathGlobFilter applies it): *, ?, [..] and {a,b} alternatives."""
    return glob is None or any(fnmatch.fnmatchcase(name, pattern) for pattern in _expand_braces(glob))


def _expand_braces(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    return [expanded for option in match.group(1).split(",") for expanded in _expand_braces(head + option + tail)]


def _reason(error: OSError) -> str:
    return f"{type(error).__name__}: {error.strerror or error}"


def walk_files(root: str, *, glob: str | None = None, prefix: str = "") -> Iterator[Entry]:
    """Every visible file under `root` (a folder, or one file) whose name matches `glob`, depth first in name
    order, and every folder below `root` that cannot be listed, their paths spelled `prefix` + path (`file:`
    as Spark spells them: a million files are not spelled twice). `root` itself unlistable: InputError."""
    root = posixpath.normpath(root)
    if not os.path.isdir(root):
        if matches_glob(os.path.basename(root), glob):
            yield _file_entry(root, prefix)
        return
    seen: set[tuple[int, int]] = set()
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            info = os.stat(folder)
            if (info.st_dev, info.st_ino) in seen:  # a symlink loop, or a folder listed under another path
                continue
            seen.add((info.st_dev, info.st_ino))
            with _scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as e:
            if folder == root:
                raise InputError(f"input {root} cannot be listed ({_reason(e)}): check its permissions") from e
            yield Entry(prefix + folder, error=f"cannot list folder: {_reason(e)}")
            continue
        subfolders = []
        for entry in entries:
            if is_hidden(entry.name):
                continue
            if _is_folder(entry):
                subfolders.append(entry.path)
            elif matches_glob(entry.name, glob):
                file = _file_entry(entry.path, prefix)
                if file is not None:
                    yield file
        pending.extend(reversed(subfolders))


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows symlinks
    except OSError:
        return False


def _file_entry(path: str, prefix: str = "") -> Entry | None:
    try:
        info = os.stat(path)
    except OSError:  # a dangling link, a loop of links: listed, so its read fails and it gets its error row
        try:
            return Entry(prefix + path, mtime_ms=os.lstat(path).st_mtime_ns // 1_000_000)
        except OSError:
            return Entry(prefix + path)
    if not stat.S_ISREG(info.st_mode):
        return None
    return Entry(prefix + path, info.st_size, mtime_ms=info.st_mtime_ns // 1_000_000)


def pack_partitions(entries: list[Entry], *, max_partition_bytes: int, open_cost_bytes: int,
                    min_partitions: int, min_files: int | None = None) -> list[list[Entry]]:
    """Group files into partitions as Spark's file scan does (FilePartition.getFilePartitions): largest first,
    each partition filled up to a split size, every file counting its size plus `open_cost_bytes`.

    `min_files` (files the tasks read themselves): where that gives partitions of fewer files on average (many
    small files: Spark's 4 MB open cost makes 32 files per partition, 31,250 tasks and output files for a million
    images), the files are spread instead over `merged_partition_count` partitions, largest first onto the
    lightest, so the partitions stay even in bytes. Spark's packing stands where it makes no more partitions
    than that (a handful of files). Large files are spread by the same count: a task streams them one at a time,
    so its bytes do not weigh on memory, and fewer waves of tasks leave the cores idle less often."""
    partitions = _spark_packing(entries, max_partition_bytes=max_partition_bytes, open_cost_bytes=open_cost_bytes,
                                min_partitions=min_partitions)
    if min_files is None or len(partitions) <= 1 or len(entries) >= min_files * len(partitions):
        return partitions
    count = merged_partition_count(len(entries), min_partitions=min_partitions, min_files=min_files)
    if len(partitions) <= count:
        return partitions
    bins: list[tuple[int, int]] = [(0, i) for i in range(count)]  # (bytes so far, partition), a heap
    merged: list[list[Entry]] = [[] for _ in range(count)]
    for entry in sorted(entries, key=lambda e: e.size, reverse=True):
        load, i = heapq.heappop(bins)
        merged[i].append(entry)
        heapq.heappush(bins, (load + entry.size + open_cost_bytes, i))
    return merged


def merged_partition_count(files: int, *, min_partitions: int, min_files: int) -> int:
    """Partitions for `files` small files: enough for `min_files` each, but at least one per core
    (`min_partitions`, Spark's default parallelism) and up to TASKS_PER_CORE per core, a wave of tasks for every
    FILES_PER_CORE_PER_WAVE files per core.

    >>> merged_partition_count(1_000_000, min_partitions=2, min_files=20_000)
    50
    >>> merged_partition_count(20_000, min_partitions=2, min_files=20_000)
    6
    >>> merged_partition_count(4_096, min_partitions=2, min_files=20_000), merged_partition_count(
    ...     8_192, min_partitions=2, min_files=20_000)
    (2, 4)
    """
    waves = max(1, min(TASKS_PER_CORE, files // (min_partitions * FILES_PER_CORE_PER_WAVE)))
    return max(1, min(files, max(min_partitions * waves, math.ceil(files / min_files))))


def _spark_packing(entries: list[Entry], *, max_partition_bytes: int, open_cost_bytes: int,
                   min_partitions: int) -> list[list[Entry]]:
    total = sum(e.size + open_cost_bytes for e in entries)
    split = min(max_partition_bytes, max(open_cost_bytes, total // max(1, min_partitions)))
    partitions: list[list[Entry]] = []
    current: list[Entry] = []
    size = 0
    for entry in sorted(entries, key=lambda e: e.size, reverse=True):
        if current and size + entry.size > split:
            partitions.append(current)
            current, size = [], 0
        current.append(entry)
        size += entry.size + open_cost_bytes
    if current:
        partitions.append(current)
    return partitions


def list_store(fs, root: str, *, glob: str | None = None, uri_of=lambda path: path) -> list[Entry]:
    """Every visible object under `root` on a pyarrow filesystem `fs` (a folder or prefix, or one object) whose
    name matches `glob`, in path order, `path` spelled by `uri_of(listed path)`. One recursive FileSelector: an
    object store answers with one paginated listing, whatever the depth. Raises what `fs` raises (the caller
    words it); `root` missing: FileNotFoundError."""
    from pyarrow.fs import FileSelector, FileType

    info = fs.get_file_info(root)
    if info.type == FileType.File:
        name = posixpath.basename(root)
        return [_store_entry(info, uri_of)] if matches_glob(name, glob) else []
    listed = fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=False))
    prefix = root.rstrip("/") + "/"
    entries = []
    for item in listed:
        if item.type != FileType.File:
            continue
        relative = item.path[len(prefix):] if item.path.startswith(prefix) else item.path
        parts = relative.split("/")
        if any(is_hidden(part) for part in parts) or not matches_glob(parts[-1], glob):
            continue
        entries.append(_store_entry(item, uri_of))
    return sorted(entries, key=lambda e: e.path)


def _store_entry(info, uri_of) -> Entry:
    mtime = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else 0
    return Entry(uri_of(info.path), info.size or 0, mtime_ms=mtime)


def list_objects(uri: str, options: StorageOptions, *, glob: str | None = None) -> list[Entry]:
    """`list_store` over the object store (or HDFS) of `uri`; any failure (no such bucket, no credentials, an
    endpoint that does not answer, nothing at `uri`) is one InputError line naming `uri` and what to set."""
    fs, root = filesystem(uri, options)
    try:
        return list_store(fs, root, glob=glob, uri_of=lambda path: join_uri(uri, path))
    except OSError as e:
        raise InputError(storage_error(uri, e) if not isinstance(e, FileNotFoundError)
                         else f"input {uri} does not exist") from e


def check_store_input(uri: str, options: StorageOptions) -> None:
    """Before Spark starts: `uri` is there on its store (one or two metadata requests). A missing bucket, an
    endpoint that does not answer, refused credentials, or nothing at `uri`: one InputError line."""
    from pyarrow.fs import FileType

    fs, path = filesystem(uri, options)
    store = split_uri(uri)[0]
    try:
        if fs.get_file_info(path).type != FileType.NotFound:
            return
        bucket = path.partition("/")[0]
        if store != "hdfs" and bucket != path and fs.get_file_info(bucket).type == FileType.NotFound:
            raise InputError(storage_error(uri, OSError("NoSuchBucket: the bucket does not exist")))
    except OSError as e:
        raise InputError(storage_error(uri, e)) from e
    raise InputError(f"input {uri} does not exist")
