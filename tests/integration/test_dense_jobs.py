"""detect and segment on a real local Spark: torchvision's Faster R-CNN (on the tiny backbone of
models/tiny_dense.py, as a module:factory) and torchvision's LR-ASPP segmenter by name, random weights with three
classes saved and reloaded as files, over photos of several sizes, EXIF orientations, greyscale and RGBA, and
broken files. Every output equals the model's direct output on the same image, mapped to the input's pixels;
cnn_udf gives the job's rows.

The photos' shorter sides stay under 4x the detector's (and the segmenter's) shorter side, so no JPEG decodes at a
reduced DCT scale, which would make the inputs differ slightly from a full decode. The score layers are drawn wider
than torchvision's initialisation: with it, a random detector scores every box alike (to 1e-6), so which boxes
survive turns on float rounding (thread counts), and a random segmenter gives every pixel one class."""

from __future__ import annotations

import io
import os
from urllib.parse import urlparse

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torchvision
from PIL import Image, ImageOps

from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.imaging.preprocess import IMAGENET_MEAN, IMAGENET_STD
from spark_cnn.models.spec import ModelSpec
from spark_cnn.models.tiny_dense import TINY_DETECTOR, TINY_MAX_SIZE, TINY_MIN_SIZE, tiny_detector
from spark_cnn.spark.classify_job import detect, segment
from spark_cnn.spark.udf import cnn_udf
from tests.sample_images import broken_files, encode, real_image_files, sample_photo, write_files

pytestmark = pytest.mark.spark

DETECTOR = TINY_DETECTOR  # its transform: shorter side TINY_MIN_SIZE, longer side at most TINY_MAX_SIZE
SEGMENTER = "lraspp_mobilenet_v3_large"
CLASSES = 3
MAX_DETECTIONS = 7
SEGMENT_SIDE = 128  # --resize: the shorter side the segmenter sees (small: a cheap forward on the CPU)
EXIF_ORIENTATION = 0x0112


def _rotated_jpeg(orientation: int, size: tuple[int, int]) -> bytes:
    """A photo stored sideways (or upside down) with the EXIF orientation that makes it upright."""
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    return encode(sample_photo("flower.jpg").resize(size), "JPEG", quality=90, exif=exif)


@pytest.fixture(scope="module")
def dense_folder(tmp_path_factory) -> str:
    files = {**real_image_files(), **broken_files(), "exif/rot90.jpg": _rotated_jpeg(6, (500, 300)),
             "exif/rot180.jpg": _rotated_jpeg(3, (300, 200)),
             # Larger than the detector's max size: the task shrinks it before it crosses the socket.
             "photos/wide.png": encode(sample_photo("china.jpg").resize((1400, 500)), "PNG")}
    return write_files(str(tmp_path_factory.mktemp("dense")), files)


@pytest.fixture(scope="module")
def dense_weights(tmp_path_factory) -> dict[str, str]:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("dense_weights")
    paths = {}
    detector = tiny_detector(CLASSES)
    for layer in (detector.rpn.head.cls_logits, detector.roi_heads.box_predictor.cls_score):
        torch.nn.init.normal_(layer.weight, std=1.0)
    segmenter = torchvision.models.get_model(SEGMENTER, weights=None, weights_backbone=None, num_classes=CLASSES)
    torch.nn.init.normal_(segmenter.classifier.low_classifier.weight, std=1.0)  # classes that vary across a picture
    for name, model in ((DETECTOR, detector), (SEGMENTER, segmenter)):
        paths[name] = str(folder / f"{name.rpartition(':')[2]}.pth")
        torch.save(model.state_dict(), paths[name])
    return paths


def _model(name: str, weights: str) -> torch.nn.Module:
    model = tiny_detector(CLASSES) if name == DETECTOR else torchvision.models.get_model(
        name, weights=None, weights_backbone=None, num_classes=CLASSES)
    model.load_state_dict(torch.load(weights, weights_only=True))
    return model.eval()


