"""Fuzzing the image decoder (hypothesis): random bytes and mutated real files of every common format.

The contract the tasks and the sidecar rely on: `preprocess_pixels` returns pixels of the model's shape or
raises ImageError, never another exception; `decode_on_host` (the sidecar's path) gives one error or one
pixel row per file. Examples are derandomised and bounded, so the run is the same every time and short.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from spark_cnn.errors import ImageError
from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels
from spark_cnn.sidecar.batch_decode import decode_on_host

PREP = Preprocessing(resize=32, crop=32)
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP")


def _seed_files() -> dict[str, bytes]:
    """A small real image in each format (and an EXIF-rotated JPEG), to mutate."""
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
    files = {}
    for fmt in FORMATS:
        buf = io.BytesIO()
        image.save(buf, format=fmt)
        files[fmt] = buf.getvalue()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees
    buf = io.BytesIO()
    image.save(buf, format="JPEG", exif=exif)
    files["JPEG-EXIF"] = buf.getvalue()
    return files


SEEDS = _seed_files()


def check_contract(data: bytes) -> bool:
    """True if the bytes decoded (to the right shape), False if ImageError; anything else fails the test."""
    try:
        pixels = preprocess_pixels(data, PREP)
    except ImageError:
        return False
    assert pixels.shape == PREP.pixel_shape and pixels.dtype == np.uint8
    return True


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(SEEDS[draw(st.sampled_from(sorted(SEEDS)))])
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "header"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 64))]
        else:  # dimensions and markers live in the first bytes: hit them harder
            data[min(at, 32):min(at, 32) + 2] = draw(st.binary(min_size=2, max_size=2))
    return bytes(data)


def test_every_seed_file_decodes():
    assert all(check_contract(data) for data in SEEDS.values())


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes_decode_or_raise_image_error(data):
    check_contract(data)


@FUZZ
@given(mutated())
def test_mutated_real_files_decode_or_raise_image_error(data):
    check_contract(data)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.lists(st.one_of(mutated(), st.sampled_from(sorted(SEEDS.values()))), min_size=1, max_size=6))
def test_sidecar_decoding_gives_one_row_or_one_error_per_file(files):
    pixels, errors = decode_on_host(files, PREP)
    assert len(errors) == len(files)
    assert len(pixels) == sum(error is None for error in errors)
    assert pixels.shape[1:] == PREP.pixel_shape
    for data, error in zip(files, errors, strict=True):
        assert (error is None) == check_contract(data)


@pytest.mark.parametrize("data", [b"", b"\xff\xd8\xff", b"GIF89a", b"\x89PNG\r\n\x1a\n" + b"\0" * 64,
                                  b"BM" + b"\xff" * 60],
                         ids=["empty", "jpeg-magic-only", "gif-magic-only", "png-signature-zeros", "bmp-garbage"])
def test_known_bad_headers_raise_image_error(data):
    with pytest.raises(ImageError):
        preprocess_pixels(data, PREP)
