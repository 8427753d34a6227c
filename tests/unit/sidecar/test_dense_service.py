"""Detectors and segmenters in the sidecar, in-process: requests of images at their own sizes from several
threads, merged and split into device batches (and halved on out-of-memory), answer with exactly the model's own
outputs for each image, mapped to its source size."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import ModelSpec
from spark_cnn.models.tiny_dense import TINY_DETECTOR, TINY_SEGMENTER, tiny_detector, tiny_segmenter
from spark_cnn.sidecar.fault_injection import INJECT_OOM_ENV
from spark_cnn.sidecar.job_stats import JobStats
from spark_cnn.sidecar.registry import load_runner
from spark_cnn.sidecar.runner import ModelRunner
from spark_cnn.sidecar.service import InferRequest, ModelService
from spark_cnn.task.dense_outputs import named_detections
from spark_cnn.task.protocol import SizedImages
from tests.service_doubles import JOB, REPLY_WAIT_S, RecordingConnection

# Sent sizes (height, width): repeats share a group, the rest run alone.
SIZES = [(128, 170), (170, 128), (128, 170), (128, 192), (128, 170), (150, 128), (170, 128)]


@pytest.fixture(scope="module")
def detector_weights(tmp_path_factory) -> str:
    torch.manual_seed(3)
    model = tiny_detector()
    for layer in (model.rpn.head.cls_logits, model.roi_heads.box_predictor.cls_score):
        torch.nn.init.normal_(layer.weight, std=1.0)  # scores that differ (torchvision's init ties them)
    path = tmp_path_factory.mktemp("dense") / "detector.pth"
    torch.save(model.state_dict(), path)
    return str(path)


def _requests(seed: int) -> list[SizedImages]:
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for size in SIZES]
    sources = [(h * 3, w * 3) for h, w in SIZES]
    return [SizedImages(images[0:3], sources[0:3]), SizedImages(images[3:4], sources[3:4]),
            SizedImages(images[4:], sources[4:])]


def _serve(runner: ModelRunner, requests: list[SizedImages], target_rows: int):
    conn = RecordingConnection()
    service = ModelService(runner, target_rows, JobStats(), compute_workers=2)
    threads = [threading.Thread(target=service.submit, args=(InferRequest(conn, i + 1, JOB, images),))
               for i, images in enumerate(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert conn.wait_for(len(requests), REPLY_WAIT_S)
    service.close()
    return conn, service


@pytest.mark.parametrize("oom_above", [None, 2], ids=["fits", "out-of-memory above 2 rows"])
def test_detections_of_mixed_sizes_are_each_images_own_in_source_pixels(detector_weights, monkeypatch, oom_above):
    if oom_above is not None:
        monkeypatch.setenv(INJECT_OOM_ENV, str(oom_above))
    endpoint = resolve_endpoint(ModelSpec(TINY_DETECTOR, detector_weights), task="detect", max_detections=5).endpoint
    runner = load_runner(endpoint, torch.device("cpu"))  # with the injected out-of-memory, as the sidecar loads it
    model = tiny_detector()
    model.load_state_dict(torch.load(detector_weights, weights_only=True))
    requests = _requests(0)
    conn, service = _serve(runner, requests, target_rows=4)
    if oom_above is not None:
        assert service.target_rows <= oom_above
    found = 0
    for request_id, images in enumerate(requests, start=1):
        rows = named_detections(conn.result(request_id).column("detections"), None).to_pylist()
        assert len(rows) == len(images)
        for image, source, row in zip(images.images, images.sources, rows, strict=True):
            with torch.inference_mode():
                direct = model([torch.from_numpy(image).permute(2, 0, 1).float() / 255])[0]
            ratio = torch.tensor([source[1] / image.shape[1], source[0] / image.shape[0]] * 2)
            assert [d["label"] for d in row] == direct["labels"][:5].tolist()
            np.testing.assert_allclose([d["score"] for d in row], direct["scores"][:5].numpy(), rtol=1e-5)
            np.testing.assert_allclose(np.reshape([d["box"] for d in row], (-1, 4)),
                                       (direct["boxes"][:5] * ratio).numpy(), rtol=1e-5, atol=1e-3)
            found += len(row)
    assert found > 0


def test_min_score_above_every_score_gives_empty_lists(detector_weights):
    endpoint = resolve_endpoint(ModelSpec(TINY_DETECTOR, detector_weights), task="detect", min_score=1.0).endpoint
    conn, _ = _serve(ModelRunner(endpoint, torch.device("cpu")), _requests(1)[:1], target_rows=2)
    assert conn.result(1).column("detections").to_pylist() == [[], [], []]


def test_masks_are_the_segmenters_classes_at_the_sent_size():
    torch.manual_seed(4)
    endpoint = resolve_endpoint(ModelSpec(TINY_SEGMENTER), task="segment").endpoint
    runner = ModelRunner(endpoint, torch.device("cpu"))
    requests = _requests(2)
    conn, _ = _serve(runner, requests, target_rows=3)
    model = runner.predictor.module
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in (endpoint.preprocessing.mean, endpoint.preprocessing.std))
    for request_id, images in enumerate(requests, start=1):
        reply = conn.result(request_id)
        for image, raw, height, width in zip(images.images, *(reply.column(c).to_pylist() for c in (
                "mask", "mask_height", "mask_width")), strict=True):
            assert (height, width) == image.shape[:2]
            with torch.inference_mode():
                logits = model(((torch.from_numpy(image).permute(2, 0, 1).float() / 255 - mean) / std)[None])
                logits = torch.nn.functional.interpolate(logits, size=image.shape[:2], mode="bilinear")
            expected = logits.argmax(1)[0].numpy().astype(np.uint8)
            np.testing.assert_array_equal(np.frombuffer(raw, np.uint8).reshape(height, width), expected)
    assert tiny_segmenter  # the factory the endpoint names
