"""Image files a task reads itself: the driver listed them (encoding LOCAL_FILES) but did not read their bytes.

Local (or shared-mount) files are read by `imaging.decode.read_image_file` (regular files only: a FIFO or a
link to a device is an error row, not a hang); objects in S3, GCS, Azure or HDFS through `pyarrow.fs`
(`object_store.py`), with the options the driver shipped in the plan. A size from the listing refuses an
object over --max-file-bytes without a request; `prefetched` keeps several reads in flight, since an object
store's latency per request, not its bandwidth, bounds one reader of small images.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from spark_cnn.errors import ImageError, InputError
from spark_cnn.imaging.decode import check_file_size, check_size, read_image_file
from spark_cnn.imaging.limits import DEFAULT_DECODE, DecodeOptions
from spark_cnn.task.object_store import (
    NO_STORAGE,
    StorageOptions,
    filesystem,
    is_store_fault,
    is_store_uri,
    storage_error,
)

# Object reads in flight per task: a GET of a small image takes ~20-50 ms, mostly waiting; 16 keep a task's
# decoding (~5-10 ms an image on one core) fed without holding more than 16 images' bytes.
STORE_READS_IN_FLIGHT = 16


def listed_local_path(path: str) -> str | None:
    """The local file of a path as Spark's file listing writes it (`file:/a/b c#1.jpg`, not percent-encoded,
    so not parsed as a URL: `#` and `?` are part of the name), else None."""
    if not path.startswith("file:"):
        return None
    rest = path[len("file:"):]
    if rest.startswith("//"):  # file:///a (empty authority) or file://localhost/a
        authority, slash, tail = rest[2:].partition("/")
        if authority not in ("", "localhost"):
            return None
        rest = slash + tail
    return rest or None


def read_listed_file(path: str, options: DecodeOptions = DEFAULT_DECODE, *, storage: StorageOptions = NO_STORAGE,
                     size: int | None = None) -> bytes:
    """In a task: the bytes of a file the driver listed (sources.LOCAL_FILES), under the guard rails of `options`;
    any failure is an ImageError, which costs the row only. `size`: the listing's, checked before any read."""
    if size is not None and size > 0:
        check_size(size, options)
    local = listed_local_path(path)
    if local is None:
        if is_store_uri(path):
            return read_store_object(path, options, storage)
        raise ImageError(f"not a local file: {path} (files on other filesystems are read by Spark)")
    try:
        return read_image_file(local, options)
    except ImageError:
        if os.path.isdir(local):  # listed as a folder: the driver's listing could not read it
            raise ImageError(unlisted_folder_error(local)) from None
        raise


def unlisted_folder_error(folder: str) -> str:
    """The error row of a folder the job's listing could not read (spark/listing.py), with today's reason."""
    try:
        os.listdir(folder)
    except OSError as e:
        return (f"cannot list folder ({type(e).__name__}: {e.strerror or e}): its images were not read; make it "
                "readable and run the job again")
    return "could not list this folder when the job started (it lists now): run the job again to read its images"


def read_store_object(uri: str, options: DecodeOptions = DEFAULT_DECODE,
                      storage: StorageOptions = NO_STORAGE) -> bytes:
    """The bytes of one object (s3://, gs://, abfs://, hdfs://...), its size checked before its body is read.
    The object's own failure (gone since the listing, access refused) is an ImageError, its row's; the store's
    (no client here, no bucket, no endpoint) an InputError, which fails the task as a sidecar fault does."""
    fs, path = filesystem(uri, storage)  # an InputError: this process cannot open the store at all
    try:
        with fs.open_input_file(path) as f:
            check_size(f.size(), options)
            data = f.read()
    except OSError as e:
        if is_store_fault(e):
            raise InputError(storage_error(uri, e)) from None
        raise ImageError(f"cannot read object: {storage_error(uri, e)}") from None
    check_file_size(data, options)
    return data


def prefetched(read: Callable[[int], bytes], rows: Iterable[int], *, in_flight: int = STORE_READS_IN_FLIGHT
               ) -> Iterator[tuple[int, Callable[[], bytes]]]:
    """(row, result) for each row in order, `read(row)` running up to `in_flight` rows ahead on threads;
    `result()` returns the bytes or raises what `read` raised (an ImageError stays that row's)."""
    rows = iter(rows)
    with ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="spark_cnn-read") as pool:
        pending: deque[tuple[int, Future]] = deque()
        for row in rows:
            pending.append((row, pool.submit(read, row)))
            if len(pending) >= in_flight:
                done_row, future = pending.popleft()
                yield done_row, future.result
        while pending:
            done_row, future = pending.popleft()
            yield done_row, future.result
