"""`spark-cnn bench-scale`'s images: N small real PNGs (scikit-learn's handwritten digits) in nested folders.

`INPUT/<digit>/<group>/<index>.png`: the class folder gives each file its true label (ImageFolder layout), and
each group of INDICES_PER_GROUP consecutive files is split over the ten class folders, so folders hold ~100
files and a million files make 10,000 folders (listing walks many folders, as a landing zone's dated ones).
The 1,797 digits are encoded once; the files are written by a pool of processes (one slice of the indices
each) and cached per N under the data dir, with a marker written last, so a rerun never regenerates and an
interrupted one is finished (files already there are skipped).
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ProcessPoolExecutor

from spark_cnn.errors import missing_extra

# Consecutive files per group (split over the class folders): ~100 files per folder, a folder per 100 files, so
# the listing's cost per folder shows as well as its cost per file.
INDICES_PER_GROUP = 1000
SCALE_DATA_VERSION = 1  # bump when the files change, so an old cache is never taken for the new set
_DONE_MARKER = "_COMPLETE"
CLASSES = 10


def digit_pngs() -> list[bytes]:
    """The 1,797 8x8 digits of scikit-learn as grayscale PNGs (0-16 scaled to 0-255); digit i is `i % 10`
    (the data set's own order is kept; `digit_labels` gives the true labels)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise missing_extra("scikit-learn", "bench", "bench-scale's images") from e
    from PIL import Image

    pngs = []
    for image in load_digits().images:
        buf = io.BytesIO()
        Image.fromarray((image * (255 / 16)).round().astype("uint8"), mode="L").save(buf, format="PNG")
        pngs.append(buf.getvalue())
    return pngs


def digit_labels() -> list[int]:
    from sklearn.datasets import load_digits

    return [int(t) for t in load_digits().target]


def file_path(root: str, index: int, label: int) -> str:
    """Where file `index` of class `label` lives: `root/<label>/<group>/<index>.png`."""
    return os.path.join(root, str(label), f"g{index // INDICES_PER_GROUP:05d}", f"{index:08d}.png")


def scale_dir(files: int, data_dir: str) -> str:
    return os.path.join(os.path.expanduser(data_dir), f"scale-v{SCALE_DATA_VERSION}-{files}")


def _write_slice(root: str, start: int, stop: int) -> int:
    pngs, labels = digit_pngs(), digit_labels()
    made = set()
    written = 0
    for index in range(start, stop):
        digit = index % len(pngs)
        path = file_path(root, index, labels[digit])
        folder = os.path.dirname(path)
        if folder not in made:
            os.makedirs(folder, exist_ok=True)
            made.add(folder)
        if os.path.exists(path):  # an interrupted generation: kept
            continue
        with open(path, "wb") as f:
            f.write(pngs[digit])
        written += 1
    return written


def slices(files: int, workers: int) -> list[tuple[int, int]]:
    """[start, stop) index ranges covering `files`, one per worker, whole folders each where possible.

    >>> slices(2500, 2)
    [(0, 2000), (2000, 2500)]
    """
    folders = -(-files // INDICES_PER_GROUP)
    per = -(-folders // max(1, workers)) * INDICES_PER_GROUP
    return [(start, min(files, start + per)) for start in range(0, files, per)]


def scale_input(files: int, data_dir: str, *, workers: int | None = None, log=print) -> str:
    """The folder of `files` digit PNGs, generated on first use (in `workers` processes) and cached."""
    root = scale_dir(files, data_dir)
    if os.path.exists(os.path.join(root, _DONE_MARKER)):
        return root
    os.makedirs(root, exist_ok=True)
    workers = workers or os.cpu_count() or 1
    log(f"generating {files:,} PNGs under {root} ({workers} processes) ...")
    parts = slices(files, workers)
    if len(parts) == 1:
        _write_slice(root, *parts[0])
    else:
        with ProcessPoolExecutor(len(parts)) as pool:
            list(pool.map(_write_slice, [root] * len(parts), *zip(*parts, strict=True)))
    open(os.path.join(root, _DONE_MARKER), "w").close()
    return root
