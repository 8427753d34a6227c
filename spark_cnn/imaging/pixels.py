"""Pixels that arrive already decoded: Spark's image source (BGR rows) and NumPy arrays (petastorm NdarrayCodec).

They skip decoding but go through the same resize and centre crop as image files, so one picture gives the
same model input whichever way it was stored. Everything here is torch-free: it runs in Spark tasks.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from spark_cnn.errors import ImageError
from spark_cnn.imaging.modes import rgba_array_to_rgb
from spark_cnn.imaging.preprocess import Preprocessing, resize_and_crop


def rgb_from_spark_image(data: bytes, height: int, width: int, channels: int) -> np.ndarray:
    """A row of Spark's image source (OpenCV order: gray, BGR or BGRA, row-major) -> (H, W, 3) RGB uint8."""
    if height is None or height < 1 or width is None or width < 1:
        raise ImageError("Spark's image source could not decode this file (empty, truncated or not an image)")
    if channels not in (1, 3, 4):
        raise ImageError(f"Spark's image source gave {channels} channels; expected 1, 3 or 4")
    if len(data) != height * width * channels:
        raise ImageError(f"image data has {len(data)} bytes, expected {height}x{width}x{channels}")
    pixels = np.frombuffer(data, dtype=np.uint8).reshape(height, width, channels)
    if channels == 1:
        return np.repeat(pixels, 3, axis=2)
    if channels == 4:
        return rgba_array_to_rgb(pixels[:, :, [2, 1, 0, 3]])  # BGRA -> RGBA, then on white as files are
    return np.ascontiguousarray(pixels[:, :, ::-1])  # BGR -> RGB


def rgb_from_npy(data: bytes) -> np.ndarray:
    """`numpy.save` bytes of a uint8 image array -> (H, W, 3) RGB uint8. Never unpickles (allow_pickle=False)."""
    if not data:
        raise ImageError("empty array value (0 bytes)")
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as e:
        raise ImageError(f"cannot read the NumPy array: {type(e).__name__}: {e}") from e
    return rgb_from_array(array)


def rgb_from_array(array: np.ndarray) -> np.ndarray:
    """A uint8 (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) array in RGB(A) order -> (H, W, 3) RGB uint8."""
    if array.dtype != np.uint8:
        raise ImageError(f"image array has dtype {array.dtype}; expected uint8 pixels")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4) or min(array.shape[:2]) < 1:
        raise ImageError(f"image array has shape {array.shape}; expected (H, W) or (H, W, 1|3|4)")
    if array.shape[2] == 1:
        return np.repeat(array, 3, axis=2)
    if array.shape[2] == 4:
        return rgba_array_to_rgb(array)
    return np.ascontiguousarray(array)


def preprocess_rgb(rgb: np.ndarray, prep: Preprocessing) -> np.ndarray:
    """Decoded RGB pixels -> uint8 array of shape `prep.pixel_shape`, by the same resize and crop as files."""
    image = resize_and_crop(Image.fromarray(rgb, mode="RGB"), prep)
    pixels = np.asarray(image, dtype=np.uint8)
    if pixels.shape != prep.pixel_shape:
        raise ImageError(f"preprocessed image has shape {pixels.shape}, expected {prep.pixel_shape}")
    return pixels
