"""Segmentation masks as the output holds them: a PNG of class indices at the input image's size, and the
pixels of each class. Torch-free: the tasks do this, in parallel, from the mask the sidecar computed at the
size the image was sent at."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from spark_cnn.errors import SidecarError


def mask_array(raw: bytes, height: int, width: int) -> np.ndarray:
    """A mask as the sidecar sends it (row-major class indices, uint8, or uint16 above 256 classes)."""
    cells = height * width
    if len(raw) == cells:
        return np.frombuffer(raw, dtype=np.uint8).reshape(height, width)
    if len(raw) == 2 * cells:
        return np.frombuffer(raw, dtype="<u2").reshape(height, width)
    raise SidecarError(f"a mask of {len(raw)} bytes for {height}x{width} pixels; expected 1 or 2 bytes per pixel")


def source_mask(mask: np.ndarray, source: tuple[int, int]) -> np.ndarray:
    """The mask at the source image's (height, width): nearest neighbour, each output pixel taking the class
    at its centre (the mask is of class indices, which must not be blended)."""
    height, width = source
    if mask.shape == (height, width):
        return mask
    if mask.dtype == np.uint8:
        return np.asarray(Image.fromarray(mask, mode="L").resize((width, height), Image.NEAREST))
    resized = Image.fromarray(mask.astype(np.int32), mode="I").resize((width, height), Image.NEAREST)
    return np.asarray(resized).astype(np.uint16)


def encode_png(mask: np.ndarray) -> bytes:
    """8-bit (or 16-bit) greyscale PNG whose pixel values are the class indices."""
    buf = io.BytesIO()
    image = Image.fromarray(mask, mode="L") if mask.dtype == np.uint8 else Image.fromarray(mask.astype(np.uint16))
    image.save(buf, format="PNG", compress_level=1)  # the fastest zlib level: masks are runs of few values
    return buf.getvalue()


def class_pixels(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(classes present, ascending; their pixel counts)."""
    counts = np.bincount(mask.reshape(-1))
    present = np.flatnonzero(counts)
    return present, counts[present]
