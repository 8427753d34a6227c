"""Where a job may write: never onto, into or around its input, the filesystem root or the home directory.

`--overwrite` deletes the old output, so an output that is the input, contains it, or is the root or the home
directory would delete what the job reads (or much more); an output inside the input is read back as input by
the next run. Pure functions over URIs (the local filesystem's `stat` is injectable):

- other filesystems are compared by their normalised URIs: the scheme through `STORE_SCHEMES` (s3a:// and s3://
  name the same bucket), the host lower-cased, the store's default port dropped, `.`, `..` and `//` collapsed;
- local paths (file: URIs) after resolving symlinks, `..` and `~`, and then by identity: a path is the same as
  another when an existing ancestor is the same file (`st_dev`, `st_ino`), which a case-insensitive filesystem
  (`Photos` is `photos`) or a bind mount makes of two different strings.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable
from urllib.parse import urlparse

from spark_cnn.errors import InputError

# Each scheme -> (the store it names, that store's default port). Two URIs whose schemes name one store and
# whose hosts agree name the same objects: Hadoop's s3a:// and s3n:// and pyarrow's s3:// are one bucket;
# gcs:// is gs://; abfs[s]://, wasb[s]:// (Azure's older driver) and pyarrow's az:// reach the same containers.
# hdfs://nn is hdfs://nn:8020 (the namenode's default RPC port). viewfs:// is a client-side mount table whose
# targets are unknown here, so it stays a filesystem of its own.
STORE_SCHEMES: dict[str, tuple[str, int | None]] = {
    "s3": ("s3", None), "s3a": ("s3", None), "s3n": ("s3", None),
    "gs": ("gs", None), "gcs": ("gs", None),
    "abfs": ("abfs", None), "abfss": ("abfs", None), "az": ("abfs", None),
    "wasb": ("abfs", None), "wasbs": ("abfs", None),
    "hdfs": ("hdfs", 8020),
}
# Azure names one storage account by two endpoints (Blob for wasb://, Data Lake for abfs://).
_AZURE_HOSTS = (".blob.core.windows.net", ".dfs.core.windows.net")

Location = tuple[str, str]  # (filesystem, absolute path)
Stat = Callable[[str], os.stat_result]


def location(uri: str) -> Location:
    """(filesystem, absolute path) of `uri`: ("file", the real local path) or ("store://host", the path), the
    store and host normalised (`STORE_SCHEMES`), so every spelling of one place gives one location.

    >>> location("s3a://Photos/cats/../dogs/") == location("s3://photos/dogs")
    True
    >>> location("hdfs://nn:8020/data")
    ('hdfs://nn', '/data')
    """
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme else uri
        return "file", os.path.realpath(os.path.expanduser(path))
    path = "/" + posixpath.normpath("/" + parsed.path).lstrip("/")
    return _filesystem(parsed.scheme.lower(), parsed.netloc.lower()), path


def _filesystem(scheme: str, netloc: str) -> str:
    store, default_port = STORE_SCHEMES.get(scheme, (scheme, None))
    user, at, host = netloc.rpartition("@")
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and default_port is not None and int(port) == default_port:
        host = name
    if store == "abfs":
        host = host.replace(*_AZURE_HOSTS)
    return f"{store}://{user}{at}{host}"


def within(outer: str, inner: str) -> bool:
    """`inner` is `outer` or lies below it (absolute, normalised paths)."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def contains(outer: Location, inner: Location, *, stat: Stat = os.stat) -> bool:
    """`inner` is `outer` or lies below it. Local paths also when an existing ancestor of `inner` (itself
    included) is the same file as `outer`: two spellings on a case-insensitive filesystem, a bind mount."""
    if not _same_filesystem(outer[0], inner[0]):
        return False
    if within(outer[1], inner[1]):
        return True
    if outer[0] != "file":
        return False
    target = _identity(outer[1], stat)
    path = inner[1]
    while target is not None:
        if _identity(path, stat) == target:
            return True
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return False


def same(a: Location, b: Location, *, stat: Stat = os.stat) -> bool:
    """`a` and `b` are one place."""
    return contains(a, b, stat=stat) and contains(b, a, stat=stat)


def _same_filesystem(a: str, b: str) -> bool:
    # pyarrow's az://CONTAINER names no account: it matches that container in any account.
    if a == b:
        return True
    if not (a.startswith("abfs://") and b.startswith("abfs://")):
        return False
    (a_container, _, a_account), (b_container, _, b_account) = (fs[7:].partition("@") for fs in (a, b))
    return a_container == b_container and not (a_account and b_account)


def _identity(path: str, stat: Stat) -> tuple[int, int] | None:
    try:
        st = stat(path)
    except OSError:  # missing (or unreadable): nothing to compare
        return None
    return st.st_dev, st.st_ino


def check_output_location(input_uri: str, output_uri: str, *, home: str | None = None, stat: Stat = os.stat
                          ) -> None:
    """Refuse an output that is the input, contains it, lies inside it, is the filesystem root, or is (or
    contains) the home directory (`home`: default `~`). One line each, saying what to do instead."""
    inp, out = location(input_uri), location(output_uri)
    fix = "choose a new folder outside the input for the output"
    if out[1] == "/" or (out[0] == "file" and same(out, ("file", "/"), stat=stat)):
        raise InputError(f"output {output_uri} is the filesystem root: {fix}")
    if same(out, inp, stat=stat):
        raise InputError(f"output {output_uri} is the input (--overwrite would delete it): {fix}")
    if contains(out, inp, stat=stat):
        raise InputError(f"output {output_uri} contains the input {input_uri} (--overwrite would delete it): {fix}")
    if contains(inp, out, stat=stat):
        raise InputError(f"output {output_uri} lies inside the input {input_uri} (its files would be read as "
                         f"images by the next run): {fix}")
    if out[0] == "file":
        home = os.path.realpath(os.path.expanduser(home or "~"))
        if contains(out, ("file", home), stat=stat):
            what = "is" if same(out, ("file", home), stat=stat) else "contains"
            raise InputError(f"output {output_uri} {what} the home directory {home}: {fix}")


def check_checkpoint_location(input_uri: str, checkpoint_uri: str, output_uri: str | None = None, *,
                              stat: Stat = os.stat) -> None:
    """Refuse a streaming checkpoint that is the input, contains it or lies inside it (its files would be listed
    as new images), or that is the output itself."""
    inp, cp = location(input_uri), location(checkpoint_uri)
    fix = "keep the checkpoint in a folder of its own, outside the input (e.g. beside the output)"
    if contains(cp, inp, stat=stat) or contains(inp, cp, stat=stat):
        raise InputError(f"checkpoint {checkpoint_uri} overlaps the input {input_uri}: {fix}")
    if output_uri is not None and same(location(output_uri), cp, stat=stat):
        raise InputError(f"checkpoint {checkpoint_uri} is the output folder: {fix}")
