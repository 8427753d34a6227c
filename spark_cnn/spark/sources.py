"""Where images come from: image folders, Spark's image source, Parquet tables and Petastorm datasets.

Every reader returns an `ImageSource`: a DataFrame with one row per input image and the columns the task side
reads (`path` string, `content` binary; `height`, `width`, `channels` for Spark's image source; `true_label`
string when the input says what each image is), plus how `content` holds the image (`formats.pixels`).

Spark's file sources drop zero-byte files from every scan (SPARK-26161, SPARK-27291). A zero-byte image is
still an input that must come out as one row (with its error), so empty files are listed separately and
added back with empty content. Local image folders and object stores (s3://, gs://, abfs://, az://, hdfs://) are
not listed by Spark at all: `spark/listing.py` lists them on the driver (unreadable subfolders become error rows,
symlink loops are walked once; an object store is one paginated listing through pyarrow.fs) and the tasks read
the files (`task/files.py`), under --max-file-bytes checked against the listed size first. The listing becomes a
DataFrame without `sparkContext` (`listed_frame`), so the same code serves Spark Connect sessions.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow.parquet as pq
import pyspark
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_cnn.config import InputOptions, byte_size
from spark_cnn.errors import ConfigError, InputError
from spark_cnn.formats import petastorm
from spark_cnn.formats.encodings import ENCODED, LOCAL_FILES, SPARK_IMAGE
from spark_cnn.spark.listing import (
    MIN_FILES_PER_TASK,
    Entry,
    is_hidden,
    list_objects,
    matches_glob,
    pack_partitions,
    walk_files,
)
from spark_cnn.spark.session import is_connect
from spark_cnn.spark.storage import ArrowFS, hadoop_files, local_path
from spark_cnn.task.object_store import NO_STORAGE, StorageOptions, for_tasks, is_store_uri, serves

IMAGE_ROW_SCHEMA = "path string, content binary"
# Files the driver listed: no content (the tasks read `path`), and the listed size, checked before reading.
LISTED_ROW_SCHEMA = "path string, content binary, size bigint"
TRUE_LABEL = "true_label"
# Column names taken as a table's row id when --path-column is not given, in this order.
PATH_COLUMN_GUESSES = ("path", "id", "origin", "filename", "file", "name", "key", "uri", "url")
# Fields of a Spark image-source struct (ImageSchema), also accepted as a Parquet image column.
SPARK_IMAGE_FIELDS = {"origin", "height", "width", "nChannels", "mode", "data"}

__all__ = ["ImageSource", "detect_format", "open_source", "read_images", "IMAGE_ROW_SCHEMA", "TRUE_LABEL"]


@dataclass(frozen=True)
class ImageSource:
    """One row per input image: `frame` (path, content[, height, width, channels][, true_label])."""

    frame: DataFrame
    format: str           # images | image | parquet | petastorm
    encoding: str         # formats.pixels: ENCODED, LOCAL_FILES, SPARK_IMAGE or NPY
    has_labels: bool = False
    storage: StorageOptions = NO_STORAGE  # how the tasks open the object store of a listed input

    @property
    def columns(self) -> list[str]:
        return self.frame.columns


def open_source(spark: SparkSession, input_uri: str, options: InputOptions | None = None) -> ImageSource:
    """Read `input_uri` as `options.format` (auto: detected from what is there)."""
    options = options or InputOptions()
    storage = NO_STORAGE
    listed = None
    if is_store_uri(input_uri):  # listed once here (bad bucket, endpoint, credentials: one line, no Spark job)
        storage = for_tasks(input_uri, StorageOptions.parse(options.storage_options))
        if serves(input_uri, storage) or is_connect(spark):
            listed = list_objects(input_uri, storage, glob=None)
    fmt = options.format if options.format != "auto" else detect_format(spark, input_uri, storage=storage,
                                                                          listed=listed)
    if fmt in ("parquet", "petastorm") and options.glob is not None:
        raise ConfigError(f"--glob applies to image files, but {input_uri} holds a {fmt} dataset")
    if fmt in ("images", "image"):
        named = [f"--{n.replace('_', '-')}" for n in ("image_column", "path_column", "label_column")
                 if getattr(options, n) is not None]
        if named:
            verb = "applies" if len(named) == 1 else "apply"
            raise ConfigError(f"{', '.join(named)} {verb} to parquet and petastorm inputs, but {input_uri} holds "
                              "image files")
    if fmt == "images":
        # Local (or shared-mount) files and object stores are read by the tasks: the driver lists them. Reading
        # them in the JVM (binaryFile content) and handing the bytes to Python costs the JVM more CPU per image
        # than Spark's whole remaining work (docs/benchmarks.md); other filesystems are read by Spark.
        if listed is not None:
            files = listed_frame(spark, [e for e in listed if matches_glob(posixpath.basename(e.path), options.glob)])
        else:
            files = read_images(spark, input_uri, glob=options.glob, content=local_path(input_uri) is None)
        in_tasks = listed is not None or local_path(input_uri) is not None
        return ImageSource(with_folder_labels(spark, files, input_uri), "images",
                           LOCAL_FILES if in_tasks else ENCODED, has_labels=True, storage=storage)
    if fmt == "image":
        return ImageSource(with_folder_labels(spark, read_spark_images(spark, input_uri, glob=options.glob),
                                              input_uri), "image", SPARK_IMAGE, has_labels=True)
    if fmt == "parquet":
        return read_parquet_images(spark, input_uri, options)
    return read_petastorm(spark, input_uri, options)


# ---- format detection -------------------------------------------------------------------------------------


def detect_format(spark: SparkSession, input_uri: str, *, storage: StorageOptions = NO_STORAGE,
                  listed: list[Entry] | None = None) -> str:
    """petastorm (a Unischema in `_common_metadata`), parquet (only .parquet files), else images. `listed`: the
    input's listing, when the caller has it (object stores)."""
    metadata = _read_small_file(spark, input_uri.rstrip("/") + "/" + petastorm.COMMON_METADATA, storage)
    if metadata is not None:
        try:
            if petastorm.is_petastorm_metadata(pq.read_metadata(_buffer(metadata)).metadata):
                return "petastorm"
        except Exception:  # not Parquet metadata: not a petastorm dataset
            pass
    seen_parquet = False
    names = (e.path for e in listed if e.error is None) if listed is not None else _visible_files(spark, input_uri)
    for name in names:
        if not name.endswith(".parquet"):
            return "images"
        seen_parquet = True
    return "parquet" if seen_parquet else "images"


