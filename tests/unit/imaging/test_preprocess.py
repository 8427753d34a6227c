"""Decoding and geometry match torchvision exactly; normalisation matches ToTensor + Normalize."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from sklearn.datasets import load_digits
from torchvision import transforms

from spark_cnn.errors import ConfigError, ImageError
from spark_cnn.imaging.preprocess import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Preprocessing,
    center_crop,
    decode_rgb,
    preprocess_pixels,
    resize_shorter_side,
)
from spark_cnn.models.tensors import normalise
from tests.sample_images import encode as _bytes
from tests.sample_images import sample_photo as _photo

EXIF_ORIENTATION = 0x0112
ROTATE_90_CW = 6  # EXIF Orientation 6: the stored image must be rotated 90 degrees clockwise to display


def _torchvision(data: bytes, prep: Preprocessing) -> np.ndarray:
    """The reference: a plain torchvision pipeline on the PIL RGB image."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    return np.asarray(transforms.Compose([transforms.Resize(prep.resize), transforms.CenterCrop(prep.crop)])(image))


def _digit_png() -> bytes:
    gray = np.round(load_digits().images[0] * (255.0 / 16.0)).astype(np.uint8)  # 8x8, values 0..16
    return _bytes(Image.fromarray(gray, mode="L"), "PNG")


# --- geometry against torchvision -----------------------------------------------------------------------------

@pytest.mark.parametrize("name, box", [
    ("china.jpg", None),                  # 640x427, landscape
    ("flower.jpg", None),
    ("china.jpg", (150, 0, 450, 427)),    # 300x427, portrait: taller than wide
    ("flower.jpg", (0, 0, 256, 300)),     # shorter side already 256: no resize
    ("china.jpg", (0, 0, 301, 257)),      # odd margins: centre-crop rounding
])
def test_default_preprocessing_matches_torchvision(name, box):
    image = _photo(name)
    if box:
        image = image.crop(box)
    data = _bytes(image, "JPEG", quality=90)
    prep = Preprocessing()

    pixels = preprocess_pixels(data, prep)

    assert pixels.shape == (224, 224, 3)
    assert pixels.dtype == np.uint8
    assert np.array_equal(pixels, _torchvision(data, prep))


def test_tiny_digit_png_is_upscaled_like_torchvision():
    data = _digit_png()
    prep = Preprocessing(resize=32, crop=32)
    pixels = preprocess_pixels(data, prep)
    assert pixels.shape == (32, 32, 3)
    assert np.array_equal(pixels, _torchvision(data, prep))


def test_smaller_crop_than_resize_matches_torchvision():
    data = _bytes(_photo("flower.jpg"), "PNG")
    prep = Preprocessing(resize=100, crop=64)
    assert np.array_equal(preprocess_pixels(data, prep), _torchvision(data, prep))


def test_resize_shorter_side_and_center_crop_sizes():
    image = Image.new("RGB", (640, 427))
    resized = resize_shorter_side(image, 256)
    assert resized.size == (383, 256)  # int(256 * 640 / 427) = 383, as torchvision truncates
    assert center_crop(resized, 224).size == (224, 224)
    assert resize_shorter_side(image.transpose(Image.Transpose.TRANSPOSE), 256).size == (256, 383)


# --- colour modes ---------------------------------------------------------------------------------------------

def test_grayscale_becomes_three_equal_channels():
    data = _bytes(_photo("china.jpg").convert("L"), "PNG")
    pixels = preprocess_pixels(data, Preprocessing())
    assert pixels.shape == (224, 224, 3)
    assert np.array_equal(pixels[..., 0], pixels[..., 1])
    assert np.array_equal(pixels[..., 0], pixels[..., 2])
    assert np.array_equal(pixels, _torchvision(data, Preprocessing()))


def test_rgba_is_composited_on_white():
    rgb = _photo("flower.jpg")
    rgba = rgb.copy()
    rgba.putalpha(Image.new("L", rgb.size, 77))
    prep = Preprocessing()
    pixels = preprocess_pixels(_bytes(rgba, "PNG"), prep).astype(int)
    opaque = preprocess_pixels(_bytes(rgb, "PNG"), prep).astype(int)
    assert pixels.shape == (224, 224, 3)
    expected = opaque * 77 / 255 + 255 * (1 - 77 / 255)  # what a viewer shows on a white page
    assert np.abs(pixels - expected).max() <= 2  # composited, then resized: two roundings


def test_opaque_rgba_equals_rgb():
    rgb = _photo("flower.jpg")
    rgba = rgb.convert("RGBA")
    prep = Preprocessing()
    assert np.array_equal(preprocess_pixels(_bytes(rgba, "PNG"), prep), preprocess_pixels(_bytes(rgb, "PNG"), prep))


def test_palette_image_becomes_rgb():
    palette = _photo("china.jpg").convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    data = _bytes(palette, "PNG")
    assert Image.open(io.BytesIO(data)).mode == "P"
    pixels = preprocess_pixels(data, Preprocessing())
    assert pixels.shape == (224, 224, 3)
    assert not np.array_equal(pixels[..., 0], pixels[..., 2])  # still in colour
    assert np.array_equal(pixels, _torchvision(data, Preprocessing()))


# --- EXIF orientation -----------------------------------------------------------------------------------------

