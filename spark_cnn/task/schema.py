"""The result layouts, declared once: the classify output schema, the sidecar's reply, the UDF's structs.

The sidecar replies to each INFER with `reply_schema` rows, exactly the request's rows in order, with the
model's columns null and `error` set where a row failed. The task adds `path` and `label_name` to make the
`output_schema` rows; the Spark DDL for mapInArrow and the UDF's return types are derived from the same
fields by `spark_ddl` and `spark_type`. Torch- and pyspark-free: both sides of the socket import it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from spark_cnn.errors import SidecarError

ERROR = "error"  # why a row has no model outputs; null when it has them
TOPK_ITEM = pa.struct([("label", pa.int32()), ("score", pa.float32())])
TOPK_TYPE = pa.list_(TOPK_ITEM)  # best first
VECTOR_TYPE = pa.list_(pa.float32())
# The classify output: one row per input image (README, "classify output").
_FIELDS = (pa.field("path", pa.string()), pa.field("label", pa.int32()), pa.field("label_name", pa.string()),
           pa.field("score", pa.float32()), pa.field("topk", TOPK_TYPE), pa.field(ERROR, pa.string()))
_OPTIONAL = {"logits": pa.field("logits", VECTOR_TYPE), "embeddings": pa.field("embedding", VECTOR_TYPE)}
# Output columns the task adds to the sidecar's reply: the row's name, and the label's class name.
TASK_COLUMNS = ("path", "label_name")
# What the model's output becomes: classes (label, score, top-k [, logits, embedding]) or `raw`, any one
# tensor per batch written as it is, one row per image: its values flattened in row-major (C) order as `raw`,
# and the per-image shape (the tensor's shape without the batch dimension) as `shape`.
CLASSES, RAW = "classes", "raw"
OUTPUT_KINDS = (CLASSES, RAW)
SHAPE_TYPE = pa.list_(pa.int32())
_RAW_FIELDS = (pa.field("path", pa.string()), pa.field("raw", VECTOR_TYPE), pa.field("shape", SHAPE_TYPE),
               pa.field(ERROR, pa.string()))
# The embed output: one embedding per image.
EMBED_COLUMNS = ("path", "embedding", ERROR)
# What a model computes per image: which output layout (below) and which command serves it.
TASKS = ("classify", "detect", "segment")
# detect: the boxes of one image, best first, in the input image's pixels (x1, y1, x2, y2).
BOX_TYPE = pa.list_(pa.float32())
DETECTION_ITEM = pa.struct([("label", pa.int32()), ("score", pa.float32()), ("box", BOX_TYPE)])
NAMED_DETECTION_ITEM = pa.struct([("label", pa.int32()), ("label_name", pa.string()), ("score", pa.float32()),
                                  ("box", BOX_TYPE)])
DETECT_FIELDS = (pa.field("path", pa.string()), pa.field("detections", pa.list_(NAMED_DETECTION_ITEM)),
                 pa.field(ERROR, pa.string()))
DETECT_REPLY = pa.schema([pa.field("detections", pa.list_(DETECTION_ITEM)), pa.field(ERROR, pa.string())])
# segment: a PNG of class indices at the input image's size, and each present class with its pixel count.
CLASS_PIXELS_ITEM = pa.struct([("label", pa.int32()), ("label_name", pa.string()), ("pixels", pa.int64())])
SEGMENT_FIELDS = (pa.field("path", pa.string()), pa.field("mask", pa.binary()),
                  pa.field("classes", pa.list_(CLASS_PIXELS_ITEM)), pa.field(ERROR, pa.string()))
# The sidecar sends the mask at the size the image was sent at (raw class indices); the task scales it to the
# source size, encodes the PNG and counts the classes (task/dense_outputs.py), in parallel across tasks.
SEGMENT_REPLY = pa.schema([pa.field("mask", pa.binary()), pa.field("mask_height", pa.int32()),
                           pa.field("mask_width", pa.int32()), pa.field(ERROR, pa.string())])
# cnn_udf's outputs: each a struct of these output columns (`topk` items also name their label).
UDF_OUTPUTS = {"top1": ("label", "label_name", "score", ERROR), "topk": ("topk", ERROR),
               "logits": ("logits", ERROR), "embedding": ("embedding", ERROR), RAW: ("raw", "shape", ERROR),
               "detections": ("detections", ERROR), "segments": ("mask", "classes", ERROR)}
# The task each cnn_udf output needs (classify for the rest).
UDF_OUTPUT_TASKS = {"detections": "detect", "segments": "segment"}
NAMED_TOPK_ITEM = pa.struct([TOPK_ITEM.field("label"), pa.field("label_name", pa.string()), TOPK_ITEM.field("score")])

_SPARK_NAMES = {pa.string(): "string", pa.int32(): "int", pa.int64(): "bigint", pa.float32(): "float",
                pa.float64(): "double", pa.binary(): "binary", pa.bool_(): "boolean"}


def output_schema(*, logits: bool = False, embeddings: bool = False, output_kind: str = CLASSES) -> pa.Schema:
    """The classify output columns: path, label, label_name, score, topk, error [, logits] [, embedding]; with
    output_kind="raw": path, raw, shape, error."""
    if output_kind == RAW:
        return pa.schema(_RAW_FIELDS)
    if output_kind != CLASSES:
        raise ValueError(f"output kind {output_kind!r}: expected one of {', '.join(OUTPUT_KINDS)}")
    wanted = {"logits": logits, "embeddings": embeddings}
    return pa.schema([*_FIELDS, *(field for key, field in _OPTIONAL.items() if wanted[key])])


def reply_schema(*, logits: bool = False, embeddings: bool = False, output_kind: str = CLASSES) -> pa.Schema:
    """What the sidecar sends for each request row: the output columns but those the task adds."""
    schema = output_schema(logits=logits, embeddings=embeddings, output_kind=output_kind)
    return pa.schema([field for field in schema if field.name not in TASK_COLUMNS])


def layout_of(heads) -> dict:
    """The layout keywords of `output_schema` / `reply_schema` from an object that names its heads: an Endpoint
    or InferenceOptions (`logits`, `embeddings`, `output_kind`)."""
    return {"logits": heads.logits, "embeddings": heads.embeddings, "output_kind": heads.output_kind}


def task_output_schema(task: str, *, logits: bool = False, embeddings: bool = False, output_kind: str = CLASSES
                       ) -> pa.Schema:
    """The output columns of `task` (TASKS): classify's `output_schema` (classes or raw), or detect's or
    segment's."""
    if task == "detect":
        return pa.schema(DETECT_FIELDS)
    if task == "segment":
        return pa.schema(SEGMENT_FIELDS)
    return output_schema(logits=logits, embeddings=embeddings, output_kind=output_kind)