def _buffer(data: bytes):
    import pyarrow as pa
    return pa.BufferReader(data)


def _read_small_file(spark: SparkSession, uri: str, storage: StorageOptions = NO_STORAGE) -> bytes | None:
    local = local_path(uri)
    if local is not None:
        if not os.path.isfile(local):
            return None
        with open(local, "rb") as f:
            return f.read()
    if serves(uri, storage) or is_connect(spark):
        fs = ArrowFS(storage)
        if not fs.exists(uri):
            return None
        return fs.read_bytes(uri)
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.isFile(path):
        return None
    stream = fs.open(path)
    try:
        return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def _visible_files(spark: SparkSession, input_uri: str) -> Iterator[str]:
    """Names of the files Spark would read under `input_uri`, lazily (detection stops at the first image)."""
    local = local_path(input_uri)
    if local is not None:
        for entry in walk_files(local):
            if entry.error is None:
                yield entry.path
        return
    path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(input_uri)
    files = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).listFiles(path, True)
    while files.hasNext():
        name = files.next().getPath().toString()
        relative = name[len(path.toString()):].strip("/").split("/")
        if not any(is_hidden(part) for part in relative):
            yield name


# ---- image files ------------------------------------------------------------------------------------------


def read_images(spark: SparkSession, input_uri: str, *, glob: str | None = None, content: bool = True) -> DataFrame:
    """Every visible file under `input_uri` (recursively; names matching `glob`), as (path, content),
    including zero-byte files. `content=False`: a null `content`, so Spark lists the files without reading
    them (binaryFile reads a file only when its content column is used) and the task reads `path` itself; a
    local folder is then listed by `local_files` instead of Spark."""
    local = local_path(input_uri)
    if local is not None and not content:
        return local_files(spark, local, glob=glob)
    files = _file_reader(spark, "binaryFile", glob).load(input_uri)
    files = files.select("path", "content" if content else F.lit(None).cast("binary").alias("content"))
    empty = empty_files(spark, input_uri, glob=glob)
    if not empty:
        return files
    return files.unionByName(spark.createDataFrame([(path, b"" if content else None) for path in empty],
                                                   IMAGE_ROW_SCHEMA))


