"""The size each image is sent at: the model's own resize rule, on the upright picture, source size kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from spark_cnn.imaging.sizing import SizeRule, sized_pixels, sized_rgb
from spark_cnn.models.dense_heads import detect_sizing
from tests.sample_images import encode, sample_photo

SOURCES = [(427, 640), (640, 427), (500, 1400), (31, 33), (3000, 4000), (1, 7)]


@pytest.mark.parametrize("name", ["fasterrcnn_mobilenet_v3_large_320_fpn", "ssdlite320_mobilenet_v3_large"])
def test_the_rule_is_the_detectors_own_transform_and_it_leaves_our_size_alone(name):
    model = torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=2)
    rule, transform = detect_sizing(model), model.transform
    for height, width in SOURCES:
        ours = rule.target(height, width)
        theirs = transform.resize(torch.zeros(3, height, width), None)[0].shape[-2:]
        assert ours == tuple(theirs), (height, width)
        again = transform.resize(torch.zeros(3, *ours), None)[0].shape[-2:]
        assert tuple(again) == ours  # what we send, the model does not resize again


def test_segmentation_rule_is_torchvisions_resize_of_the_shorter_side():
    rule = SizeRule(min_size=520)
    for height, width in SOURCES:
        expected = torchvision.transforms.functional.resize(torch.zeros(1, height, width), [520]).shape[-2:]
        assert rule.target(height, width) == tuple(expected)


def test_exif_rotated_photo_keeps_its_upright_source_size():
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: the picture is 300 wide, 500 tall
    data = encode(sample_photo("flower.jpg").resize((500, 300)), "JPEG", exif=exif)
    pixels, source = sized_pixels(data, SizeRule(min_size=100, max_size=1000))
    assert source == (500, 300) and pixels.shape == (166, 100, 3)


def test_a_large_jpeg_decodes_reduced_but_reports_its_full_size():
    photo = sample_photo("china.jpg").resize((4000, 2672))
    pixels, source = sized_pixels(encode(photo, "JPEG", quality=90), SizeRule(min_size=320, max_size=640))
    assert source == (2672, 4000) and pixels.shape == (320, 479, 3)
    full = np.asarray(photo.resize((479, 320), Image.BILINEAR), dtype=np.float32)
    assert np.abs(pixels.astype(np.float32) - full).mean() < 3  # the DCT-reduced decode looks the same


def test_decoded_pixels_and_fixed_sizes():
    rgb = np.zeros((50, 80, 3), np.uint8)
    pixels, source = sized_rgb(rgb, SizeRule(fixed=(32, 48)))
    assert pixels.shape == (32, 48, 3) and source == (50, 80)


@pytest.mark.parametrize("fields", [{}, {"min_size": 0}, {"min_size": 10, "max_size": 5}, {"fixed": (0, 3)},
                                    {"min_size": 10, "interpolation": "lanczos"}])
def test_bad_rules_are_refused(fields):
    from spark_cnn.errors import ConfigError

    with pytest.raises(ConfigError):
        SizeRule(**fields)