def _exif_rotated_jpeg() -> tuple[bytes, Image.Image]:
    stored = _photo("china.jpg").crop((100, 50, 400, 250))  # 300x200, not symmetric
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = ROTATE_90_CW
    data = _bytes(stored, "JPEG", quality=95, exif=exif)
    return data, ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")


def test_exif_orientation_is_applied_on_decode():
    data, upright = _exif_rotated_jpeg()
    assert Image.open(io.BytesIO(data)).size == (300, 200)

    decoded = decode_rgb(data)

    assert decoded.mode == "RGB"
    assert decoded.size == (200, 300)
    assert np.array_equal(np.asarray(decoded), np.asarray(upright))


def test_exif_orientation_is_applied_before_cropping():
    data, upright = _exif_rotated_jpeg()
    prep = Preprocessing(resize=120, crop=100)
    reference = transforms.Compose([transforms.Resize(prep.resize), transforms.CenterCrop(prep.crop)])

    pixels = preprocess_pixels(data, prep)

    assert np.array_equal(pixels, np.asarray(reference(upright)))
    assert not np.array_equal(pixels, _torchvision(data, prep))  # the pipeline that ignores EXIF differs


# --- bad input ------------------------------------------------------------------------------------------------

def test_empty_bytes_raise_image_error():
    with pytest.raises(ImageError, match=r"empty file \(0 bytes\)"):
        preprocess_pixels(b"", Preprocessing())


def test_random_bytes_raise_image_error():
    junk = np.random.default_rng(0).bytes(2048)
    with pytest.raises(ImageError, match="cannot decode image: UnidentifiedImageError"):
        preprocess_pixels(junk, Preprocessing())


@pytest.mark.parametrize("fraction", [0.5, 0.05])
def test_truncated_jpeg_raises_image_error(fraction):
    data = _bytes(_photo("china.jpg"), "JPEG", quality=90)
    with pytest.raises(ImageError, match="cannot decode image: OSError.*[Tt]runcated") as info:
        preprocess_pixels(data[: int(len(data) * fraction)], Preprocessing())
    assert isinstance(info.value.__cause__, OSError)  # chained, so the original error stays visible


# --- Preprocessing validation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"resize": 32, "crop": 64}, r"crop \(64\) must not exceed resize \(32\)"),
    ({"resize": 0, "crop": 0}, "must be positive pixel sizes"),
    ({"resize": 256, "crop": -1}, "must be positive pixel sizes"),
    ({"mean": (0.5, 0.5)}, "three values"),
    ({"std": (0.2, 0.2, 0.2, 0.2)}, "three values"),
    ({"std": (0.2, 0.0, 0.2)}, "std values must be positive"),
    ({"std": (0.2, -1.0, 0.2)}, "std values must be positive"),
])
def test_invalid_preprocessing_raises_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Preprocessing(**kwargs)


def test_preprocessing_defaults_and_dict_round_trip():
    prep = Preprocessing(resize=40, crop=32, mean=[0.5, 0.5, 0.5], std=(1, 2, 3))
    assert prep.mean == (0.5, 0.5, 0.5)  # lists become tuples of floats
    assert prep.std == (1.0, 2.0, 3.0)
    assert prep.pixel_shape == (32, 32, 3)
    assert Preprocessing.from_dict(prep.to_dict()) == prep
    default = Preprocessing()
    assert (default.resize, default.crop, default.mean, default.std) == (256, 224, IMAGENET_MEAN, IMAGENET_STD)


# --- normalisation --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("prep", [Preprocessing(), Preprocessing(resize=32, crop=32, mean=(0.5,) * 3, std=(0.5,) * 3)])
def test_normalise_matches_to_tensor_and_normalize(prep):
    images = [_photo("china.jpg"), _photo("flower.jpg")]
    pixels = np.stack([preprocess_pixels(_bytes(im, "PNG"), prep) for im in images])
    reference = transforms.Compose([transforms.ToTensor(), transforms.Normalize(prep.mean, prep.std)])
    expected = torch.stack([reference(Image.fromarray(p)) for p in pixels])

    actual = normalise(torch.from_numpy(pixels), prep)

    assert actual.dtype == torch.float32
    assert actual.shape == (2, 3, prep.crop, prep.crop)
    assert torch.allclose(actual, expected, atol=1e-6, rtol=0)


def test_normalise_leaves_the_input_pixels_untouched():
    pixels = torch.full((1, 4, 4, 3), 200, dtype=torch.uint8)
    normalise(pixels, Preprocessing())
    assert torch.all(pixels == 200)


def test_normalise_row_tiled_equals_per_channel_broadcast_bit_for_bit():
    """The row-tiled fast path gives exactly what (x * scale[c] + shift[c]) per channel gives, channels-last,
    for a strided (non-contiguous) input too."""
    prep = Preprocessing()
    generator = torch.Generator().manual_seed(0)
    wide = torch.randint(0, 256, (3, 7, 10, 3), dtype=torch.uint8, generator=generator)
    pixels = wide[:, :, 1:9]  # a view: rows not contiguous
    scale = torch.tensor([1.0 / (255.0 * s) for s in prep.std]).view(1, 3, 1, 1)
    shift = torch.tensor([-m / s for m, s in zip(prep.mean, prep.std, strict=True)]).view(1, 3, 1, 1)
    expected = pixels.permute(0, 3, 1, 2).to(torch.float32).mul_(scale).add_(shift)

    actual = normalise(pixels, prep)

    assert actual.shape == (3, 3, 7, 8)
    assert actual.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(actual, expected)