def read_spark_images(spark: SparkSession, input_uri: str, *, glob: str | None = None) -> DataFrame:
    """Spark's `image` data source: one row per file, undecodable ones kept (height -1) so they become errors."""
    images = (_file_reader(spark, "image", glob).option("dropInvalid", False).load(input_uri)
              .select(F.col("image.origin").alias("path"), F.col("image.data").alias("content"),
                      F.col("image.height").alias("height"), F.col("image.width").alias("width"),
                      F.col("image.nChannels").alias("channels")))
    empty = empty_files(spark, input_uri, glob=glob)
    if not empty:
        return images
    rows = [(path, b"", -1, -1, -1) for path in empty]
    return images.unionByName(spark.createDataFrame(rows, IMAGE_ROW_SCHEMA + ", height int, width int, channels int"))


def _file_reader(spark: SparkSession, fmt: str, glob: str | None):
    reader = spark.read.format(fmt).option("recursiveFileLookup", "true")
    return reader.option("pathGlobFilter", glob) if glob else reader


def with_folder_labels(spark: SparkSession, frame: DataFrame, input_uri: str) -> DataFrame:
    """Add `true_label`: the class folder of each file (ImageFolder layout: INPUT/<class>/.../file), null for
    files directly in INPUT."""
    root = listing_root(spark, input_uri) + "/"
    relative = f"split(substring(`path`, {len(root) + 1}, {1 << 30}), '/')"
    in_folder = f"startswith(`path`, {sql_string(root)}) AND size({relative}) > 1"
    # SQL, one py4j call: built from `functions` the column took ~100, each costing the JVM CPU on every job
    return frame.withColumn(TRUE_LABEL, F.expr(f"CAST(CASE WHEN {in_folder} THEN element_at({relative}, 1) END "
                                               "AS STRING)"))


def sql_string(text: str) -> str:
    """`text` as a SQL string literal that needs no escaping whatever its characters (hex of its UTF-8)."""
    return f"CAST(X'{text.encode('utf-8').hex()}' AS STRING)"


def listing_root(spark: SparkSession, input_uri: str) -> str:
    """`input_uri` spelled as the listed paths under it begin: `file:/a/b` for a local folder, the URI itself for
    an object store (the driver lists both), else as Hadoop's Path writes it (Spark lists those)."""
    local = local_path(input_uri)
    if local is not None:
        return spark_path(posixpath.normpath(local))
    if is_store_uri(input_uri) or is_connect(spark):
        return input_uri.rstrip("/")
    return spark.sparkContext._jvm.org.apache.hadoop.fs.Path(input_uri).toString().rstrip("/")


def empty_files(spark: SparkSession, input_uri: str, *, glob: str | None = None) -> list[str]:
    """Zero-byte visible files under `input_uri` (names matching `glob`), as Spark writes their paths."""
    local = local_path(input_uri)
    if local is not None:  # fast path: one stat per file, no JVM round trips
        return [spark_path(e.path) for e in walk_files(local, glob=glob) if e.error is None and e.size == 0]
    # Other filesystems: Hadoop's recursive listing, one JVM call per file (slow for millions of files).
    return [path for path, size, _ in hadoop_files(spark, input_uri, glob) if size == 0]


def spark_path(local: str) -> str:
    """A local path as Spark's file listing writes it: `file:/a/b c#1.jpg` (not percent-encoded)."""
    return "file:" + local


def local_files(spark: SparkSession, folder: str, *, glob: str | None = None) -> DataFrame:
    """(path, null content, size) for every entry `listing.walk_files` finds under the local `folder` (a folder it
    could not list is one row, whose read fails in the task with the reason); see `listed_frame`."""
    return listed_frame(spark, list(walk_files(folder, glob=glob, prefix=spark_path(""))))


