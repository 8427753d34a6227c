"""Resize only the part of a picture that the centre crop keeps, with the same bytes as resizing all of it.

Pillow computes each output pixel of a resize from its own filter window, and `Image.resize(size, box=...)`
resizes just a box of the source. Resizing the crop's box to the crop's size therefore skips the pixels that
the crop would throw away: a square picture going to 256 then 224 computes 224 x 224 pixels instead of 256 x 256;
a photo, whose longer side is usually resized whole (below), saves the rows its crop drops. It gives the same
bytes only where Pillow's arithmetic gives every kept pixel the same filter window
in both ways. Pillow 13 (`libImaging/Resample.c`) takes the box as float32, the scale as `(in1 - in0) / out`,
each output pixel's centre as `in0 + (x + 0.5) * scale` in doubles, and runs the vertical pass first when the
height shrinks more than twice as much as the width. Older Pillows always run the horizontal pass first, and
the checks below hold for them too: both ways then take the same order.

So an axis is windowed only where all of that is exact arithmetic in float32 and in doubles, and where the
pass order stays the same. Then no rounding can differ. Otherwise the axis is resized whole and cropped after,
as before. The shorter side always qualifies (its scale is `short / resize`, a binary fraction for the usual
resize of 256), and so does a square picture's longer side.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

HALF = Fraction(1, 2)


@dataclass(frozen=True)
class ResizeCrop:
    """One `Image.resize(size, box=box)` then a crop at `offset` to the crop's size (none when `size` is it)."""

    size: tuple[int, int]
    box: tuple[float, float, float, float]
    offset: tuple[int, int]


def resize_crop(image_size: tuple[int, int], box: tuple[float, ...] | None, resized: tuple[int, int],
                origin: tuple[int, int], crop: int) -> ResizeCrop:
    """How to get the `crop` x `crop` square at `origin` of the picture in `box` (all of the image if None)
    resized to `resized`, resizing only what the crop keeps where that gives the same bytes.

    >>> resize_crop((320, 320), None, (256, 256), (16, 16), 224)  # both axes windowed
    ResizeCrop(size=(224, 224), box=(20.0, 20.0, 300.0, 300.0), offset=(0, 0))
    >>> resize_crop((384, 303), None, (324, 256), (50, 16), 224).offset  # 384/324 is inexact: x resized whole
    (50, 0)
    """
    full = box if box is not None else (0.0, 0.0, float(image_size[0]), float(image_size[1]))
    x = _axis_window(float(full[0]), float(full[2]), resized[0], origin[0], crop)
    y = _axis_window(float(full[1]), float(full[3]), resized[1], origin[1], crop)
    size = (crop if x else resized[0], crop if y else resized[1])
    if _horizontal_first(image_size, size) != _horizontal_first(image_size, resized):
        x = y = None  # the other pass order rounds its intermediate image differently
        size = resized
    return ResizeCrop(size=size,
                      box=(x[0] if x else full[0], y[0] if y else full[1], x[1] if x else full[2],
                           y[1] if y else full[3]),
                      offset=(0 if x else origin[0], 0 if y else origin[1]))


def _horizontal_first(image_size: tuple[int, int], out: tuple[int, int]) -> bool:
    """Pillow's pass order: vertical first when the height shrinks more than twice as much as the width."""
    shrink_w, shrink_h = image_size[0] - out[0], image_size[1] - out[1]
    return not (shrink_h > 0 and shrink_h > shrink_w * 2)


@lru_cache(maxsize=16384)  # datasets have few picture sizes; a check costs ~0.1 ms of Fractions
def _axis_window(start: float, end: float, resized: int, first: int, count: int) -> tuple[float, float] | None:
    """The source range of output pixels first..first+count-1 of resizing [start, end) to `resized` pixels,
    where Pillow computes them from that range with the same windows as from the whole; else None."""
    start32, end32 = _float32(start), _float32(end)
    if start32 is None or end32 is None:
        return None
    scale = (end32 - start32) / resized
    lo, hi = start32 + first * scale, start32 + (first + count) * scale
    # float32 box edges, float32 differences, and a scale float32 holds (older Pillows divide in float32)
    if any(_float32(v) is None for v in (end32 - start32, scale, lo, hi, hi - lo)):
        return None
    for x in (0, count - 1):  # centres grow with x and share a power-of-two denominator: the ends bound them
        if not all(_is_double(v) for v in ((x + HALF) * scale, lo + (x + HALF) * scale,
                                          (first + x + HALF) * scale, start32 + (first + x + HALF) * scale)):
            return None
    return float(lo), float(hi)


def _float32(value: float | Fraction) -> Fraction | None:
    """`value` as a Fraction if float32 holds it exactly, else None."""
    try:
        rounded = struct.unpack("f", struct.pack("f", float(value)))[0]
    except OverflowError:
        return None
    return Fraction(rounded) if Fraction(rounded) == Fraction(value) else None


def _is_double(value: Fraction) -> bool:
    return Fraction(float(value)) == value
