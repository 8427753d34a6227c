"""The last stage of a request in the sidecar: the model's outputs for its rows -> its RESULT rows.

The reply has exactly the request's rows, in order, as `task.schema.reply_schema` lays them out: the top-k
pairs shaped here, once, as list<struct<label, score>>, vectors as list<float>, and a raw output (any tensor,
N x ...) as each row's values flattened in row-major order with the row's shape; a row whose image did not
decode keeps its place, with null outputs and its `error`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from spark_cnn.errors import SidecarError
from spark_cnn.task.schema import DETECT_REPLY, DETECTION_ITEM, ERROR, SEGMENT_REPLY, TOPK_ITEM, failed_rows, place_rows


def reply_batch(outputs: dict[str, np.ndarray], row_errors: list[str | None] | None, schema: pa.Schema
                ) -> pa.RecordBatch:
    """One `schema` row per request row.

    `outputs` (ModelRunner.download: label, score (N,); topk_label, topk_score (N, k); logits, embedding
    (N, width); or raw (N, ...)) hold the rows that reached the model. `row_errors`, given when the sidecar decoded the
    request, has one entry per request row: None where the image decoded (its outputs are the next row of
    `outputs`), else why it did not.
    """
    computed = _computed_rows(outputs, schema)
    if row_errors is None:
        return computed
    fine = [row for row, error in enumerate(row_errors) if error is None]
    failed = [row for row, error in enumerate(row_errors) if error is not None]
    return place_rows([(fine, computed), (failed, failed_rows([row_errors[row] for row in failed], schema))],
                      len(row_errors), schema)


def _computed_rows(outputs: dict[str, np.ndarray], schema: pa.Schema) -> pa.RecordBatch:
    if not outputs:  # no row reached the model
        return pa.RecordBatch.from_pylist([], schema=schema)
    if schema.equals(DETECT_REPLY):
        return _detection_rows(outputs)
    if schema.equals(SEGMENT_REPLY):
        return _mask_rows(outputs["mask"])
    rows = len(np.atleast_1d(next(iter(outputs.values()))))  # a 0-d output is refused by its column below
    columns = []
    for field in schema:
        if field.name == ERROR:
            columns.append(pa.nulls(rows, pa.string()))
        elif field.name == "raw":
            columns.append(_raw_values(outputs["raw"], field.type))
        elif field.name == "shape":
            columns.append(_raw_shapes(outputs["raw"], field.type))
        elif field.name == "topk":
            columns.append(_topk(outputs["topk_label"], outputs["topk_score"]))
        elif pa.types.is_list(field.type):
            columns.append(_vectors(field.name, outputs[field.name], field.type))
        else:
            columns.append(pa.array(_with_ndim(field.name, outputs[field.name], 1), field.type))
    lengths = {field.name: len(column) for field, column in zip(schema, columns, strict=True)}
    if len(set(lengths.values())) != 1:
        raise SidecarError(f"outputs with different numbers of rows ({lengths}); expected one row per image")
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _detection_rows(outputs: dict[str, np.ndarray]) -> pa.RecordBatch:
    """Per row: labels (k,), scores (k,), boxes (k, 4) -> a list of k (label, score, box) structs."""
    labels, scores, boxes = outputs["labels"], outputs["scores"], outputs["boxes"]
    if not len(labels) == len(scores) == len(boxes):
        raise SidecarError(f"detections for {len(labels)}, {len(scores)} and {len(boxes)} rows; expected one each")
    counts = [len(row) for row in labels]
    for score_row, box_row, k in zip(scores, boxes, counts, strict=True):
        if len(score_row) != k or np.shape(box_row) != (k, 4):
            raise SidecarError(f"{k} labels with {len(score_row)} scores and boxes of shape {np.shape(box_row)}; "
                               "expected one score and one (x1, y1, x2, y2) box per label")
    flat = np.concatenate([np.asarray(b, np.float32).reshape(-1, 4) for b in boxes]) if len(boxes) else \
        np.zeros((0, 4), np.float32)
    box_lists = pa.ListArray.from_arrays(_offsets(len(flat), 4), pa.array(flat.reshape(-1), pa.float32()),
                                         type=DETECTION_ITEM.field("box").type)
    items = pa.StructArray.from_arrays(
        [pa.array(np.concatenate([np.asarray(r, np.int32) for r in labels]), pa.int32()),
         pa.array(np.concatenate([np.asarray(r, np.float32) for r in scores]), pa.float32()), box_lists],
        fields=list(DETECTION_ITEM))
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    detections = pa.ListArray.from_arrays(offsets, items, type=DETECT_REPLY.field("detections").type)
    return pa.RecordBatch.from_arrays([detections, pa.nulls(len(counts), pa.string())], schema=DETECT_REPLY)


def _mask_rows(masks: np.ndarray) -> pa.RecordBatch:
    """Per row: an (h, w) class-index mask -> its raw bytes (uint8, or little-endian uint16 above 256 classes)."""
    raw, heights, widths = [], [], []
    for mask in masks:
        mask = np.asarray(mask)
        if mask.ndim != 2:
            raise SidecarError(f"a mask of shape {mask.shape}; expected (height, width)")
        raw.append((mask if mask.dtype == np.uint8 else mask.astype("<u2")).tobytes())
        heights.append(mask.shape[0])
        widths.append(mask.shape[1])
    return pa.RecordBatch.from_arrays([pa.array(raw, pa.binary()), pa.array(heights, pa.int32()),
                                       pa.array(widths, pa.int32()), pa.nulls(len(raw), pa.string())],
                                      schema=SEGMENT_REPLY)


def _topk(labels: np.ndarray, scores: np.ndarray) -> pa.ListArray:
    """(N, k) labels and scores, best first -> N lists of k (label, score) pairs."""
    labels, scores = _with_ndim("topk_label", labels, 2), _with_ndim("topk_score", scores, 2)
    if labels.shape != scores.shape:
        raise SidecarError(f"top-k labels of shape {labels.shape} but scores of shape {scores.shape}")
    rows, k = labels.shape
    pairs = pa.StructArray.from_arrays([pa.array(labels.reshape(-1), TOPK_ITEM.field("label").type),
                                        pa.array(scores.reshape(-1), TOPK_ITEM.field("score").type)],
                                       fields=list(TOPK_ITEM))
    return pa.ListArray.from_arrays(_offsets(rows, k), pairs, type=pa.list_(TOPK_ITEM))


def _vectors(name: str, values: np.ndarray, list_type: pa.ListType) -> pa.ListArray:
    """(N, width) -> N lists of `width` values."""
    values = _with_ndim(name, values, 2)
    rows, width = values.shape
    return pa.ListArray.from_arrays(_offsets(rows, width), pa.array(values.reshape(-1), list_type.value_type),
                                    type=list_type)


def _raw_values(values: np.ndarray, list_type: pa.ListType) -> pa.ListArray:
    """(N, ...) -> N lists of the row's values, flattened in row-major (C) order: `shape` restores them."""
    if values.ndim < 1:
        raise SidecarError(f"a raw output of shape {values.shape}; expected one entry per image (N, ...)")
    return _vectors("raw", values.reshape(len(values), -1), list_type)


def _raw_shapes(values: np.ndarray, list_type: pa.ListType) -> pa.ListArray:
    """The per-image shape of a (N, ...) output (the batch dimension dropped), once per row."""
    shape = np.asarray(values.shape[1:], np.int32)
    dims = pa.array(np.tile(shape, len(values)), list_type.value_type)
    return pa.ListArray.from_arrays(_offsets(len(values), len(shape)), dims, type=list_type)


def _offsets(rows: int, width: int) -> pa.Array:
    return pa.array(np.arange(rows + 1, dtype=np.int32) * np.int32(width))  # width may be 0 (a raw shape ())


def _with_ndim(name: str, values: np.ndarray, ndim: int) -> np.ndarray:
    values = np.ascontiguousarray(values)
    if values.ndim != ndim:
        raise SidecarError(f"output {name!r} has shape {values.shape}; expected "
                           f"{'one value' if ndim == 1 else 'one vector'} per row")
    return values
