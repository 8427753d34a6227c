"""Variable-size model input: each image keeps its own size, brought within the model's own resize rule.

Detectors and segmenters take images of any size. Sending each one at its full size would push a 12-megapixel
photo (36 MB of pixels) over the socket only for the model to shrink it, so the tasks apply the model's own rule
first, with the same antialiased resize as classification:

- `min_size`/`max_size` (torchvision's GeneralizedRCNNTransform: Faster/Mask/Keypoint R-CNN, RetinaNet, FCOS):
  scale = min(min_size / shorter side, max_size / longer side), each side floor(side x scale), as its
  `interpolate(scale_factor=..., recompute_scale_factor=True)` sizes it;
- `min_size` alone (torchvision's SemanticSegmentation preset: shorter side to `resize`), sized as Resize does;
- `fixed` (height, width) (SSD and SSDlite: every image to one size, aspect ratio not kept).

Each image also keeps its source (upright) size, so outputs (boxes, masks) go back to the input's pixels.
Torch-free: this runs in the Spark tasks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image

from spark_cnn.errors import ConfigError, ImageError
from spark_cnn.imaging.decode import decode_sized
from spark_cnn.imaging.limits import DEFAULT_DECODE, DecodeOptions

_RESAMPLE = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


@dataclass(frozen=True)
class SizeRule:
    """How a variable-size model wants its images sized (see the module docstring).

    >>> SizeRule(min_size=320, max_size=640).target(height=1000, width=3000)
    (213, 640)
    """

    min_size: int | None = None
    max_size: int | None = None
    fixed: tuple[int, int] | None = None  # (height, width)
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        if self.fixed is not None:
            object.__setattr__(self, "fixed", tuple(int(v) for v in self.fixed))
            if len(self.fixed) != 2 or min(self.fixed) < 1:
                raise ConfigError(f"fixed input size {self.fixed}: expected (height, width), both positive")
        elif self.min_size is None or self.min_size < 1:
            raise ConfigError("a size rule needs a positive min_size (shorter side) or a fixed (height, width)")
        if self.max_size is not None and self.max_size < (self.min_size or 1):
            raise ConfigError(f"max_size {self.max_size} is below min_size {self.min_size}")
        if self.interpolation not in _RESAMPLE:
            raise ConfigError(f"interpolation {self.interpolation}: expected one of {', '.join(_RESAMPLE)}")

    def target(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) an image of this size is sent at."""
        if self.fixed is not None:
            return self.fixed
        short, long = min(height, width), max(height, width)
        if self.max_size is None:  # torchvision's Resize(min_size): the shorter side exactly, the other in proportion
            other = int(self.min_size * long / short)
            return (self.min_size, other) if height <= width else (other, self.min_size)
        scale = min(self.min_size / short, self.max_size / long)
        return max(1, math.floor(height * scale)), max(1, math.floor(width * scale))

    @property
    def decode_short_side(self) -> int:
        """The shorter side no sent image exceeds: JPEGs may decode at a reduced scale down to it (x headroom)."""
        return max(self.fixed) if self.fixed is not None else self.min_size

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SizeRule:
        return cls(**data)


def sized_pixels(data: bytes, rule: SizeRule, options: DecodeOptions = DEFAULT_DECODE
                 ) -> tuple[np.ndarray, tuple[int, int]]:
    """Image bytes -> (uint8 (h, w, 3) pixels at `rule`'s size, the upright source (height, width)). Decoding is
    classification's (guard rails, EXIF orientation, every mode to RGB); ImageError on a bad file."""
    image, box, (width, height) = decode_sized(data, options, min_short_side=rule.decode_short_side)
    return _resized(image, rule, height, width, box), (height, width)


def sized_rgb(rgb: np.ndarray, rule: SizeRule) -> tuple[np.ndarray, tuple[int, int]]:
    """Decoded RGB pixels (Spark's image source, NumPy arrays) -> the same as `sized_pixels`."""
    height, width = rgb.shape[:2]
    return _resized(Image.fromarray(rgb, mode="RGB"), rule, height, width, None), (height, width)


def _resized(image: Image.Image, rule: SizeRule, height: int, width: int, box) -> np.ndarray:
    new_h, new_w = rule.target(height, width)
    try:
        if box is not None or image.size != (new_w, new_h):
            image = image.resize((new_w, new_h), _RESAMPLE[rule.interpolation], box=box)
        pixels = np.asarray(image, dtype=np.uint8)
    except Exception as e:  # e.g. MemoryError: this image fails, the task goes on
        raise ImageError(f"cannot resize image: {type(e).__name__}: {e}") from e
    if pixels.shape != (new_h, new_w, 3):
        raise ImageError(f"resized image has shape {pixels.shape}, expected {(new_h, new_w, 3)}")
    return pixels

