"""Resizing only the crop's box gives, byte for byte, what resizing the whole picture and cropping gives."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from spark_cnn.imaging.crop_window import resize_crop
from spark_cnn.imaging.decode import decode_for_resize
from spark_cnn.imaging.preprocess import (
    Preprocessing,
    center_crop,
    center_crop_origin,
    resize_and_crop,
    resize_shorter_side,
    shorter_side_size,
)
from tests.sample_images import sample_photo


def _whole_then_crop(image: Image.Image, prep: Preprocessing, box=None) -> np.ndarray:
    return np.asarray(center_crop(resize_shorter_side(image, prep.resize, box, prep.interpolation), prep.crop))


def _plan(width: int, height: int, resize: int = 256, crop: int = 224):
    resized = shorter_side_size(width, height, resize)
    return resize_crop((width, height), None, resized, center_crop_origin(*resized, crop), crop)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_random_geometries_give_the_same_bytes_as_resizing_everything(interpolation):
    """Sizes, targets and reduced-DCT boxes drawn at random: shrinking and enlarging, either axis the shorter,
    both pass orders. Every one must match; a Pillow that changed its arithmetic would fail here."""
    rng = np.random.default_rng(20261207)
    photo = sample_photo("china.jpg")
    for i in range(60):
        size = (int(rng.integers(40, 900)), int(rng.integers(40, 900)))
        resize = int(rng.choice([256, 256, 232, 160, 299, 64]))
        prep = Preprocessing(resize=resize, crop=int(rng.integers(resize // 2, resize + 1)),
                             interpolation=interpolation)
        image, box = photo.resize(size), None
        if i % 3 == 0:  # a JPEG decoded at a reduced DCT scale, read through its box
            data = io.BytesIO()
            image.save(data, "JPEG", quality=90)
            image, box = decode_for_resize(data.getvalue(), min_short_side=resize)
        assert np.array_equal(np.asarray(resize_and_crop(image, prep, box)), _whole_then_crop(image, prep, box)), \
            (size, box, prep)


def test_a_square_picture_is_resized_only_where_the_crop_keeps_it():
    plan = _plan(320, 320)  # the bench's JPEGs: 320/256 = 1.25 holds exactly on both axes
    assert plan.size == (224, 224) and plan.offset == (0, 0)
    assert plan.box == (20.0, 20.0, 300.0, 300.0)


def test_a_photo_is_windowed_on_its_shorter_side_and_resized_whole_on_its_longer():
    # 640x427 -> 383x256: 427/256 is a binary fraction, 640/383 is not (its rounding could move a window)
    plan = _plan(640, 427)
    assert plan.size == (383, 224) and plan.offset == (80, 0)
    portrait = _plan(427, 640)
    assert portrait.size == (224, 383) and portrait.offset == (0, 80)


def test_a_window_that_would_change_pillows_pass_order_is_not_taken():
    # 354x749 -> 256x541: the whole resize runs its vertical pass first (the height shrinks more than twice as
    # much as the width); windowing the width would make it horizontal first and round differently
    plan = _plan(354, 749)
    assert plan.size == (256, 541) and plan.offset == (16, 158)
    assert plan.box == (0.0, 0.0, 354.0, 749.0)
    image = sample_photo("china.jpg").resize((354, 749))
    assert np.array_equal(np.asarray(resize_and_crop(image, Preprocessing())), _whole_then_crop(image, Preprocessing()))


def test_a_picture_already_at_the_resize_is_only_cropped():
    image = sample_photo("flower.jpg").crop((0, 0, 256, 300))
    assert np.array_equal(np.asarray(resize_and_crop(image, Preprocessing())), _whole_then_crop(image, Preprocessing()))
