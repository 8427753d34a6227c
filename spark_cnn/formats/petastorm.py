"""The Petastorm dataset layout, read and written without the petastorm library.

A Petastorm dataset is a Parquet directory plus a `_common_metadata` file whose key-value metadata holds
- `dataset-toolkit.unischema.v1`: the pickled Unischema (fields, NumPy types, shapes, codecs), and
- `dataset-toolkit.num_row_groups_per_file.v1`: JSON {file path relative to the dataset: row groups}, which
  petastorm's `make_reader` needs to split the dataset into row groups without opening every footer.

This module is the pure core: metadata in and out, the image field of a schema, image encoding. Spark jobs
(`spark/sources.py` to read, `spark/petastorm_job.py` to write) wrap it.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from spark_cnn.errors import ConfigError, InputError
from spark_cnn.formats.encodings import ENCODED, NPY
from spark_cnn.formats.unischema import (
    CompressedImageCodec,
    NdarrayCodec,
    ScalarCodec,
    Unischema,
    UnischemaField,
    dumps_unischema,
    loads_unischema,
    spark_type,
)

UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"
ROW_GROUPS_PER_FILE_KEY = b"dataset-toolkit.num_row_groups_per_file.v1"
COMMON_METADATA = "_common_metadata"
# Codecs `spark-cnn to-petastorm` writes: png (lossless, default), jpeg, or raw arrays (NdarrayCodec).
WRITE_CODECS = ("png", "jpeg", "ndarray")
# petastorm's CompressedImageCodec default; 95 keeps JPEG re-encoding close to the source pixels.
DEFAULT_JPEG_QUALITY = 95
# Columns of a dataset `to-petastorm` writes (all but `path` nullable: a file that does not decode keeps its row).
PATH_FIELD, IMAGE_FIELD, LABEL_FIELD, ERROR_FIELD = "path", "image", "label", "error"


def is_petastorm_metadata(metadata: dict | None) -> bool:
    """Whether Parquet key-value metadata (of `_common_metadata`) carries a petastorm Unischema."""
    return bool(metadata) and UNISCHEMA_KEY in metadata


def read_unischema(metadata_file: bytes, *, source: str) -> Unischema:
    """The Unischema stored in the bytes of a dataset's `_common_metadata` file."""
    try:
        metadata = pq.read_metadata(pa.BufferReader(metadata_file)).metadata
    except Exception as e:
        raise InputError(f"{source}: cannot read {COMMON_METADATA} as Parquet metadata: {e}") from e
    if not is_petastorm_metadata(metadata):
        raise InputError(f"{source}: {COMMON_METADATA} holds no petastorm Unischema "
                         f"({UNISCHEMA_KEY.decode()}); write the dataset with petastorm's materialize_dataset "
                         "or `spark-cnn to-petastorm`")
    return loads_unischema(metadata[UNISCHEMA_KEY], source=source)


def image_field(schema: Unischema, requested: str | None = None) -> tuple[str, str]:
    """(field name, pixel encoding) of the image field: `requested`, else the only image-like field.

    CompressedImageCodec fields hold image files (decoded like any file); NdarrayCodec fields hold uint8 arrays.
    """
    candidates = {name: _encoding_of(field) for name, field in schema.fields.items()}
    candidates = {name: enc for name, enc in candidates.items() if enc is not None}
    if requested is not None:
        if requested not in schema.fields:
            raise ConfigError(f"--image-column {requested}: the petastorm dataset has no such field "
                              f"(fields: {', '.join(schema.fields)})")
        if requested not in candidates:
            raise ConfigError(f"--image-column {requested}: field {schema.fields[requested]!r} is not an image "
                              "(expected CompressedImageCodec, or NdarrayCodec of uint8 (H, W[, C]))")
        return requested, candidates[requested]
    if len(candidates) != 1:
        found = ", ".join(candidates) or "none"
        raise ConfigError(f"the petastorm dataset has {len(candidates)} image fields ({found}); "
                          "choose one with --image-column")
    return next(iter(candidates.items()))


def _encoding_of(field: UnischemaField) -> str | None:
    if isinstance(field.codec, CompressedImageCodec):
        return ENCODED
    if type(field.codec) is NdarrayCodec and np.dtype(field.numpy_dtype) == np.uint8 and len(field.shape) in (2, 3):
        return NPY
    return None


def image_unischema(codec: str, *, with_label: bool, jpeg_quality: int = DEFAULT_JPEG_QUALITY) -> Unischema:
    """The Unischema `to-petastorm` writes: path, image (RGB, any size), [label: class folder], error."""
    if codec not in WRITE_CODECS:
        raise ConfigError(f"--codec {codec}: expected one of {', '.join(WRITE_CODECS)}")
    image_codec = NdarrayCodec() if codec == "ndarray" else CompressedImageCodec(codec, jpeg_quality)
    string = ScalarCodec(spark_type("StringType"))
    fields = [UnischemaField(PATH_FIELD, np.str_, (), string, False),
              UnischemaField(IMAGE_FIELD, np.uint8, (None, None, 3), image_codec, True)]
    if with_label:
        fields.append(UnischemaField(LABEL_FIELD, np.str_, (), string, True))
    fields.append(UnischemaField(ERROR_FIELD, np.str_, (), string, True))
    return Unischema("SparkCnnImages", fields)


def arrow_schema(schema: Unischema) -> pa.Schema:
    """The Parquet columns of a Unischema that holds only strings and encoded/array images."""
    types = {"StringType": pa.string()}
    columns = []
    for field in schema.fields.values():
        codec = field.codec
        arrow_type = types[codec.spark_type.name] if isinstance(codec, ScalarCodec) else pa.binary()
        columns.append(pa.field(field.name, arrow_type, nullable=True))  # Spark writes every column nullable
    return pa.schema(columns)


def common_metadata(schema: Unischema, row_groups_per_file: dict[str, int]) -> bytes:
    """The bytes of a `_common_metadata` file for `schema` and the dataset's Parquet files (relative paths)."""
    if not row_groups_per_file:
        raise InputError("the dataset has no Parquet files to describe")
    arrow = arrow_schema(schema).with_metadata({
        UNISCHEMA_KEY: dumps_unischema(schema),
        ROW_GROUPS_PER_FILE_KEY: json.dumps(dict(sorted(row_groups_per_file.items()))).encode(),
    })
    sink = pa.BufferOutputStream()
    pq.write_metadata(arrow, sink)
    return sink.getvalue().to_pybytes()


def encode_image(rgb: np.ndarray, codec: str, *, jpeg_quality: int = DEFAULT_JPEG_QUALITY) -> bytes:
    """RGB uint8 pixels -> the bytes `codec` stores (PNG/JPEG file, or numpy.save of the array)."""
    if codec == "ndarray":
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(rgb, dtype=np.uint8), allow_pickle=False)
        return buffer.getvalue()
    buffer = io.BytesIO()
    if codec == "png":
        Image.fromarray(rgb, mode="RGB").save(buffer, format="PNG")
    else:
        Image.fromarray(rgb, mode="RGB").save(buffer, format="JPEG", quality=jpeg_quality)
    return buffer.getvalue()
