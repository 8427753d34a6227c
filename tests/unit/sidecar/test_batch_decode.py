"""Decoding in the sidecar: host decoding with per-row errors, the tensor resize against Pillow's, the GPU path's
file filter, and the Arrow payloads that carry files in and per-row errors out.

The tensor path (torch's antialiased bilinear resize) is compared with the Pillow path on the same decoded pixels,
so only the resize differs; on scikit-learn's sample photos the two differ by at most one grey level.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import torch
from PIL import Image

from spark_cnn.imaging.preprocess import Preprocessing, decode_rgb, preprocess_pixels
from spark_cnn.sidecar.batch_decode import _gpu_can_take, decode_on_gpu, decode_on_host, resize_crop_tensor
from spark_cnn.sidecar.reply import reply_batch
from spark_cnn.task import protocol
from spark_cnn.task.schema import ERROR, reply_schema
from tests.sample_images import encode as _encode
from tests.sample_images import sample_photo

PREP = Preprocessing()  # resize 256, crop 224
# Measured on torch 2.14 / Pillow for the photos below: mean |diff| 0.08-0.16 grey levels, 99th percentile and
# maximum 1. The bounds leave room for other builds without hiding a wrong geometry (which costs tens of levels).
MAX_MEAN_DIFF = 0.3
MAX_P99_DIFF = 1.0
MAX_ABS_DIFF = 2
EXIF_ORIENTATION = 0x0112


_photo = functools.cache(sample_photo)  # callers crop and resize: they get new images


@pytest.fixture(scope="module")
def china_jpeg() -> bytes:
    return _encode(_photo("china.jpg"), "JPEG", quality=90)


@pytest.fixture(scope="module")
def flower_png() -> bytes:
    return _encode(_photo("flower.jpg").resize((320, 213)), "PNG")


def _no_address(message: str | None) -> str | None:
    return None if message is None else re.sub(r" at 0x[0-9a-f]+", "", message)


def _chw(data: bytes) -> torch.Tensor:
    """Decoded as the Pillow path decodes it, laid out as torchvision's decoders return it: (3, H, W) uint8."""
    return torch.from_numpy(np.array(decode_rgb(data))).permute(2, 0, 1)


# --- decode_on_host ---------------------------------------------------------------------------------------------