def _upright_rgb(path: str) -> Image.Image:
    """What the file shows, as plain Pillow gives it: EXIF applied, alpha over white, RGB."""
    with Image.open(path) as image:
        image = ImageOps.exif_transpose(image)
        if image.mode in ("RGBA", "LA", "P"):
            image = image.convert("RGBA")
            white = Image.new("RGBA", image.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, image).convert("RGB")
        return image.convert("RGB")


def _rows(path: str) -> dict[str, dict]:
    rows = pq.read_table(path).to_pylist()
    by_path = {urlparse(r["path"]).path: r for r in rows}
    assert len(by_path) == len(rows)
    return by_path


def _files_under(root: str) -> set[str]:
    return {os.path.join(d, f) for d, _, names in os.walk(root) for f in names}


def _expected_detections(model, path: str) -> list[dict]:
    """The detector run directly on the image resized by its own rule, boxes scaled to the image's pixels."""
    image = _upright_rgb(path)
    width, height = image.size
    scale = min(TINY_MIN_SIZE / min(width, height), TINY_MAX_SIZE / max(width, height))
    sent = (int(height * scale), int(width * scale))
    resized = image.resize((sent[1], sent[0]), Image.BILINEAR)
    pixels = torch.from_numpy(np.array(resized)).permute(2, 0, 1).float() / 255
    with torch.inference_mode():
        out = model([pixels])[0]
    ratio = np.array([width / sent[1], height / sent[0]] * 2, dtype=np.float32)
    return [{"label": int(label), "score": float(score), "box": (box.numpy() * ratio).tolist()}
            for label, score, box in zip(out["labels"], out["scores"], out["boxes"], strict=True)][:MAX_DETECTIONS]


def _in_tie_order(detections: list[dict]) -> list[dict]:
    """Best first, boxes of equal scores (flat image regions give them) in one order: theirs is arbitrary."""
    return sorted(detections, key=lambda d: (-round(d["score"], 5), [round(v, 2) for v in d["box"]]))


