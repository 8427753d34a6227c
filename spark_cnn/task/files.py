"""Image files a task reads itself: Spark listed them (encoding LOCAL_FILES) but did not read their bytes."""

from __future__ import annotations

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
    return read_image_file(local, options)