def test_decode_on_host_keeps_good_rows_and_aligns_one_error_per_input(china_jpeg, flower_png):
    truncated = china_jpeg[: len(china_jpeg) // 3]
    images = [china_jpeg, b"", flower_png, truncated, b"text", china_jpeg]

    pixels, errors = decode_on_host(images, PREP)

    assert pixels.dtype == np.uint8
    assert pixels.shape == (3, PREP.crop, PREP.crop, 3)
    assert [e is None for e in errors] == [True, False, True, False, False, True]
    assert errors[1] == "empty file (0 bytes)"
    assert errors[3].startswith("cannot decode image:") and "truncated" in errors[3], errors[3]
    assert errors[4].startswith("cannot decode image:"), errors[4]
    for row, data in zip(pixels, [china_jpeg, flower_png, china_jpeg], strict=True):
        np.testing.assert_array_equal(row, preprocess_pixels(data, PREP))


def test_decode_on_host_with_no_good_image_returns_no_rows():
    pixels, errors = decode_on_host([b"", b"\xff\xd8\xff not really"], PREP)

    assert pixels.shape == (0, *PREP.pixel_shape)
    assert pixels.dtype == np.uint8
    assert len(errors) == 2 and all(errors)


# --- resize_crop_tensor against the Pillow path -----------------------------------------------------------------

BICUBIC = Preprocessing(interpolation="bicubic")  # e.g. EfficientNet's weights ask for it
# Bicubic overshoots at sharp edges, where torch's and Pillow's filters clamp differently: measured mean 0.15,
# p99 1, max 4 grey levels on china.jpg (bilinear in place of bicubic: mean 1.9, p99 13, max 25).
MAX_ABS_DIFF_BICUBIC = 6


@pytest.mark.parametrize("name, box, prep", [
    ("china.jpg", None, PREP),                # 640x427 landscape: downscale
    ("flower.jpg", None, PREP),
    ("china.jpg", (150, 0, 450, 427), PREP),  # 300x427 portrait
    ("china.jpg", (0, 0, 301, 257), PREP),    # odd margins: centre-crop rounding
    ("flower.jpg", (0, 0, 160, 240), PREP),   # shorter side below 256: upscale
    ("china.jpg", None, BICUBIC),             # the filter follows the preprocessing
    ("flower.jpg", (0, 0, 160, 240), BICUBIC),
])
def test_resize_crop_tensor_is_within_a_grey_level_of_pillow(name, box, prep):
    PREP = prep  # noqa: N806 (the same checks for each filter)
    image = _photo(name)
    if box is not None:
        image = image.crop(box)
    data = _encode(image, "JPEG", quality=90)
    expected = preprocess_pixels(data, PREP)

    got = resize_crop_tensor(_chw(data), PREP)

    assert got.dtype == torch.uint8
    assert tuple(got.shape) == expected.shape == PREP.pixel_shape
    diff = np.abs(got.numpy().astype(np.int16) - expected.astype(np.int16))
    measured = (f"{name} {image.size}: mean {diff.mean():.3f}, p99 {np.percentile(diff, 99):.1f}, "
                f"max {diff.max()} grey levels")
    assert diff.mean() <= MAX_MEAN_DIFF, measured
    assert np.percentile(diff, 99) <= MAX_P99_DIFF, measured
    assert diff.max() <= (MAX_ABS_DIFF_BICUBIC if prep.interpolation == "bicubic" else MAX_ABS_DIFF), measured


@pytest.mark.parametrize("size", [(256, 300), (400, 256), (256, 256)])
def test_resize_crop_tensor_equals_pillow_exactly_when_no_resize_is_needed(size):
    image = _photo("flower.jpg").crop((0, 0, *size))
    data = _encode(image, "JPEG", quality=90)

    got = resize_crop_tensor(_chw(data), PREP)

    np.testing.assert_array_equal(got.numpy(), preprocess_pixels(data, PREP))


# The Pillow fallback wraps Pillow's read-only array in a tensor (harmless: it is only copied by torch.stack).
@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
@pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities of TorchVision are deprecated")
def test_decode_on_gpu_path_run_on_the_cpu_matches_the_host_path(china_jpeg, flower_png):
    # torchvision's decode_jpeg also runs on the CPU: the whole GPU path (batched decode, per-file retry, Pillow
    # fallback for PNG and broken files, tensor resize) can be checked without a GPU.
    images = [china_jpeg, flower_png, b"", china_jpeg[: len(china_jpeg) // 3], b"text"]

    pixels, errors = decode_on_gpu(images, PREP, torch.device("cpu"))
    host_pixels, host_errors = decode_on_host(images, PREP)

    # Pillow's messages name the BytesIO object by address: compare them without it.
    assert [_no_address(e) for e in errors] == [_no_address(e) for e in host_errors]
    assert [e is None for e in errors] == [True, True, False, False, False]
    assert pixels.dtype == torch.uint8 and pixels.device.type == "cpu"
    assert tuple(pixels.shape) == host_pixels.shape == (2, *PREP.pixel_shape)
    np.testing.assert_array_equal(pixels[1].numpy(), host_pixels[1])  # the PNG went through Pillow
    diff = np.abs(pixels[0].numpy().astype(np.int16) - host_pixels[0].astype(np.int16))
    measured = f"mean {diff.mean():.3f}, max {diff.max()} grey levels"
    assert diff.mean() <= MAX_MEAN_DIFF and diff.max() <= MAX_ABS_DIFF, measured


# --- which files the GPU decoder takes ------------------------------------------------------------------------

def test_gpu_takes_plain_jpegs_only():
    image = _photo("china.jpg").resize((64, 43))
    rotated = Image.Exif()
    rotated[EXIF_ORIENTATION] = 6  # displayed rotated 90 degrees clockwise: nvJPEG would ignore it
    upright = Image.Exif()
    upright[EXIF_ORIENTATION] = 1

    assert _gpu_can_take(_encode(image, "JPEG"))
    assert _gpu_can_take(_encode(image, "JPEG", exif=upright))
    assert not _gpu_can_take(_encode(image, "JPEG", exif=rotated))
    assert not _gpu_can_take(_encode(image, "PNG"))
    assert not _gpu_can_take(b"")
    assert not _gpu_can_take(b"\xff\xd8\xff but not a JPEG")  # Pillow gives the error message later


# --- payloads ------------------------------------------------------------------------------------------------------

def test_a_reply_with_row_errors_keeps_every_row_in_place_with_null_outputs():
    outputs = {"label": np.array([7, 9], np.int32), "score": np.array([0.5, 0.25], np.float32),
               "topk_label": np.array([[7, 1], [9, 2]], np.int32), "topk_score": np.array([[0.5, 0.1], [0.25, 0.2]])}
    row_errors = [None, "cannot decode image: truncated", None, "empty file (0 bytes)"]

    batch = protocol.decode_outputs(protocol.encode_outputs(reply_batch(outputs, row_errors, reply_schema())))

    assert batch.schema.equals(reply_schema())
    assert batch.num_rows == 4
    assert batch.column("label").to_pylist() == [7, None, 9, None]
    assert batch.column("score").to_pylist() == [0.5, None, 0.25, None]
    assert [[p["label"] for p in row] if row else row for row in batch.column("topk").to_pylist()] == \
        [[7, 1], None, [9, 2], None]
    assert batch.column(ERROR).to_pylist() == row_errors


def test_a_reply_with_no_good_row_has_every_column_null_but_the_error():
    row_errors = ["empty file (0 bytes)", "cannot decode image: x"]

    batch = protocol.decode_outputs(protocol.encode_outputs(reply_batch({}, row_errors, reply_schema(logits=True))))

    assert batch.schema.equals(reply_schema(logits=True))
    assert batch.column(ERROR).to_pylist() == row_errors
    assert all(batch.column(name).null_count == 2 for name in batch.schema.names if name != ERROR)


def test_decode_request_tells_files_from_pixels(china_jpeg):
    files = [china_jpeg, b"", b"text"]
    pixels = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)

    decoded_files = protocol.decode_request(protocol.encode_images(files))
    decoded_pixels = protocol.decode_request(protocol.encode_pixels(pixels))

    assert isinstance(decoded_files, list) and decoded_files == files
    assert all(isinstance(f, bytes) for f in decoded_files)
    assert isinstance(decoded_pixels, np.ndarray)
    assert decoded_pixels.dtype == np.uint8
    np.testing.assert_array_equal(decoded_pixels, pixels)
