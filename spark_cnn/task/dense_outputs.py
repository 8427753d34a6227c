"""The task's last step for detectors and segmenters: the sidecar's reply rows -> the output columns.

detect: each detection gets its label's class name. segment: the mask, sent back at the size the image was sent
at, is scaled to the source image's size (nearest neighbour), encoded as PNG, and its classes counted; done here,
in the parallel Spark tasks, not in the one sidecar. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_cnn.imaging.masks import class_pixels, encode_png, mask_array, source_mask
from spark_cnn.task.schema import CLASS_PIXELS_ITEM, NAMED_DETECTION_ITEM


def dense_output_columns(task: str, columns: dict[str, pa.Array], sources: dict[int, tuple[int, int]],
                         label_names: Sequence[str] | None) -> dict[str, pa.Array]:
    """`columns` (the reply's, placed at input positions, plus `path`) with the output columns of `task`."""
    if task == "detect":
        return {**columns, "detections": named_detections(columns["detections"], label_names)}
    masks, classes = source_masks(columns["mask"], columns["mask_height"], columns["mask_width"], sources,
                                  label_names)
    return {**columns, "mask": masks, "classes": classes}


def label_names_of(labels: pa.Array, names: Sequence[str] | None) -> pa.Array:
    """Each label's class name; null without names, for a null label, or for a label past the names given."""
    if not names:
        return pa.nulls(len(labels), pa.string())
    return pa.array([names[v] if v is not None and 0 <= v < len(names) else None for v in labels.to_pylist()],
                    pa.string())


def named_detections(detections: pa.ListArray, names: Sequence[str] | None) -> pa.ListArray:
    """list<struct<label, score, box>> -> list<struct<label, label_name, score, box>>, nulls kept."""
    # StructArray.flatten, not .field(): a field ignores the offset of a sliced or taken struct array.
    labels, scores, boxes = detections.flatten().flatten()
    named = pa.StructArray.from_arrays([labels, label_names_of(labels, names), scores, boxes],
                                       fields=list(NAMED_DETECTION_ITEM))
    return pa.ListArray.from_arrays(_offsets(detections), named, type=pa.list_(NAMED_DETECTION_ITEM),
                                    mask=detections.is_null())


def source_masks(raw: pa.Array, heights: pa.Array, widths: pa.Array, sources: dict[int, tuple[int, int]],
                 names: Sequence[str] | None) -> tuple[pa.Array, pa.ListArray]:
    """PNG masks at the source sizes, and per row its classes (label, label_name, pixels), ascending by label."""
    pngs, labels, counts, lengths = [], [], [], []
    for row, (data, height, width) in enumerate(zip(raw.to_pylist(), heights.to_pylist(), widths.to_pylist(),
                                                    strict=True)):
        if data is None:  # a failed row
            pngs.append(None)
            lengths.append(0)
            continue
        mask = source_mask(mask_array(data, height, width), sources.get(row, (height, width)))
        present, pixels = class_pixels(mask)
        pngs.append(encode_png(mask))
        labels.extend(present.tolist())
        counts.extend(pixels.tolist())
        lengths.append(len(present))
    label_array = pa.array(labels, pa.int32())
    items = pa.StructArray.from_arrays([label_array, label_names_of(label_array, names), pa.array(counts, pa.int64())],
                                       fields=list(CLASS_PIXELS_ITEM))
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    classes = pa.ListArray.from_arrays(offsets, items, type=pa.list_(CLASS_PIXELS_ITEM), mask=raw.is_null())
    return pa.array(pngs, pa.binary()), classes


def _offsets(lists: pa.ListArray) -> pa.Array:
    """Offsets from the lengths: a slice's start past zero, and a mask needs offsets of its own."""
    lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False)
    return pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
