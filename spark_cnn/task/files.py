"""Image files a task reads itself: Spark listed them (encoding LOCAL_FILES) but did not read their bytes."""

from __future__ import annotations

import os

from spark_cnn.errors import ImageError
from spark_cnn.imaging.decode import read_image_file
from spark_cnn.imaging.limits import DEFAULT_DECODE, DecodeOptions


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


def read_listed_file(path: str, options: DecodeOptions = DEFAULT_DECODE) -> bytes:
    """In a task: the bytes of a file Spark listed (sources.LOCAL_FILES), under the guard rails of `options`;
    any failure is an ImageError, which costs the row only."""
    local = listed_local_path(path)
    if local is None:
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
