"""TIFFs Pillow cannot read (float samples, planar RGB, 64-bit data: common in science and in scikit-image's
own test data), read with tifffile when it is installed (the `tiff` extra; scikit-image depends on it).

Only the first page is decoded; its size is checked against the pixel limit from the header first.
Samples become 8 bit as imaging.modes does for Pillow images: unsigned 16-bit integers scaled by 255/65535,
floats taken as [0, 1] intensities.
"""

from __future__ import annotations

import io

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


def first_page_size(data: bytes) -> tuple[int, int]:
    """(width, height) of the first page, from its tags alone."""
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        page = tif.pages[0]
        return int(page.imagewidth), int(page.imagelength)


def first_page_rgb(data: bytes) -> np.ndarray:
    """The first page as (H, W, 3) uint8 RGB."""
    from spark_cnn.imaging.modes import float_to_8bit, sixteen_bit_to_8bit

    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        page = tif.pages[0]
        samples = page.asarray()
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
