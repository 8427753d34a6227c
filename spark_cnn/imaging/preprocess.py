"""Decode image bytes and bring them to the model's input size, as uint8 pixels.

This runs in Spark tasks and in the sidecar's decoding threads, so it needs only Pillow and NumPy (no torch).
Decoding itself, with its guard rails, lives in imaging.decode. The geometry follows torchvision's
`Resize(shorter_side)` + `CenterCrop(size)` on PIL images exactly, so results match a plain torchvision pipeline.
Scaling to [0, 1] and mean/std normalisation happen later, on the device (see `imaging.tensors`), because
uint8 pixels are 4x smaller than float32 on the wire.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image

from spark_cnn.errors import ConfigError, ImageError
from spark_cnn.imaging.crop_window import resize_crop
from spark_cnn.imaging.decode import decode_for_resize, decode_rgb
from spark_cnn.imaging.limits import DEFAULT_DECODE, DecodeOptions

__all__ = ["DEFAULT_CROP", "DEFAULT_RESIZE", "IMAGENET_MEAN", "IMAGENET_STD", "INTERPOLATIONS", "Preprocessing",
           "center_crop", "center_crop_origin", "decode_rgb", "preprocess_pixels", "resize_and_crop",
           "resize_shorter_side", "shorter_side_size"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# torchvision's classification weights are evaluated at resize 256 / crop 224.
DEFAULT_RESIZE = 256
DEFAULT_CROP = 224
# Resampling filters, as torchvision's InterpolationMode values name them (its weights ask for one of these).
INTERPOLATIONS = ("bilinear", "bicubic")
_RESAMPLE = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


@dataclass(frozen=True)
class Preprocessing:
    """How an image becomes model input: RGB, shorter side to `resize` (with `interpolation`), centre crop
    `crop`, then mean/std.

    >>> Preprocessing(resize=32, crop=32, mean=(0.5,) * 3, std=(0.5,) * 3).crop
    32
    """

    resize: int = DEFAULT_RESIZE
    crop: int = DEFAULT_CROP
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = INTERPOLATIONS[0]

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ConfigError(f"--interpolation {self.interpolation}: expected one of {', '.join(INTERPOLATIONS)}")
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))
        if self.resize < 1 or self.crop < 1:
            raise ConfigError(f"resize and crop must be positive pixel sizes, got resize={self.resize} "
                              f"crop={self.crop}")
        if self.crop > self.resize:
            raise ConfigError(f"crop ({self.crop}) must not exceed resize ({self.resize}): the centre crop is "
                              "taken from the resized image")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ConfigError(f"mean and std need three values (R, G, B), got mean={self.mean} std={self.std}")
        if min(self.std) <= 0:
            raise ConfigError(f"std values must be positive, got {self.std}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Preprocessing:
        return cls(**data)

    @property
    def pixel_shape(self) -> tuple[int, int, int]:
        """Shape of one preprocessed image as sent to the sidecar: (height, width, channels), uint8."""
        return (self.crop, self.crop, 3)


def shorter_side_size(width: float, height: float, size: int) -> tuple[int, int]:
    """(width, height) after resizing so the shorter side is `size`, with torchvision's rounding."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def resize_shorter_side(image: Image.Image, size: int, box: tuple[float, ...] | None = None,
                        interpolation: str = INTERPOLATIONS[0]) -> Image.Image:
    """Resize so the shorter side is `size`, as torchvision's `Resize(size, interpolation)` does on a PIL image
    (Pillow's filter, which is antialiased).

    box: the part of `image` that holds the picture (imaging.decode.decode_for_resize); the new size is
    computed from its width and height, as from the full-size picture's.
    """
    width, height = _picture_size(image, box)
    if min(width, height) == size and box is None:
        return image
    return image.resize(shorter_side_size(width, height, size), _RESAMPLE[interpolation], box=box)


def _picture_size(image: Image.Image, box: tuple[float, ...] | None) -> tuple[float, float]:
    """The picture's width and height: its box's (a reduced-DCT decode) or the whole image's."""
    return (box[2] - box[0], box[3] - box[1]) if box is not None else image.size


def center_crop_origin(width: int, height: int, size: int) -> tuple[int, int]:
    """(left, top) of the centre `size` x `size` square, with torchvision's rounding."""
    return int(round((width - size) / 2.0)), int(round((height - size) / 2.0))


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """Take the centre `size` x `size` square, with torchvision's rounding."""
    left, top = center_crop_origin(*image.size, size)
    return image.crop((left, top, left + size, top + size))


def resize_and_crop(image: Image.Image, prep: Preprocessing, box: tuple[float, ...] | None = None) -> Image.Image:
    """`center_crop(resize_shorter_side(...))`, byte for byte, resizing only what the crop keeps where Pillow's
    arithmetic allows it (imaging.crop_window; the time saved: docs/benchmarks.md, "Resizing only the crop")."""
    width, height = _picture_size(image, box)
    if min(width, height) == prep.resize and box is None:
        return center_crop(image, prep.crop)
    resized = shorter_side_size(width, height, prep.resize)
    plan = resize_crop(image.size, box, resized, center_crop_origin(*resized, prep.crop), prep.crop)
    out = image.resize(plan.size, _RESAMPLE[prep.interpolation], box=plan.box)
    if plan.size == (prep.crop, prep.crop):
        return out
    left, top = plan.offset
    return out.crop((left, top, left + prep.crop, top + prep.crop))


def preprocess_pixels(data: bytes, prep: Preprocessing, options: DecodeOptions = DEFAULT_DECODE) -> np.ndarray:
    """Image bytes -> uint8 array of shape `prep.pixel_shape` (H, W, RGB). Raises ImageError on bad input.

    Large JPEGs decode at a reduced DCT scale (options.reduced_dct): the result then differs from a full
    decode + resize by the small amounts docs/benchmarks.md gives; everything else matches torchvision exactly.
    """
    image, box = decode_for_resize(data, options, min_short_side=prep.resize)
    try:
        image = resize_and_crop(image, prep, box)
        pixels = np.asarray(image, dtype=np.uint8)
    except Exception as e:  # e.g. MemoryError: this image fails, the task goes on
        raise ImageError(f"cannot resize image: {type(e).__name__}: {e}") from e
    if pixels.shape != prep.pixel_shape:  # a guard against a mode Pillow converted unexpectedly
        raise ImageError(f"preprocessed image has shape {pixels.shape}, expected {prep.pixel_shape}")
    return pixels
