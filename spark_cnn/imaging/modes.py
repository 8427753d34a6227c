"""Every Pillow image mode to 8-bit RGB.

- Grayscale (L, 1), CMYK (Pillow undoes Adobe's inverted CMYK when it reads the JPEG), YCbCr, LAB, HSV: Pillow's
  own conversion. ICC profiles are not applied.
- Alpha (RGBA, LA, PA, palette with a transparent colour): composited on white, which is what a viewer shows.
  The colour stored under fully transparent pixels is arbitrary (often black), so dropping alpha would feed
  the model whatever the encoder left there. Fully opaque images are unchanged by this.
- 16-bit (I;16, I;16B, I;16L, ...) and 32-bit integer (I): taken as 16-bit intensities and scaled to 8 bit
  with rounding (v * 255 / 65535). Pillow's own convert would clip every value above 255 to white.
- 32-bit float (F): taken as intensities in [0, 1], the common convention for float images; scaled by 255
  and clipped.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

BACKGROUND = (255, 255, 255)  # what transparent pixels become
ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")
PILLOW_CONVERTS = ("L", "1", "CMYK", "YCbCr", "LAB", "HSV")
UINT16_MAX = 65535


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` in any mode -> an 8-bit RGB image (see the module docstring for each mode)."""
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in PILLOW_CONVERTS:
        return image.convert("RGB")
    if mode == "P":
        if "transparency" not in image.info:
            return image.convert("RGB")
        return _on_white(image.convert("RGBA"))
    if mode in ALPHA_MODES:
        return _on_white(image.convert("RGBA"))
    if mode.startswith("I;16") or mode == "I":
        return _gray_to_rgb(sixteen_bit_to_8bit(np.asarray(image)))
    if mode == "F":
        return _gray_to_rgb(float_to_8bit(np.asarray(image)))
    return image.convert("RGB")


def sixteen_bit_to_8bit(values: np.ndarray) -> np.ndarray:
    """Integer intensities in 0..65535 (others clipped) -> uint8, rounded: 65535 -> 255, 257 -> 1, 128 -> 0."""
    wide = np.clip(values, 0, UINT16_MAX).astype(np.uint32)
    return ((wide + 128) // 257).astype(np.uint8)


def float_to_8bit(values: np.ndarray) -> np.ndarray:
    """Float intensities in [0, 1] (others clipped) -> uint8, rounded."""
    return np.clip(np.asarray(values, dtype=np.float64) * 255.0 + 0.5, 0, 255).astype(np.uint8)


def _gray_to_rgb(gray: np.ndarray) -> Image.Image:
    return Image.fromarray(gray, mode="L").convert("RGB")


def rgba_array_to_rgb(rgba: np.ndarray) -> np.ndarray:
    """(H, W, 4) RGBA uint8 pixels -> (H, W, 3) RGB, composited on white as decoded files are: an RGBA picture
    gives the same model input from a file, Spark's image source or a NumPy array."""
    return np.asarray(_on_white(Image.fromarray(np.ascontiguousarray(rgba), mode="RGBA")))


def _on_white(rgba: Image.Image) -> Image.Image:
    if rgba.getchannel("A").getextrema() == (255, 255):
        return rgba.convert("RGB")  # opaque: nothing to composite
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (*BACKGROUND, 255)), rgba).convert("RGB")
