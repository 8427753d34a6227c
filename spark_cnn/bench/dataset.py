"""The `spark-cnn bench` dataset: JPEG crops of the photos scikit-image and scikit-learn ship, made once, cached.

2,048 distinct 320x320 JPEGs are cut at random offsets from the colour photos both packages install (no
download); a detector's set (DETECT_SHAPES) cycles through several shapes, so its images reach the model's size
rule at different sizes and orientations. A run that needs more images than that reads the same files again
through hard links in further folders (`pass1/`, `pass2/`, ...): the same bytes, no extra disk, and every variant
sees the same inputs.
"""

from __future__ import annotations

import functools
import io
import os

import numpy as np
from PIL import Image

from spark_cnn.errors import missing_extra
from spark_cnn.imaging.samples import BENCH_IMAGE_SIZE, JPEG_QUALITY

DATASET_IMAGES = 2048
# Bump when the images change, so an old cache is never mistaken for the new set.
DATASET_VERSION = 1
DEFAULT_DATA_DIR = os.path.join("~", ".cache", "spark_cnn", "bench")
_SKIMAGE_PHOTOS = ("astronaut", "coffee", "rocket", "hubble_deep_field", "retina")
_SKLEARN_PHOTOS = ("china.jpg", "flower.jpg")
_DONE_MARKER = "_COMPLETE"  # written last: a folder without it was interrupted and is rebuilt
SQUARE = ((BENCH_IMAGE_SIZE, BENCH_IMAGE_SIZE),)
# (height, width) of a detector's bench images: square, landscape, portrait and a larger landscape; every source
# photo holds each (the smallest, scikit-image's coffee, is 400 x 600).
DETECT_SHAPES = ((320, 320), (240, 427), (400, 300), (360, 480))


@functools.cache  # decoding them (PNGs up to 1411 x 1411) costs seconds; every set is cut from the same photos
def source_photos() -> dict[str, np.ndarray]:
    """Colour photos (H, W, 3) uint8 at least BENCH_IMAGE_SIZE on each side, by name (shared: do not modify)."""
    photos = {}
    try:
        import skimage.data
    except ImportError:
        skimage = None
    if skimage is not None:
        for name in _SKIMAGE_PHOTOS:
            try:
                photos[f"skimage:{name}"] = getattr(skimage.data, name)()
            except Exception:  # an older scikit-image without this photo, or one that must be downloaded
                continue
    try:
        from sklearn.datasets import load_sample_image
    except ImportError as e:
        raise missing_extra("scikit-learn", "bench", "the benchmark's photos") from e

    for name in _SKLEARN_PHOTOS:
        photos[f"sklearn:{name}"] = load_sample_image(name)
    return {name: photo for name, photo in photos.items()
            if photo.ndim == 3 and photo.shape[2] == 3 and min(photo.shape[:2]) >= BENCH_IMAGE_SIZE}


def make_jpegs(count: int, seed: int = 0, shapes: tuple[tuple[int, int], ...] = SQUARE) -> list[bytes]:
    """`count` JPEGs cut at random offsets, their (height, width) cycling through `shapes`, photos that hold the
    shape taken in turn."""
    rng = np.random.default_rng(seed)
    photos = list(source_photos().values())
    files = []
    for i in range(count):
        height, width = shapes[i % len(shapes)]
        fitting = [p for p in photos if p.shape[0] >= height and p.shape[1] >= width]
        if not fitting:
            raise ValueError(f"no source photo holds a {height}x{width} crop")
        photo = fitting[i % len(fitting)]
        top = int(rng.integers(0, photo.shape[0] - height + 1))
        left = int(rng.integers(0, photo.shape[1] - width + 1))
        buf = io.BytesIO()
        Image.fromarray(photo[top:top + height, left:left + width]).save(buf, format="JPEG", quality=JPEG_QUALITY)
        files.append(buf.getvalue())
    return files


def _shapes_tag(shapes: tuple[tuple[int, int], ...]) -> str:
    """'' for the square set (its folders keep their names), else '-' and the shapes, e.g. '-320x320-240x427'."""
    return "" if tuple(shapes) == SQUARE else "".join(f"-{h}x{w}" for h, w in shapes)


def dataset_dir(data_dir: str = DEFAULT_DATA_DIR, shapes: tuple[tuple[int, int], ...] = SQUARE) -> str:
    """The folder of DATASET_IMAGES JPEGs of `shapes`, generated on first use."""
    folder = os.path.join(os.path.expanduser(data_dir),
                          f"images-v{DATASET_VERSION}-{DATASET_IMAGES}{_shapes_tag(shapes)}")
    if os.path.exists(os.path.join(folder, _DONE_MARKER)):
        return folder
    os.makedirs(folder, exist_ok=True)
    for i, data in enumerate(make_jpegs(DATASET_IMAGES, shapes=shapes)):
        with open(os.path.join(folder, f"img_{i:05d}.jpg"), "wb") as f:
            f.write(data)
    open(os.path.join(folder, _DONE_MARKER), "w").close()
    return folder


def dataset_files(folder: str) -> list[str]:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".jpg"))


def input_dir(images: int, data_dir: str = DEFAULT_DATA_DIR, shapes: tuple[tuple[int, int], ...] = SQUARE) -> str:
    """A folder holding exactly `images` files: the dataset's first files, then passes over it again as
    hard links (`pass1/`, ...). Spark reads it recursively; the plain loops list it the same way."""
    source = dataset_dir(data_dir, shapes)
    files = dataset_files(source)
    folder = os.path.join(os.path.expanduser(data_dir), f"input-v{DATASET_VERSION}-{images}{_shapes_tag(shapes)}")
    if os.path.exists(os.path.join(folder, _DONE_MARKER)):
        return folder
    for i in range(images):
        part = os.path.join(folder, f"pass{i // len(files)}")
        os.makedirs(part, exist_ok=True)
        target = os.path.join(part, os.path.basename(files[i % len(files)]))
        if not os.path.exists(target):
            try:
                os.link(files[i % len(files)], target)
            except OSError:  # a filesystem without hard links: copy
                with open(files[i % len(files)], "rb") as src, open(target, "wb") as dst:
                    dst.write(src.read())
    open(os.path.join(folder, _DONE_MARKER), "w").close()
    return folder


def input_files(folder: str) -> list[str]:
    """Every image under `folder`, in a fixed order (what Spark's recursive listing reads too)."""
    found = []
    for root, _dirs, names in os.walk(folder):
        found += [os.path.join(root, n) for n in names if n.endswith(".jpg")]
    return sorted(found)
