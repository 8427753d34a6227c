"""TIFFs Pillow cannot read (float samples, planar RGB, 64-bit data: common in science and in scikit-image's
own test data), read with tifffile when it is installed (the `tiff` extra; scikit-image depends on it).

Only the first page is decoded. Its header is checked first (`first_page_header`): width x height against the
pixel limit, and the bytes tifffile would allocate for its samples (every axis, samples per pixel included, times
the sample type's size, plus one chunk's buffer) against the memory budget of that limit (limits.MAX_BYTES_PER_PIXEL).
Samples become 8 bit as imaging.modes does for Pillow images: unsigned 16-bit integers scaled by 255/65535,
floats taken as [0, 1] intensities.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

try:
    import tifffile
except ImportError:  # the extra is optional
    tifffile = None

from spark_cnn.errors import ImageError

TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, both byte orders


def is_tiff(data: bytes) -> bool:
    return data[:4] in TIFF_MAGICS


def available() -> bool:
    return tifffile is not None


@dataclass(frozen=True)
class PageHeader:
    """What the first page's tags say it decodes to, before any sample is decoded."""

    width: int
    height: int
    shape: tuple[int, ...]  # every axis of the page (depth, samples per pixel, planes), as asarray returns it
    chunk_shape: tuple[int, ...]  # one strip or tile as tifffile decodes it (a tile may exceed the page)
    dtype: str | None  # None: a sample format tifffile cannot decode

    @property
    def decoded_bytes(self) -> int:
        """Bytes `first_page_rgb` allocates for the samples: the page, plus one chunk in flight (it decodes one
        chunk at a time); 0 when the sample type is unknown (the decode then fails without allocating)."""
        if self.dtype is None:
            return 0
        return (math.prod(self.shape) + math.prod(self.chunk_shape)) * np.dtype(self.dtype).itemsize


def first_page_header(data: bytes) -> PageHeader:
    """The first page's size and layout, from its tags alone."""
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        page = tif.pages[0]
        dtype = None if page.dtype is None else np.dtype(page.dtype).name
        return PageHeader(int(page.imagewidth), int(page.imagelength), tuple(int(n) for n in page.shape),
                          tuple(int(n) for n in page.chunks), dtype)


def first_page_rgb(data: bytes) -> np.ndarray:
    """The first page as (H, W, 3) uint8 RGB."""
    from spark_cnn.imaging.modes import float_to_8bit, sixteen_bit_to_8bit

    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        page = tif.pages[0]
        samples = page.asarray(maxworkers=1)  # one chunk buffer at a time, as PageHeader.decoded_bytes counts
        axes = page.axes
    if "S" in axes and axes.index("S") < axes.index("Y"):  # planar: samples first
        samples = np.moveaxis(samples, axes.index("S"), -1)
    if samples.ndim == 2:
        samples = samples[..., None]
    if samples.ndim != 3:
        raise ImageError(f"cannot decode image: TIFF page of shape {samples.shape} (axes {axes}) is not 2-D")
    if samples.dtype == np.uint8:
        pixels = samples
    elif np.issubdtype(samples.dtype, np.integer):
        pixels = sixteen_bit_to_8bit(samples)
    elif np.issubdtype(samples.dtype, np.floating):
        pixels = float_to_8bit(samples)
    else:
        raise ImageError(f"cannot decode image: TIFF samples of type {samples.dtype}")
    channels = pixels.shape[-1]
    if channels == 1:
        return np.repeat(pixels, 3, axis=-1)
    if channels >= 3:
        return np.ascontiguousarray(pixels[..., :3])  # extra samples (alpha) dropped: rare in such files
    raise ImageError(f"cannot decode image: TIFF page with {channels} samples per pixel")
