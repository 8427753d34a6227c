"""Paths as Spark sees them, and the few filesystem operations the jobs need (exists, delete, rename, small text
files, a folder's names, qualified paths), in two interchangeable classes:

- `HadoopFS`, through the JVM's Hadoop FileSystem: on a classic session the jobs use it for every path they write,
  so the checks and the publishing rename see exactly the filesystems Spark's writer sees (file:, hdfs:, s3a:
  with the hadoop-aws package, dbfs:, ...).
- `ArrowFS`, through `pyarrow.fs`: no JVM and no session, so it serves Spark Connect (where the client has no
  JVM to call) and any process; it knows local paths and what `task/object_store.py` serves (s3, s3a, gs, abfs,
  az, hdfs).

`job_filesystem(spark)` picks: HadoopFS on classic sessions, ArrowFS on Spark Connect.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from spark_cnn.errors import InputError
from spark_cnn.spark.listing import is_hidden, matches_glob
from spark_cnn.spark.session import is_connect
from spark_cnn.task.object_store import NO_STORAGE, StorageOptions, filesystem, is_store_uri, scheme_of, storage_error

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
        self._path_class = self._jvm.org.apache.hadoop.fs.Path  # looked up once: each name in it is a py4j call

    def _fs_path(self, uri: str):
        path = self._path_class(uri)
        try:
            return path.getFileSystem(self._conf), path
        except Exception as e:  # py4j's error: without a connector, one line instead of the JVM's trace
            if not _missing_filesystem(e):
                raise
            raise InputError(missing_filesystem_error(uri, self._hadoop_version())) from None

    def _hadoop_version(self) -> str | None:
        try:
            return str(self._jvm.org.apache.hadoop.util.VersionInfo.getVersion())
        except Exception:
            return None

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
        self.write_bytes(uri, text.encode("utf-8"))

    def write_bytes(self, uri: str, data: bytes) -> None:
        fs, path = self._fs_path(uri)
        stream = fs.create(path, True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()

    def read_text(self, uri: str) -> str:
        fs, path = self._fs_path(uri)
        stream = fs.open(path)
        try:  # one Py4J call for the whole file, not one per line (an ETL checkpoint has a line per file)
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)).decode("utf-8")
        finally:
            stream.close()

    def list_names(self, uri: str) -> list[str]:
        """Names of the entries directly inside a folder ([] when it does not exist)."""
        fs, path = self._fs_path(uri)
        if not fs.exists(path):
            return []
        return [status.getPath().getName() for status in fs.listStatus(path)]

    def list_files(self, uri: str) -> list[str]:
        """Paths, relative to a folder, of every file below it ([] when it does not exist)."""
        fs, path = self._fs_path(uri)
        if not fs.exists(path):
            return []
        root = fs.makeQualified(path).toString().rstrip("/") + "/"
        files, names = fs.listFiles(path, True), []
        while files.hasNext():
            names.append(str(files.next().getPath().toString()).removeprefix(root))
        return names

    def qualify(self, uri: str) -> str:
        """`uri` as its filesystem names it: the default scheme and authority filled in, `.` and `..` resolved."""
        fs, path = self._fs_path(uri)
        return str(fs.makeQualified(path).toString())

    def parquet_row_groups(self, uri: str, relative: str) -> int:
        """Row groups of the Parquet file `relative` below folder `uri`, from its footer."""
        fs, path = self._fs_path(uri.rstrip("/") + "/" + relative)
        hadoop = self._jvm.org.apache.parquet.hadoop
        reader = hadoop.ParquetFileReader.open(hadoop.util.HadoopInputFile.fromPath(path, self._conf))
        try:
            return int(reader.getRowGroups().size())
        finally:
            reader.close()


# What Hadoop says when no FileSystem class serves a scheme: none is configured (gs:, abfs: without their
# connector), or the configured one is not on the classpath (s3a: without hadoop-aws).
_MISSING_FS = ("UnsupportedFileSystemException", "No FileSystem for scheme", "ClassNotFoundException")


def hadoop_files(spark: SparkSession, input_uri: str, glob: str | None = None) -> Iterator[tuple[str, int, int]]:
    """(path, size, mtime_ms) of every visible file under `input_uri` through Hadoop's recursive listing
    (Spark's hidden-name rule; names matching `glob`), paths as Spark writes them. One JVM call per file: the
    slow path, for filesystems neither local nor read through pyarrow.fs."""
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(input_uri)
    files = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).listFiles(root, True)
    while files.hasNext():
        status = files.next()
        name = status.getPath().toString()
        relative = name[len(root.toString()):].strip("/").split("/")
        if not any(is_hidden(part) for part in relative) and matches_glob(relative[-1], glob):
            yield name, int(status.getLen()), int(status.getModificationTime())


def _missing_filesystem(error: Exception) -> bool:
    text = str(error)
    return any(marker in text for marker in _MISSING_FS)


# The Hadoop connector each scheme needs on the JVM's classpath (Maven coordinates; VERSION = Spark's Hadoop).
CONNECTORS = {"s3a": "org.apache.hadoop:hadoop-aws:VERSION", "s3n": "org.apache.hadoop:hadoop-aws:VERSION",
              "abfs": "org.apache.hadoop:hadoop-azure:VERSION", "abfss": "org.apache.hadoop:hadoop-azure:VERSION",
              "wasb": "org.apache.hadoop:hadoop-azure:VERSION", "wasbs": "org.apache.hadoop:hadoop-azure:VERSION",
              "gs": "com.google.cloud.bigdataoss:gcs-connector:hadoop3-2.2.x (shaded)"}


def missing_filesystem_error(uri: str, hadoop_version: str | None) -> str:
    """One line for a path Spark's JVM has no filesystem for: which package to add."""
    scheme = scheme_of(uri) or "file"
    package = CONNECTORS.get(scheme)
    if package is None:
        return f"{uri}: Spark has no Hadoop filesystem for {scheme}:// paths; add the connector that serves them"
    package = package.replace("VERSION", hadoop_version or "<Spark's Hadoop version>")
    return (f"{uri}: Spark has no Hadoop filesystem for {scheme}:// paths; add its connector to the cluster, e.g. "
            f"spark-submit --packages {package} (or spark.jars.packages)")


def job_filesystem(spark, storage: StorageOptions = NO_STORAGE):
    """The filesystem a job checks and publishes its output with: HadoopFS on a classic session (the writer's own
    filesystems and connectors, s3a:// included), ArrowFS on Spark Connect (`storage`: the object-store options)."""
    return ArrowFS(storage) if is_connect(spark) else HadoopFS(spark)


class ArrowFS:
    """HadoopFS's operations through `pyarrow.fs`, on local paths (file: URIs or plain paths) and on the stores
    `task/object_store.py` serves; usable without a SparkSession. A store's failure is one InputError line.

    Object stores have no rename: a folder is copied, then the source deleted (not atomic; Spark's own commit to
    S3 is not either)."""

    def __init__(self, storage: StorageOptions = NO_STORAGE):
        self.storage = storage

    def _fs_path(self, uri: str):
        local = local_path(uri) if scheme_of(uri) else os.path.abspath(os.path.expanduser(uri))
        if local is not None:
            from pyarrow.fs import LocalFileSystem
            return LocalFileSystem(), posixpath.normpath(local)
        if not is_store_uri(uri):
            raise InputError(f"{uri}: no filesystem here serves {scheme_of(uri)}:// paths (without a JVM: local "
                             "paths, s3, s3a, gs, abfs, az, hdfs)")
        return filesystem(uri, self.storage)

    def _info(self, uri: str):
        fs, path = self._fs_path(uri)
        try:
            return fs, path, fs.get_file_info(path)
        except OSError as e:
            raise InputError(storage_error(uri, e)) from e

    def exists(self, uri: str) -> bool:
        from pyarrow.fs import FileType
        return self._info(uri)[2].type != FileType.NotFound

    def delete(self, uri: str) -> None:
        from pyarrow.fs import FileType
        fs, path, info = self._info(uri)
        if info.type == FileType.Directory:
            fs.delete_dir(path)
        elif info.type != FileType.NotFound:
            fs.delete_file(path)

    def rename(self, source: str, target: str) -> None:
        from pyarrow.fs import FileType, copy_files
        fs, src, info = self._info(source)
        _, dst = self._fs_path(target)
        if info.type == FileType.NotFound:
            raise OSError(f"could not rename {source} to {target}: {source} does not exist")
        try:
            fs.move(src, dst)
            return
        except OSError:
            if info.type != FileType.Directory or not is_store_uri(source):
                raise OSError(f"could not rename {source} to {target}") from None
        copy_files(src, dst, source_filesystem=fs, destination_filesystem=fs)  # a store's "folder": copy, delete
        fs.delete_dir(src)

    def write_text(self, uri: str, text: str) -> None:
        self.write_bytes(uri, text.encode("utf-8"))

    def write_bytes(self, uri: str, data: bytes) -> None:
        fs, path = self._fs_path(uri)
        if not is_store_uri(uri):
            fs.create_dir(posixpath.dirname(path), recursive=True)  # as Hadoop's create makes missing parents
        with fs.open_output_stream(path) as stream:
            stream.write(data)

    def parquet_row_groups(self, uri: str, relative: str) -> int:
        """Row groups of the Parquet file `relative` below folder `uri`, from its footer."""
        import pyarrow.parquet as pq
        fs, path = self._fs_path(uri.rstrip("/") + "/" + relative)
        try:
            with fs.open_input_file(path) as f:
                return pq.ParquetFile(f).metadata.num_row_groups
        except OSError as e:
            raise InputError(storage_error(uri, e)) from e

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode("utf-8")

    def read_bytes(self, uri: str) -> bytes:
        fs, path = self._fs_path(uri)
        try:
            with fs.open_input_stream(path) as stream:
                return stream.read()
        except OSError as e:
            raise InputError(storage_error(uri, e)) from e

    def list_names(self, uri: str) -> list[str]:
        """Names of the entries directly inside a folder ([] when it does not exist)."""
        from pyarrow.fs import FileSelector
        fs, path = self._fs_path(uri)
        try:
            infos = fs.get_file_info(FileSelector(path, allow_not_found=True))
        except OSError as e:
            raise InputError(storage_error(uri, e)) from e
        return [info.base_name for info in infos]

    def list_files(self, uri: str) -> list[str]:
        """Paths, relative to a folder, of every file below it ([] when it does not exist)."""
        from pyarrow.fs import FileSelector, FileType
        fs, path = self._fs_path(uri)
        try:
            infos = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
        except OSError as e:
            raise InputError(storage_error(uri, e)) from e
        root = path.rstrip("/") + "/"
        return [info.path.removeprefix(root) for info in infos if info.type == FileType.File]

    def qualify(self, uri: str) -> str:
        """`uri` with `.` and `..` resolved, local paths as Hadoop spells them (`file:/a/b`)."""
        if scheme_of(uri) is None or local_path(uri) is not None:
            return "file:" + self._fs_path(uri)[1]
        scheme, rest = uri.split("://", 1)
        authority, _, key = rest.partition("/")
        key = posixpath.normpath("/" + key).lstrip("/")
        return f"{scheme}://{authority}/{key}" if key else f"{scheme}://{authority}"
