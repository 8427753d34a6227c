"""How a source's `content` column holds its images: named encodings shared by the sources, the tasks and
`to-petastorm` (the conversions themselves live in imaging/pixels.py)."""

from __future__ import annotations

import numpy as np

from spark_cnn.imaging.pixels import rgb_from_npy, rgb_from_spark_image

# How the `content` column of a source holds its images.
ENCODED = "encoded"          # image files (JPEG, PNG, ...): decoded in the task or the sidecar
LOCAL_FILES = "local_files"  # no content: the task reads the image file `path` names (a local or shared mount)
SPARK_IMAGE = "spark_image"  # Spark's image source: BGR(A)/gray uint8 rows with height, width, channels
NPY = "npy"                  # numpy.save bytes of a uint8 (H, W), (H, W, 1|3|4) array
ENCODINGS = (ENCODED, LOCAL_FILES, SPARK_IMAGE, NPY)
# Encodings whose images are files (decoded by the task or the sidecar), as opposed to decoded pixels.
FILE_ENCODINGS = (ENCODED, LOCAL_FILES)


def decoded_rgb(encoding: str, content: bytes, height=None, width=None, channels=None) -> np.ndarray:
    """The RGB pixels of one decoded-pixel row (encoding SPARK_IMAGE or NPY)."""
    if encoding == SPARK_IMAGE:
        return rgb_from_spark_image(content, height, width, channels)
    if encoding == NPY:
        return rgb_from_npy(content)
    raise ValueError(f"not a decoded-pixel encoding: {encoding}")
