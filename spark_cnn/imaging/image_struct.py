"""Spark `image` structs (the `image` data source, `pyspark.ml.image.ImageSchema`) to model input pixels.

A struct holds decoded pixels: `origin, height, width, nChannels, mode, data`, with `data` row-major in OpenCV's
channel order (BGR, BGRA or one grey channel). They go through the same resize and centre crop as files do
(imaging/preprocess.py; the pixel conversion is the image source's, formats/pixels.py), so an image read by
either source becomes the same model input. Torch-free: runs in Spark tasks.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from PIL import Image

from spark_cnn.errors import ImageError
from spark_cnn.imaging.limits import DecodeOptions
from spark_cnn.imaging.pixels import preprocess_rgb, rgb_from_spark_image
from spark_cnn.imaging.preprocess import Preprocessing

IMAGE_STRUCT_FIELDS = ("origin", "height", "width", "nChannels", "mode", "data")
# OpenCV type codes Spark's image source writes: 8-bit with 1, 3 or 4 channels. Anything else (-1 marks an
# image the source could not decode) is not a picture we can use.
OPENCV_8BIT_MODES = {0: 1, 16: 3, 24: 4}


def is_image_struct(field_names) -> bool:
    """Whether a struct with these field names is a Spark image (extra fields are allowed)."""
    return set(IMAGE_STRUCT_FIELDS) <= set(field_names)


def image_struct_rgb(image: Mapping) -> np.ndarray:
    """One image struct (a dict or a pandas row with the six fields) -> (H, W, 3) RGB uint8 pixels."""
    height, width, channels, mode, data = (image["height"], image["width"], image["nChannels"], image["mode"],
                                           image["data"])
    if data is None or height is None or width is None or height < 1 or width < 1:
        raise ImageError(f"not a decoded image (height={height}, width={width}); the image source could not read it")
    if OPENCV_8BIT_MODES.get(mode) != channels:
        raise ImageError(f"unsupported image mode {mode} with {channels} channel(s); expected 8-bit grey, BGR or BGRA "
                         f"(OpenCV types 0, 16, 24)")
    return rgb_from_spark_image(data, height, width, channels)


def image_struct_to_rgb(image: Mapping) -> Image.Image:
    """One image struct -> an RGB PIL image."""
    return Image.fromarray(image_struct_rgb(image), mode="RGB")


def preprocess_image_struct(image: Mapping, prep: Preprocessing, options: DecodeOptions | None = None) -> np.ndarray:
    """Image struct -> uint8 array of shape `prep.pixel_shape`, as `preprocess_pixels` does for files.

    The pixels are already decoded, so of the guard rails only the pixel count applies."""
    if options is not None and image["height"] and image["width"] and \
            image["height"] * image["width"] > options.max_pixels:
        raise ImageError(f"image has {image['height'] * image['width']} pixels, more than --max-pixels "
                         f"{options.max_pixels}")
    return preprocess_rgb(image_struct_rgb(image), prep)
