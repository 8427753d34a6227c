"""bench-sidecar's inputs: which task a model name serves, and requests cut from the bench images."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from spark_cnn.bench.sidecar_bench import (
    DENSE_BENCH_SHAPES,
    SidecarBenchConfig,
    run_sidecar_bench,
    take_images,
)
from spark_cnn.bench.variant_task import bench_task
from spark_cnn.errors import ConfigError
from spark_cnn.imaging.samples import bench_jpegs
from spark_cnn.imaging.sizing import SizeRule, sized_pixels
from spark_cnn.task.protocol import SizedImages


@pytest.mark.parametrize(("model", "task"), [
    ("mobilenet_v3_small", "classify"), ("ssdlite320_mobilenet_v3_large", "detect"),
    ("fasterrcnn_mobilenet_v3_large_320_fpn", "detect"), ("lraspp_mobilenet_v3_large", "segment"),
    ("identity", "classify")])
def test_bench_task_follows_torchvision_builders(model, task):
    assert bench_task(model) == task


def test_fixed_size_requests_stack_and_cycle():
    images = [np.full((2, 2, 3), i, np.uint8) for i in range(3)]
    batch = take_images(images, 2, 4)
    assert batch.shape == (4, 2, 2, 3)
    assert [int(b[0, 0, 0]) for b in batch] == [2, 0, 1, 2]


def test_files_pass_as_they_are():
    assert take_images([b"a", b"b"], 1, 3) == [b"b", b"a", b"b"]


def test_sized_requests_keep_each_image_and_its_source():
    rule = SizeRule(min_size=160, max_size=320)
    files = bench_jpegs(4, shapes=DENSE_BENCH_SHAPES)
    assert [Image.open(io.BytesIO(f)).size[::-1] for f in files] == list(DENSE_BENCH_SHAPES)
    images = [SizedImages([p], [s]) for p, s in (sized_pixels(f, rule) for f in files)]
    request = take_images(images, 3, 3)
    assert isinstance(request, SizedImages) and len(request) == 3
    assert request.sources == [(400, 600), (320, 320), (240, 427)]
    assert request.sizes == [(160, 240), (160, 160), (160, 284)]  # shorter side 160, aspect ratio kept


def test_a_detector_refuses_a_square_input_size_before_any_work():
    with pytest.raises(ConfigError, match="--image-size"):
        run_sidecar_bench(SidecarBenchConfig(model="ssdlite320_mobilenet_v3_large", image_size=224))