def test_detect_job_boxes_are_the_models_own_in_input_pixels_and_cnn_udf_agrees(spark, dense_folder,
                                                                                dense_weights, tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("background\nthing\nstuff\n")
    output = str(tmp_path / "detected")
    options = InferenceOptions(ModelSpec(DETECTOR, dense_weights[DETECTOR]), labels=str(labels),
                               max_detections=MAX_DETECTIONS, batch_size=4, task="detect")
    summary = detect(ClassifyConfig(dense_folder, output, options), spark=spark)

    rows = _rows(output)
    assert set(rows) == _files_under(dense_folder)
    model = _model(DETECTOR, dense_weights[DETECTOR])
    boxes = 0
    for path, row in rows.items():
        if "/broken/" in path:
            assert row["error"] and row["detections"] is None
            continue
        assert row["error"] is None, row["error"]
        expected, found = _in_tie_order(_expected_detections(model, path)), _in_tie_order(row["detections"])
        assert [d["label"] for d in found] == [d["label"] for d in expected], path
        assert [d["label_name"] for d in found] == [["background", "thing", "stuff"][d["label"]] for d in expected]
        np.testing.assert_allclose([d["score"] for d in found], [d["score"] for d in expected],
                                   rtol=1e-4, atol=1e-5, err_msg=path)
        np.testing.assert_allclose(np.array([d["box"] for d in found]).reshape(-1, 4),
                                   np.array([d["box"] for d in expected]).reshape(-1, 4), rtol=1e-4, atol=1e-2,
                                   err_msg=path)
        width, height = _upright_rgb(path).size
        for d in row["detections"]:  # input pixels, not the sent image's
            assert 0 <= d["box"][0] <= d["box"][2] <= width + 0.01 and 0 <= d["box"][1] <= d["box"][3] <= height + 0.01
        boxes += len(row["detections"])
    assert boxes > 0, "random weights gave no boxes anywhere: the comparison above checked nothing"
    assert summary["images"] == len(rows) and summary["errors"] == 3 and summary["accuracy"] is None
    assert len(summary["sidecars"]) == 1

    images = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(dense_folder)
    udf = cnn_udf(DETECTOR, weights=dense_weights[DETECTOR], output="detections", labels=str(labels),
                  max_detections=MAX_DETECTIONS, batch_size=4)
    by_udf = {urlparse(r["path"]).path: r["pred"].asDict(recursive=True)
              for r in images.select("path", udf("content").alias("pred")).collect()}
    assert set(by_udf) == set(rows) - {p for p in rows if p.endswith("empty.png")}  # binaryFile skips empty files
    for path, pred in by_udf.items():
        assert pred["error"] is None if rows[path]["error"] is None else pred["error"]
        np.testing.assert_allclose([d["box"] for d in pred["detections"] or []],
                                   [d["box"] for d in rows[path]["detections"] or []], atol=1e-3)
        assert [d["label_name"] for d in pred["detections"] or []] == [
            d["label_name"] for d in rows[path]["detections"] or []]


def test_segment_job_masks_are_the_models_own_at_input_size(spark, dense_folder, dense_weights, tmp_path):
    output = str(tmp_path / "segmented")
    options = InferenceOptions(ModelSpec(SEGMENTER, dense_weights[SEGMENTER], preprocessing={"resize": SEGMENT_SIDE}),
                               batch_size=4, task="segment")
    summary = segment(ClassifyConfig(dense_folder, output, options), spark=spark)

    rows = _rows(output)
    assert set(rows) == _files_under(dense_folder)
    model = _model(SEGMENTER, dense_weights[SEGMENTER])
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    labels_seen = set()
    for path, row in rows.items():
        if "/broken/" in path:
            assert row["error"] and row["mask"] is None and row["classes"] is None
            continue
        assert row["error"] is None, row["error"]
        image = _upright_rgb(path)
        width, height = image.size
        short, long = min(width, height), max(width, height)
        other = int(SEGMENT_SIDE * long / short)
        sent = (SEGMENT_SIDE, other) if height <= width else (other, SEGMENT_SIDE)
        pixels = torch.from_numpy(np.array(image.resize((sent[1], sent[0]), Image.BILINEAR)))
        with torch.inference_mode():
            logits = model(((pixels.permute(2, 0, 1).float() / 255 - mean) / std)[None])["out"]
        classes = logits.argmax(1, keepdim=True).float()
        expected = torch.nn.functional.interpolate(classes, size=(height, width), mode="nearest-exact")[0, 0]
        mask = np.asarray(Image.open(io.BytesIO(row["mask"])))
        assert mask.shape == (height, width)
        assert (mask == expected.numpy().astype(np.uint8)).mean() > 0.999, path
        counts = np.bincount(mask.reshape(-1), minlength=CLASSES)
        assert [(c["label"], c["pixels"]) for c in row["classes"]] == [
            (label, int(counts[label])) for label in np.flatnonzero(counts)]
        assert all(c["label_name"] is None for c in row["classes"])  # random weights: no category names
        labels_seen.update(c["label"] for c in row["classes"])
    assert summary["images"] == len(rows) and summary["errors"] == 3
    assert len(labels_seen) > 1, "every pixel of every image in one class: the mask comparison checked little"

    images = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(dense_folder)
    udf = cnn_udf(SEGMENTER, weights=dense_weights[SEGMENTER], output="segments",
                  preprocessing={"resize": SEGMENT_SIDE}, batch_size=4)
    for r in images.select("path", udf("content").alias("pred")).collect():
        row, pred = rows[urlparse(r["path"]).path], r["pred"].asDict(recursive=True)
        assert (pred["mask"], pred["classes"], pred["error"] is None) == (row["mask"], row["classes"],
                                                                          row["error"] is None)
