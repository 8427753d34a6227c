"""Paths as Spark sees them, and the few filesystem operations the jobs need, through Hadoop's FileSystem.

Going through Hadoop (not `os`) keeps the jobs correct for any URI Spark can read: file:, hdfs:, s3a:, ...
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlparse

from pyspark.sql import SparkSession

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def to_uri(path: str) -> str:
    """A local path becomes an absolute file: URI (driver and executors agree on it); URIs stay as given."""
    if _SCHEME.match(path):
        return path
    return "file://" + os.path.abspath(os.path.expanduser(path))


def local_path(uri: str) -> str | None:
    """The local filesystem path of a file: URI, else None."""
    parsed = urlparse(uri)
    return parsed.path if parsed.scheme == "file" else None


class HadoopFS:
    """exists / delete / rename / write_text on any URI, via the JVM's Hadoop FileSystem."""

    def __init__(self, spark: SparkSession):
        self._jvm = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _fs_path(self, uri: str):
        path = self._jvm.org.apache.hadoop.fs.Path(uri)
        return path.getFileSystem(self._conf), path

    def exists(self, uri: str) -> bool:
        fs, path = self._fs_path(uri)
        return bool(fs.exists(path))

    def delete(self, uri: str) -> None:
        fs, path = self._fs_path(uri)
        if fs.exists(path):
            fs.delete(path, True)

    def rename(self, source: str, target: str) -> None:
        fs, src = self._fs_path(source)
        _, dst = self._fs_path(target)
        if not fs.rename(src, dst):
            raise OSError(f"could not rename {source} to {target}")

    def write_text(self, uri: str, text: str) -> None:
        fs, path = self._fs_path(uri)
        stream = fs.create(path, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def read_text(self, uri: str) -> str:
        fs, path = self._fs_path(uri)
        stream = fs.open(path)
        try:
            reader = self._jvm.java.io.BufferedReader(self._jvm.java.io.InputStreamReader(stream, "UTF-8"))
            return "\n".join(iter(reader.readLine, None))
        finally:
            stream.close()

    def list_names(self, uri: str) -> list[str]:
        """Names of the entries directly inside a folder ([] when it does not exist)."""
        fs, path = self._fs_path(uri)
        if not fs.exists(path):
            return []
        return [status.getPath().getName() for status in fs.listStatus(path)]

    def qualify(self, uri: str) -> str:
        """`uri` as its filesystem names it: the default scheme and authority filled in, `.` and `..` resolved."""
        fs, path = self._fs_path(uri)
        return str(fs.makeQualified(path).toString())
