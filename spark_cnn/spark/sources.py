"""Where images come from: a folder of files, read with Spark's binaryFile source, one row per file.

Spark's file sources drop zero-byte files from every scan (SPARK-26161, SPARK-27291). A zero-byte image is
still an input that must come out as one row (with its error), so empty files are listed separately and
added back with empty content.
"""

from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession

from spark_cnn.spark.storage import local_path

IMAGE_ROW_SCHEMA = "path string, content binary"


def is_hidden(name: str) -> bool:
    """Spark's rule for names its file listing skips: `_x` (but not `k=v` partitions), `.x`, `x._COPYING_`."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")


def read_images(spark: SparkSession, input_uri: str) -> DataFrame:
    """Every visible file under `input_uri`, recursively, as (path, content), including zero-byte files."""
    files = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(input_uri)
             .select("path", "content"))
    empty = empty_files(spark, input_uri)
    if not empty:
        return files
    return files.unionByName(spark.createDataFrame([(path, b"") for path in empty], IMAGE_ROW_SCHEMA))


def empty_files(spark: SparkSession, input_uri: str) -> list[str]:
    """Zero-byte visible files under `input_uri`, as Spark writes their paths."""
    jvm = spark.sparkContext._jvm
    local = local_path(input_uri)
    if local is not None:  # fast path: one stat per file, no JVM round trips
        found = []
        if os.path.isfile(local):
            return [jvm.org.apache.hadoop.fs.Path("file://" + local).toString()] if not os.path.getsize(local) else []
        for root, dirs, names in os.walk(local):
            dirs[:] = [d for d in dirs if not is_hidden(d)]
            found += [os.path.join(root, n) for n in names
                      if not is_hidden(n) and os.path.isfile(os.path.join(root, n))
                      and os.path.getsize(os.path.join(root, n)) == 0]
        return [jvm.org.apache.hadoop.fs.Path("file://" + p).toString() for p in sorted(found)]
    # Other filesystems: Hadoop's recursive listing, one JVM call per file (slow for millions of files).
    path = jvm.org.apache.hadoop.fs.Path(input_uri)
    files = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).listFiles(path, True)
    found = []
    while files.hasNext():
        status = files.next()
        if status.getLen() == 0:
            name = status.getPath().toString()
            relative = name[len(path.toString()):].strip("/").split("/")
            if not any(is_hidden(part) for part in relative):
                found.append(name)
    return found
