"""The optional JPEG decoder: simplejpeg (libjpeg-turbo's TurboJPEG API), installed with the `fast-jpeg` extra.

It gives the same pixels as Pillow (tests/unit/imaging/test_image_decode.py checks it). `auto` uses it only where Pillow
itself lacks libjpeg-turbo: measured here (`spark-cnn bench-decode`, docs/benchmarks.md), against Pillow 13's
bundled libjpeg-turbo it was 12% slower per core on full-size decodes and about as fast on reduced ones, because
its output array must be copied into a Pillow image for the resize.
"""

from __future__ import annotations

import numpy as np
from PIL import features

try:
    import simplejpeg
except ImportError:  # the extra is optional
    simplejpeg = None


PILLOW_HAS_LIBJPEG_TURBO = bool(features.check_feature("libjpeg_turbo"))


def available() -> bool:
    return simplejpeg is not None


def preferred() -> bool:
    """Whether `auto` decodes JPEGs with simplejpeg: installed, and Pillow has no libjpeg-turbo of its own."""
    return available() and not PILLOW_HAS_LIBJPEG_TURBO


def decode_scaled(data: bytes, width: int, height: int, scale: int) -> np.ndarray | None:
    """JPEG bytes -> (H, W, 3) uint8 RGB at 1/`scale` of the stored size (scale 1, 2, 4 or 8).

    The output size matches Pillow's draft at the same scale: each side divided by `scale`, rounded up.
    None if TurboJPEG offers no such scale for this file (the caller decodes with Pillow instead); raises
    ValueError (from simplejpeg) for files libjpeg-turbo rejects, truncated ones included.
    """
    if scale == 1:
        return simplejpeg.decode_jpeg(data, colorspace="RGB")
    want_w, want_h = -(-width // scale), -(-height // scale)
    pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=want_w, min_height=want_h)
    return pixels if pixels.shape[:2] == (want_h, want_w) else None  # else it chose another M/8 factor
