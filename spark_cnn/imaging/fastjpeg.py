"""The optional faster JPEG decoder: simplejpeg (libjpeg-turbo's TurboJPEG API), installed with the
`fast-jpeg` extra. Without it every JPEG goes through Pillow; the results agree within the tolerance
docs/benchmarks.md states (tests/unit/test_decode.py checks it).
"""

from __future__ import annotations

import numpy as np

try:
    import simplejpeg
except ImportError:  # the extra is optional
    simplejpeg = None


def available() -> bool:
    return simplejpeg is not None


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