def listed_frame(spark: SparkSession, entries: list[Entry]) -> DataFrame:
    """(path, null content, size) for listed `entries` (paths as the rows should spell them), one Spark partition
    per group `listing.pack_partitions` makes, as Spark's file scan packs files, but at least MIN_FILES_PER_TASK
    files per partition where there are enough cores' worth (the tasks read the files, and each task writes one
    output file); rows in packed order.

    No `sparkContext` (Spark Connect has none) and no Python worker: a small table of the groups (one row each,
    their paths and sizes as arrays), exploded where it lands. Where there are no more groups than a leaf scan's
    partitions (`_scanned_alone`: a small job's one task per core), that table's own scan puts group i alone in
    partition i. Else it is broadcast onto `range(n)` in n partitions, which costs a Spark job and its planning
    before the first task (without them, 4,096-image jobs on the 2-core guest kept their cores usefully busy
    1.6 points more of the time, docs/benchmarks.md)."""
    parallelism = default_parallelism(spark)  # once: on Spark Connect it is a small job
    partitions = pack_partitions(entries, **file_packing(spark, parallelism), min_files=MIN_FILES_PER_TASK)
    if not partitions:
        return spark.createDataFrame([], LISTED_ROW_SCHEMA)
    groups = _groups_frame(spark, partitions)
    if not _scanned_alone(spark, partitions, parallelism):
        slots = spark.range(0, len(partitions), 1, numPartitions=len(partitions))
        groups = slots.join(groups.hint("broadcast"), F.expr("id = part"))
    # SQL strings: a py4j call each, where `functions` took several (the JVM's CPU on every job)
    files = groups.selectExpr("explode(arrays_zip(paths, sizes)) AS file")
    return files.selectExpr("file.paths AS path", "CAST(NULL AS BINARY) AS content", "file.sizes AS size")


def _groups_frame(spark: SparkSession, partitions: list[list[Entry]]) -> DataFrame:
    """(part, paths, sizes), one row per group. From an Arrow table where pyspark takes one (4.0 and later): a
    million paths as Python rows cost ~20 s of type checks and pickling on the driver (bench-scale --plan-only).
    The table holds one record batch per group, so that a table too large for a local relation
    (`spark.sql.execution.arrow.localRelationThreshold`), which Spark parallelises one batch per partition, still
    keeps one group per partition."""
    if _takes_arrow():
        import pyarrow as pa

        schema = pa.schema([("part", pa.int64()), ("paths", pa.list_(pa.string())), ("sizes", pa.list_(pa.int64()))])
        return spark.createDataFrame(pa.Table.from_batches([
            pa.record_batch([pa.array([i], pa.int64()), pa.array([[e.path for e in group]], pa.list_(pa.string())),
                             pa.array([[e.size for e in group]], pa.list_(pa.int64()))], schema=schema)
            for i, group in enumerate(partitions)], schema))
    return spark.createDataFrame([(i, [e.path for e in group], [e.size for e in group])
                                  for i, group in enumerate(partitions)],
                                 "part bigint, paths array<string>, sizes array<bigint>")


def _takes_arrow() -> bool:
    return int(pyspark.__version__.split(".")[0]) >= 4


def _scanned_alone(spark: SparkSession, partitions: list[list[Entry]], parallelism: int) -> bool:
    """Whether the groups' own table, scanned, puts each group alone in its partition, in order: Spark slices a
    local relation's rows evenly into min(rows, spark.sql.leafNodeDefaultParallelism) partitions, and an Arrow
    table above the local-relation threshold one batch per partition. Python rows (pyspark 3.5) are parallelised
    by the context's own rule, so they keep the broadcast."""
    if not _takes_arrow():
        return False
    leaf = spark.conf.get("spark.sql.leafNodeDefaultParallelism", None)
    return len(partitions) <= (int(leaf) if leaf else parallelism)


def file_packing(spark: SparkSession, parallelism: int | None = None) -> dict:
    """pack_partitions' settings from the session's conf, as Spark's file scan reads them (Connect-safe);
    `parallelism`: the session's default parallelism where the caller has it already."""
    minimum = spark.conf.get("spark.sql.files.minPartitionNum", None)
    return {"max_partition_bytes": byte_size(spark.conf.get("spark.sql.files.maxPartitionBytes")),
            "open_cost_bytes": byte_size(spark.conf.get("spark.sql.files.openCostInBytes")),
            "min_partitions": int(minimum) if minimum else parallelism or default_parallelism(spark)}


