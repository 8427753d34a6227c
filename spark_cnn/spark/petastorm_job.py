"""`spark-cnn to-petastorm`: images in (any input format), a Petastorm dataset out, without petastorm.

Tasks decode each image to RGB (EXIF orientation applied) and store it with the chosen codec: PNG (lossless,
read back as exactly these pixels), JPEG, or a raw array (NdarrayCodec). A file that does not decode keeps
its row, with `image` null and `error` set. The driver then writes `_common_metadata` (the Unischema and the
row groups of every file, see `formats/petastorm.py`); the dataset is written to a hidden sibling and renamed
into place, so petastorm never sees a half-written one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_cnn.config import PetastormConfig
from spark_cnn.errors import ImageError, InputError
from spark_cnn.formats import petastorm
from spark_cnn.formats.encodings import FILE_ENCODINGS, LOCAL_FILES, decoded_rgb
from spark_cnn.spark.job_io import check_local_paths, check_paths, job_session, publish, staging_uri, task_error
from spark_cnn.spark.planning import ReadPlan, plan_reading
from spark_cnn.spark.sources import TRUE_LABEL, ImageSource, open_source
from spark_cnn.spark.storage import job_filesystem, to_uri
from spark_cnn.task.files import read_listed_file
from spark_cnn.task.object_store import StorageOptions

MIB = 1 << 20


class PetastormEncoder:
    """mapInArrow function: (path, content[, height, width, channels][, true_label]) -> Unischema columns."""

    def __init__(self, reading: ReadPlan, codec: str, *, jpeg_quality: int):
        self.encoding, self.codec, self.jpeg_quality = reading.encoding, codec, jpeg_quality
        self.with_label, self.on_error = TRUE_LABEL in reading.carry, reading.on_error
        self.decode_options, self.storage = reading.decode_options, reading.storage

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        schema = petastorm.arrow_schema(petastorm.image_unischema(self.codec, with_label=self.with_label))
        for batch in batches:
            paths = batch.column("path").to_pylist()
            contents = batch.column("content")
            sizes = batch.column("size").to_pylist() if "size" in batch.schema.names else None
            geometry = ([batch.column(n).to_pylist() for n in ("height", "width", "channels")]
                        if "height" in batch.schema.names else None)
            images, errors = [], []
            for i, path in enumerate(paths):
                try:
                    data = (read_listed_file(path, self.decode_options, storage=self.storage,
                                             size=sizes[i] if sizes is not None else None)
                            if self.encoding == LOCAL_FILES else contents[i].as_py())
                    rgb = self._rgb(data, [column[i] for column in geometry] if geometry else [])
                    images.append(petastorm.encode_image(rgb, self.codec, jpeg_quality=self.jpeg_quality))
                    errors.append(None)
                except ImageError as e:
                    if self.on_error == "fail":
                        raise ImageError(f"{path}: {e}") from e
                    images.append(None)
                    errors.append(str(e))
            columns = {petastorm.PATH_FIELD: pa.array(paths, pa.string()),
                       petastorm.IMAGE_FIELD: pa.array(images, pa.binary()),
                       petastorm.ERROR_FIELD: pa.array(errors, pa.string())}
            if self.with_label:
                columns[petastorm.LABEL_FIELD] = batch.column(TRUE_LABEL)
            out = pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)
            if out.num_rows != batch.num_rows:
                raise ImageError(f"encoded {out.num_rows} rows for {batch.num_rows} inputs")
            yield out

    def _rgb(self, data: bytes | None, geometry: list):
        if data is None:
            raise ImageError("the row has no image (null)")
        if self.encoding in FILE_ENCODINGS:
            import numpy as np

            from spark_cnn.imaging.preprocess import decode_rgb
            return np.asarray(decode_rgb(data, self.decode_options), dtype=np.uint8)
        return decoded_rgb(self.encoding, data, *geometry)


def petastorm_encoder(config: PetastormConfig, source: ImageSource | None) -> PetastormEncoder:
    """The tasks' encoder for `config`, reading `source` as inference would (planning.plan_reading)."""
    reading = plan_reading(source, decode_options=config.decode_options, on_error=config.on_error)
    return PetastormEncoder(reading, config.codec, jpeg_quality=config.jpeg_quality)


def to_petastorm(config: PetastormConfig, *, spark: SparkSession | None = None) -> dict:
    """Write the images of `config.input` as a Petastorm dataset at `config.output`; returns a summary."""
    input_uri, output_uri = to_uri(config.input), to_uri(config.output)
    check_local_paths(input_uri, output_uri, config.overwrite, storage_options=config.inputs.storage_options)
    with job_session(spark, master=config.master, remote=config.remote, quiet=config.quiet,
                     outputs=(output_uri,)) as spark:
        fs = job_filesystem(spark, StorageOptions.parse(config.inputs.storage_options))
        check_paths(fs, input_uri, output_uri, config.overwrite, input_name=config.input, output_name=config.output)
        source = open_source(spark, input_uri, config.inputs)
        schema = petastorm.image_unischema(config.codec, with_label=source.has_labels,
                                           jpeg_quality=config.jpeg_quality)
        encoder = petastorm_encoder(config, source)
        ddl = ", ".join(f"{f.name} {'string' if f.type == pa.string() else 'binary'}"
                        for f in petastorm.arrow_schema(schema))
        staging = staging_uri(output_uri, uuid.uuid4().hex[:12])
        started = time.perf_counter()
        try:
            (source.frame.mapInArrow(encoder, ddl).write
             .option("parquet.block.size", config.row_group_mb * MIB)
             .option("parquet.summary.metadata.level", "NONE")
             .parquet(staging))
            fs.write_bytes(staging + "/" + petastorm.COMMON_METADATA,
                           petastorm.common_metadata(schema, row_groups_per_file(fs, staging)))
        except InputError:
            fs.delete(staging)
            raise
        except Exception as e:
            fs.delete(staging)
            raise task_error(e) from e
        publish(fs, staging, output_uri, overwrite=config.overwrite)
        elapsed = time.perf_counter() - started
        totals = (spark.read.parquet(output_uri)
                  .agg(F.count(F.lit(1)).alias("images"), F.count_if(F.col("error").isNotNull()).alias("errors"))
                  .first())
        return {"images": totals["images"], "errors": totals["errors"], "elapsed_s": round(elapsed, 3),
                "codec": config.codec, "fields": list(schema.fields), "output": output_uri}


def row_groups_per_file(fs, dataset_uri: str) -> dict[str, int]:
    """{path relative to the dataset: row groups} for every visible Parquet file, read from the footers through
    the job's filesystem (storage.HadoopFS or ArrowFS)."""
    return {relative: fs.parquet_row_groups(dataset_uri, relative) for relative in sorted(fs.list_files(dataset_uri))
            if relative.endswith(".parquet") and not any(part.startswith(("_", ".")) for part in relative.split("/"))}
