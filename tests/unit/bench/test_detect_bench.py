"""`spark-cnn bench` with a detector, the parts that need no Spark: mixed-shape images, the row check, and the
predict_batch_udf variant's predict function against the product's own detection head."""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from spark_cnn.bench import dataset, report
from spark_cnn.bench.detect_check import compare_detections, flat_rows, spark_cnn_rows, summary_line


def test_a_detectors_images_cycle_through_the_shapes_in_their_own_folders(tmp_path, monkeypatch):
    files = dataset.make_jpegs(8, shapes=dataset.DETECT_SHAPES)
    sizes = []
    for data in files:
        with Image.open(io.BytesIO(data)) as image:
            sizes.append((image.height, image.width))
    assert sizes == [*dataset.DETECT_SHAPES, *dataset.DETECT_SHAPES]
    assert dataset.make_jpegs(2) == dataset.make_jpegs(2, shapes=dataset.SQUARE)  # the classifier set unchanged

    monkeypatch.setattr(dataset, "DATASET_IMAGES", 4)
    square, mixed = dataset.input_dir(6, str(tmp_path)), dataset.input_dir(6, str(tmp_path), dataset.DETECT_SHAPES)
    assert os.path.basename(square) == "input-v1-6" and square != mixed
    assert len(dataset.input_files(mixed)) == 6
    with Image.open(dataset.input_files(mixed)[1]) as image:
        assert (image.height, image.width) == dataset.DETECT_SHAPES[1]


def _rows(*detections):
    """One image's (labels, scores, boxes) from (label, score, box) triples."""
    return (np.array([d[0] for d in detections], dtype=np.int64), np.array([d[1] for d in detections]),
            np.array([d[2] for d in detections], dtype=np.float64).reshape(-1, 4))


A, B = (1, 0.9, [0, 0, 10, 10]), (2, 0.5, [5, 5, 20, 30])


def test_row_check_matches_boxes_in_any_order_and_fails_on_a_moved_box_or_a_missing_row():
    ours = {"/a.jpg": _rows(A, B), "/b.jpg": _rows()}
    check = compare_detections(ours, {"/a.jpg": _rows(B, A), "/b.jpg": _rows()})
    assert check["passed"] and (check["matched"], check["detections"], check["same_count"]) == (2, 2, 2)

    moved = (2, 0.5, [5, 5, 20, 31])
    check = compare_detections(ours, {"/a.jpg": _rows(A, moved), "/b.jpg": _rows()})
    assert not check["passed"] and check["matched"] == 1 and check["matched_fraction"] == 0.5
    relabelled = (3, 0.5, [5, 5, 20, 30])
    assert compare_detections(ours, {"/a.jpg": _rows(A, relabelled), "/b.jpg": _rows()})["matched"] == 1
    assert not compare_detections(ours, {"/a.jpg": _rows(A, A), "/b.jpg": _rows()})["passed"]  # one twin each

    check = compare_detections(ours, {"/a.jpg": _rows(A, B)})
    assert not check["passed"] and check["only_spark_cnn"] == 1
    assert not compare_detections(ours, {"/a.jpg": _rows(A), "/b.jpg": _rows()})["passed"]  # a box fewer
    assert "FAILED" in summary_line(check)


def test_row_check_reads_both_variants_layouts_into_the_same_rows():
    detection = pa.struct([("label", pa.int32()), ("label_name", pa.string()), ("score", pa.float32()),
                           ("box", pa.list_(pa.float32()))])
    ours = pa.table({"path": ["file:///data/a.jpg", "file:/data/b.jpg"],
                     "detections": pa.array([[{"label": 1, "label_name": "1", "score": 0.5, "box": [1, 2, 3, 4]}],
                                             []], type=pa.list_(detection)),
                     "error": [None, None]})
    theirs = pa.table({"path": ["file:/data/a.jpg", "file:///data/b.jpg"], "labels": [[1], []], "scores": [[0.5], []],
                       "boxes": [[1.0, 2.0, 3.0, 4.0], []]})
    a, b = spark_cnn_rows(ours), flat_rows(theirs)
    assert set(a) == set(b) == {"/data/a.jpg", "/data/b.jpg"}
    assert a["/data/a.jpg"][2].tolist() == b["/data/a.jpg"][2].tolist() == [[1, 2, 3, 4]]
    assert compare_detections(a, b)["passed"]


def test_report_shows_the_detectors_row_check(tmp_path):
    entry = {"model": "ssdlite320_mobilenet_v3_large", "images": 2, "machine": "2 CPU cores", "task": "detect",
             "results": {"predict_batch_udf": 5.0, "spark_cnn": 6.0}, "memory_mb": {}, "details": {},
             "row_check": compare_detections({"/a.jpg": _rows(A)}, {"/a.jpg": _rows(A)})}
    text = report.table(entry)
    assert "row check spark_cnn vs predict_batch_udf: passed: 1 images in both" in text
    assert "1 of 1 detections matched" in text


def test_the_predict_batch_udf_detection_function_finds_the_product_heads_boxes_on_mixed_shapes():
    torch = pytest.importorskip("torch")
    import torchvision

    from spark_cnn.bench.variants import detect_images
    from spark_cnn.imaging.sizing import sized_pixels
    from spark_cnn.models.dense_heads import DetectionPredictor, detect_sizing

    torch.manual_seed(0)
    model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(num_classes=3, weights_backbone=None).eval()
    files = dataset.make_jpegs(4, shapes=dataset.DETECT_SHAPES)
    theirs = detect_images(model, np.array(files, dtype=object))

    sized = [sized_pixels(data, detect_sizing(model)) for data in files]  # what the detect job's tasks send
    images = [torch.from_numpy(np.array(pixels)).permute(2, 0, 1).float() / 255 for pixels, _ in sized]
    with torch.inference_mode():
        ours = DetectionPredictor(model).predict_sized(images, [source for _, source in sized])
    names = [str(i) for i in range(4)]
    check = compare_detections(
        {n: (ours["labels"][i].numpy(), ours["scores"][i].numpy(), ours["boxes"][i].numpy())
         for i, n in enumerate(names)},
        {n: (r["labels"], r["scores"], r["boxes"].reshape(-1, 4)) for n, r in zip(names, theirs, strict=True)})
    assert check["passed"] and check["detections"] > 0, check
    widths = [r["boxes"].reshape(-1, 4)[:, 2].max() for r in theirs]
    assert all(w > 320 * 0.5 for w in widths)  # boxes in each image's own pixels, not the 320x320 it was sent at
