"""Benchmark images: JPEG crops cut from photos shipped in installed packages, never committed.

scikit-learn's sample photos are used when scikit-learn is installed; a machine without it (the GPU host
has only torch, torchvision and pyarrow) gets procedurally drawn images of the same size instead.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

BENCH_IMAGE_SIZE = 320  # px, square: the size the Spark benchmark uses too
JPEG_QUALITY = 90


def _source_photos() -> list[np.ndarray]:
    try:
        from sklearn.datasets import load_sample_image
    except ImportError:
        rng = np.random.default_rng(0)
        y, x = np.mgrid[0:480, 0:640]
        return [np.stack([(x * (i + 1) // 3) % 256, (y * (i + 2) // 3) % 256,
                          rng.integers(0, 256, (480, 640))], axis=-1).astype(np.uint8) for i in range(2)]
    return [load_sample_image("china.jpg"), load_sample_image("flower.jpg")]


def bench_jpegs(count: int, seed: int = 0, shapes: tuple[tuple[int, int], ...] = ((BENCH_IMAGE_SIZE,) * 2,)
                ) -> list[bytes]:
    """`count` JPEG crops at random offsets in the source photos, their (height, width) cycling through `shapes`
    (default: BENCH_IMAGE_SIZE px squares)."""
    rng = np.random.default_rng(seed)
    photos = _source_photos()
    files = []
    for i in range(count):
        photo = photos[i % len(photos)]
        height, width = shapes[i % len(shapes)]
        top = int(rng.integers(0, photo.shape[0] - height + 1))
        left = int(rng.integers(0, photo.shape[1] - width + 1))
        crop = Image.fromarray(photo[top:top + height, left:left + width])
        buf = io.BytesIO()
        crop.save(buf, format="JPEG", quality=JPEG_QUALITY)
        files.append(buf.getvalue())
    return files


# Long sides of the large photos: 2400 to 4000 px, the range of phone and camera photos (>= 2000 px).
LARGE_PHOTO_LONG_SIDES = (2400, 3000, 4000)


def large_photo_jpegs(count: int) -> list[bytes]:
    """`count` large JPEGs: the source photos upscaled (bicubic) to LARGE_PHOTO_LONG_SIDES and re-encoded.

    Upscaled photos carry less fine detail than a camera's own photo of that size, so they compress better and
    reduced-DCT decoding loses less on them; they stand in for camera photos, which no installed package ships.
    """
    photos = [Image.fromarray(photo) for photo in _source_photos()]
    distinct = []
    for long_side in LARGE_PHOTO_LONG_SIDES:
        for photo in photos:
            scale = long_side / max(photo.size)
            large = photo.resize((round(photo.width * scale), round(photo.height * scale)), Image.BICUBIC)
            buf = io.BytesIO()
            large.save(buf, format="JPEG", quality=JPEG_QUALITY)
            distinct.append(buf.getvalue())
            if len(distinct) == count:
                return distinct
    return [distinct[i % len(distinct)] for i in range(count)]