def default_parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism: the context's on a classic session; on Spark Connect `spark.default.parallelism`
    when set, else the partitions of a range Spark splits by its default (one tiny job, no Python)."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return int(configured)
    # spark_partition_id is nondeterministic: Spark refuses it inside an aggregate, so it is projected first
    parts = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
    return parts.agg(F.max("p").alias("p")).first()["p"] + 1


# ---- tables -----------------------------------------------------------------------------------------------


def read_parquet_images(spark: SparkSession, input_uri: str, options: InputOptions) -> ImageSource:
    """A Parquet table with a binary image column (image files), or a Spark image-source struct column."""
    table = spark.read.parquet(input_uri)
    types = {f.name: f.dataType for f in table.schema.fields}
    image = options.image_column
    if image is None:
        candidates = [n for n, t in types.items() if isinstance(t, T.BinaryType) or _is_spark_image(t)]
        if len(candidates) != 1:
            raise ConfigError(f"{input_uri} has {len(candidates)} binary columns ({', '.join(candidates) or 'none'}); "
                              "name the image column with --image-column")
        image = candidates[0]
    elif image not in types:
        raise ConfigError(f"--image-column {image}: {input_uri} has no such column (columns: {', '.join(types)})")
    if _is_spark_image(types[image]):
        frame = table.select(_path_column(table, options, default=F.col(f"{image}.origin")),
                             F.col(f"{image}.data").alias("content"), F.col(f"{image}.height").alias("height"),
                             F.col(f"{image}.width").alias("width"), F.col(f"{image}.nChannels").alias("channels"),
                             *_label_column(table, options))
        return ImageSource(frame, "parquet", SPARK_IMAGE, has_labels=options.label_column is not None)
    if not isinstance(types[image], T.BinaryType):
        raise ConfigError(f"--image-column {image}: column has type {types[image].simpleString()}; expected binary "
                          "image files (or a Spark image struct)")
    frame = table.select(_path_column(table, options), F.col(image).alias("content"), *_label_column(table, options))
    return ImageSource(frame, "parquet", ENCODED, has_labels=options.label_column is not None)


def read_petastorm(spark: SparkSession, input_uri: str, options: InputOptions) -> ImageSource:
    """A Petastorm dataset: its Unischema (read safely) names the image field and how it is encoded."""
    metadata = _read_small_file(spark, input_uri.rstrip("/") + "/" + petastorm.COMMON_METADATA,
                                StorageOptions.parse(options.storage_options))
    if metadata is None:
        raise InputError(f"{input_uri} is not a petastorm dataset: it has no {petastorm.COMMON_METADATA} file")
    schema = petastorm.read_unischema(metadata, source=input_uri)
    image, encoding = petastorm.image_field(schema, options.image_column)
    table = spark.read.parquet(input_uri)
    frame = table.select(_path_column(table, options), F.col(image).cast("binary").alias("content"),
                         *_label_column(table, options))
    return ImageSource(frame, "petastorm", encoding, has_labels=options.label_column is not None)


def _is_spark_image(data_type: T.DataType) -> bool:
    return isinstance(data_type, T.StructType) and SPARK_IMAGE_FIELDS <= set(data_type.fieldNames())


def _path_column(table: DataFrame, options: InputOptions, default: Column | None = None) -> Column:
    """The row id as `path`: --path-column, else a column named like an id, else file and row position."""
    name = options.path_column
    if name is not None:
        if name not in table.columns:
            raise ConfigError(f"--path-column {name}: no such column (columns: {', '.join(table.columns)})")
        return F.col(name).cast("string").alias("path")
    if default is not None:
        return default.alias("path")
    for guess in PATH_COLUMN_GUESSES:
        if guess in table.columns:
            return F.col(guess).cast("string").alias("path")
    # No id column: the Parquet file and the row's position in the scan identify the row.
    return F.concat(F.input_file_name(), F.lit("#"), F.monotonically_increasing_id().cast("string")).alias("path")


def _label_column(table: DataFrame, options: InputOptions) -> list[Column]:
    name = options.label_column
    if name is None:
        return []
    if name not in table.columns:
        raise ConfigError(f"--label-column {name}: no such column (columns: {', '.join(table.columns)})")
    return [F.col(name).cast("string").alias(TRUE_LABEL)]