def task_reply_schema(task: str, *, logits: bool = False, embeddings: bool = False, output_kind: str = CLASSES
                      ) -> pa.Schema:
    """What the sidecar sends per request row for `task`."""
    if task == "detect":
        return DETECT_REPLY
    if task == "segment":
        return SEGMENT_REPLY
    return reply_schema(logits=logits, embeddings=embeddings, output_kind=output_kind)


def udf_output_type(output: str) -> pa.StructType:
    """The struct `cnn_udf(output=...)` returns per row, from the output fields of its task."""
    fields = {field.name: field for field in (*DETECT_FIELDS, *SEGMENT_FIELDS)}
    fields |= {field.name: field for kind in OUTPUT_KINDS
               for field in output_schema(logits=True, embeddings=True, output_kind=kind)}
    fields["topk"] = pa.field("topk", pa.list_(NAMED_TOPK_ITEM))
    return pa.struct([fields[name] for name in UDF_OUTPUTS[output]])


def spark_type(arrow_type: pa.DataType) -> str:
    """An Arrow type as Spark DDL spells it: int32 -> int, list<float> -> array<float>, struct<a:int,...>."""
    if pa.types.is_list(arrow_type):
        return f"array<{spark_type(arrow_type.value_type)}>"
    if pa.types.is_struct(arrow_type):
        return "struct<" + ",".join(f"{field.name}:{spark_type(field.type)}" for field in arrow_type) + ">"
    if arrow_type not in _SPARK_NAMES:
        raise TypeError(f"no Spark DDL name for the Arrow type {arrow_type}")
    return _SPARK_NAMES[arrow_type]


def spark_ddl(schema: pa.Schema) -> str:
    """`schema` as a Spark DDL string, for mapInArrow: 'path string, label int, ...'."""
    return ", ".join(f"{field.name} {spark_type(field.type)}" for field in schema)


def failed_rows(errors: Sequence[str], schema: pa.Schema) -> pa.RecordBatch:
    """Rows without model outputs: every column of `schema` null but `error`, which says why."""
    columns = [pa.array(errors, pa.string()) if field.name == ERROR else pa.nulls(len(errors), field.type)
               for field in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def place_rows(parts: Sequence[tuple[Sequence[int], pa.RecordBatch]], rows: int, schema: pa.Schema
               ) -> pa.RecordBatch:
    """Rows of several `schema` batches put at their positions, in one concat and one take: part
    (positions, batch) holds row positions[j] in its row j.

    The contract of a result, checked here only: each part has `schema` and one row per position, and every
    position in range(rows) is held by exactly one row.
    """
    for positions, batch in parts:
        if batch.num_rows != len(positions):
            raise SidecarError(f"a reply of {batch.num_rows} rows for a request of {len(positions)} rows")
        if not batch.schema.equals(schema):
            raise SidecarError(f"a reply with columns {batch.schema} where {schema} was expected")
    held = np.fromiter((p for positions, _ in parts for p in positions), np.int64)
    if len(held) != rows or not np.array_equal(np.sort(held), np.arange(rows)):
        raise SidecarError(f"{len(held)} result rows for {rows} input rows, or not one row for each")
    if not rows:
        return pa.RecordBatch.from_pylist([], schema=schema)
    order = np.empty(rows, np.int64)
    order[held] = np.arange(rows)
    return _concat([batch for _, batch in parts]).take(pa.array(order))


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of `batches`' rows: `pa.concat_batches` (pyarrow >= 19), else through a table (pyarrow 18)."""
    if hasattr(pa, "concat_batches"):
        return pa.concat_batches(batches)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def class_names(labels: pa.Array, names: Sequence[str] | None) -> pa.Array:
    """The class name of each label: null where the label is null, or without `names`."""
    if not names:
        return pa.nulls(len(labels), pa.string())
    return pa.array(names, pa.string()).take(labels)
