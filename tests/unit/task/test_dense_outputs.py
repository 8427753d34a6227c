"""Shaping detector and segmenter outputs: the sidecar's reply rows -> the output columns, rows placed out of
order across requests (as the task places them), failed rows kept as nulls."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from spark_cnn.sidecar.reply import reply_batch
from spark_cnn.task import protocol
from spark_cnn.task.dense_outputs import named_detections, source_masks
from spark_cnn.task.schema import DETECT_REPLY, SEGMENT_REPLY, failed_rows, place_rows


def _ragged(rows: list) -> np.ndarray:
    held = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        held[i] = row
    return held


def _detections(seed: int, rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 4, rows)
    return {"labels": _ragged([rng.integers(0, 3, k).astype(np.int32) for k in counts]),
            "scores": _ragged([np.sort(rng.random(k).astype(np.float32))[::-1] for k in counts]),
            "boxes": _ragged([rng.random((k, 4)).astype(np.float32) * 100 for k in counts])}


def _sent(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A reply as the task receives it: through the Arrow IPC stream."""
    return protocol.decode_outputs(protocol.encode_outputs(batch))


def test_detections_of_two_requests_land_at_their_rows_with_class_names():
    first, second = _detections(0, 3), _detections(1, 3)
    placed = place_rows([([0, 2, 4], _sent(reply_batch(first, None, DETECT_REPLY))),
                         ([1, 3, 6], _sent(reply_batch(second, ["bad file", None, None, None], DETECT_REPLY))[1:]),
                         ([5], failed_rows(["bad file"], DETECT_REPLY))], 7, DETECT_REPLY)
    rows = named_detections(placed.column("detections"), ["background", "cat", "dog"]).to_pylist()
    expected = {0: (first, 0), 2: (first, 1), 4: (first, 2), 1: (second, 0), 3: (second, 1), 6: (second, 2)}
    assert rows[5] is None
    for row, (outputs, i) in expected.items():
        assert [d["label"] for d in rows[row]] == outputs["labels"][i].tolist()
        assert [d["label_name"] for d in rows[row]] == [["background", "cat", "dog"][k] for k in outputs["labels"][i]]
        np.testing.assert_allclose([d["score"] for d in rows[row]], outputs["scores"][i])
        np.testing.assert_allclose(np.reshape([d["box"] for d in rows[row]], (-1, 4)), outputs["boxes"][i])


def test_a_detector_without_boxes_gives_empty_lists_and_unknown_labels_no_name():
    outputs = {"labels": _ragged([np.zeros(0, np.int32), np.array([7], np.int32)]),
               "scores": _ragged([np.zeros(0, np.float32), np.array([0.5], np.float32)]),
               "boxes": _ragged([np.zeros((0, 4), np.float32), np.array([[1, 2, 3, 4]], np.float32)])}
    rows = named_detections(reply_batch(outputs, None, DETECT_REPLY).column("detections"), ["a", "b"]).to_pylist()
    assert rows == [[], [{"label": 7, "label_name": None, "score": 0.5, "box": [1.0, 2.0, 3.0, 4.0]}]]


def test_boxes_that_do_not_fit_their_labels_are_refused():
    outputs = {"labels": _ragged([np.array([1, 2], np.int32)]), "scores": _ragged([np.array([0.5], np.float32)]),
               "boxes": _ragged([np.zeros((2, 4), np.float32)])}
    with pytest.raises(Exception, match="labels with 1 scores"):
        reply_batch(outputs, None, DETECT_REPLY)


def test_masks_go_back_to_the_source_size_as_png_with_class_counts():
    small = np.array([[0, 1], [2, 2]], np.uint8)
    wide = np.array([[1, 1, 0]], np.uint8)
    reply = reply_batch({"mask": _ragged([small, wide])}, [None, "broken", None], SEGMENT_REPLY)
    pngs, classes = source_masks(reply.column("mask"), reply.column("mask_height"), reply.column("mask_width"),
                                 {0: (4, 6), 2: (1, 3)}, ["sky", "tree", "road"])
    first = np.asarray(Image.open(io.BytesIO(pngs[0].as_py())))
    assert first.shape == (4, 6)
    np.testing.assert_array_equal(first, np.repeat(np.repeat(small, 2, axis=0), 3, axis=1))  # nearest, centred
    assert classes.to_pylist() == [
        [{"label": 0, "label_name": "sky", "pixels": 6}, {"label": 1, "label_name": "tree", "pixels": 6},
         {"label": 2, "label_name": "road", "pixels": 12}],
        None,
        [{"label": 0, "label_name": "sky", "pixels": 1}, {"label": 1, "label_name": "tree", "pixels": 2}]]
    assert pngs[1].as_py() is None


def test_masks_of_more_than_256_classes_travel_as_16_bits():
    mask = np.array([[300, 2]], np.int32)
    reply = reply_batch({"mask": _ragged([mask])}, None, SEGMENT_REPLY)
    pngs, classes = source_masks(reply.column("mask"), reply.column("mask_height"), reply.column("mask_width"),
                                 {}, None)
    assert np.asarray(Image.open(io.BytesIO(pngs[0].as_py()))).tolist() == [[300, 2]]
    assert [c["label"] for c in classes.to_pylist()[0]] == [2, 300]
    assert pa.types.is_binary(pngs.type)
