"""Real test images: scikit-learn's sample photos and digits in several sizes and modes, broken files, and the
demo's digits as an ImageFolder subset."""

from __future__ import annotations

import io
import os
import shutil

import numpy as np
from PIL import Image


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    """`image` saved in format `fmt` with Pillow's save `options`."""
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def sample_photo(name: str = "china.jpg") -> Image.Image:
    """scikit-learn's sample photo `name` as a new PIL image (callers may crop and resize it)."""
    from sklearn.datasets import load_sample_image

    return Image.fromarray(load_sample_image(name))


def _jpeg(image: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def real_image_files() -> dict[str, bytes]:
    """Relative path -> bytes: scikit-learn's sample photos in several shapes and modes, nested folders."""
    from sklearn.datasets import load_digits, load_sample_image

    china = Image.fromarray(load_sample_image("china.jpg"))
    flower = Image.fromarray(load_sample_image("flower.jpg"))
    digits = load_digits()
    files = {
        "photos/china.jpg": _jpeg(china),
        "photos/flower.jpg": _jpeg(flower),
        "photos/portrait/china_tall.jpg": _jpeg(china.crop((100, 0, 380, 427))),
        "photos/small/flower_small.png": _png(flower.resize((160, 107))),
        "modes/flower_rgba.png": _png(flower.convert("RGBA").resize((300, 200))),
        "modes/china_gray.jpg": _jpeg(china.convert("L")),
    }
    for i in range(3):
        gray = np.round(digits.images[i] * (255.0 / 16.0)).astype(np.uint8)
        files[f"digits/{digits.target[i]}/{i:04d}.png"] = _png(Image.fromarray(gray, mode="L"))
    return files


def broken_files() -> dict[str, bytes]:
    from sklearn.datasets import load_sample_image

    whole = _jpeg(Image.fromarray(load_sample_image("china.jpg")))
    return {"broken/truncated.jpg": whole[: len(whole) // 3], "broken/notes.txt": b"not an image\n",
            "broken/empty.png": b""}


def digits_subset(demo_assets, root: str, per_class: int) -> str:
    """The first `per_class` digits of each class, copied into an ImageFolder tree under `root`."""
    for label in sorted(os.listdir(demo_assets.images)):
        os.makedirs(os.path.join(root, label))
        for name in sorted(os.listdir(os.path.join(demo_assets.images, label)))[:per_class]:
            shutil.copy(os.path.join(demo_assets.images, label, name), os.path.join(root, label, name))
    return root


def write_files(root: str, files: dict[str, bytes]) -> str:
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return root


# --- the decoding corpus (issue #5): real files from installed packages, and generated broken ones ----------

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif")
# Limits the corpus is run with: above every real file in it (the largest skimage image is retina.jpg,
# 1411x1411 = 2.0 MP; the largest file astronaut.png, 0.8 MB), below the two files made to exceed them.
CORPUS_MAX_PIXELS = 3_000_000
CORPUS_MAX_FILE_BYTES = 1_000_000


def skimage_data_files() -> dict[str, bytes]:
    """Every image file shipped in scikit-image's data folder: grayscale, RGB, RGBA PNGs, JPEGs, multi-page
    TIFFs (one planar float64 RGB), an animated GIF."""
    import skimage

    folder = os.path.join(os.path.dirname(skimage.__file__), "data")
    return {f"skimage/{name}": _read(os.path.join(folder, name)) for name in sorted(os.listdir(folder))
            if name.lower().endswith(IMAGE_EXTENSIONS)}


def sklearn_photo_files() -> dict[str, bytes]:
    """scikit-learn's sample photos, the JPEG files as shipped."""
    import sklearn.datasets

    folder = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images")
    return {f"sklearn/{name}": _read(os.path.join(folder, name)) for name in sorted(os.listdir(folder))
            if name.lower().endswith(IMAGE_EXTENSIONS)}


def corpus_broken_files() -> dict[str, bytes]:
    """Files that must each give a row with an error, under CORPUS_MAX_PIXELS / CORPUS_MAX_FILE_BYTES."""
    from sklearn.datasets import load_sample_image

    whole = _jpeg(Image.fromarray(load_sample_image("flower.jpg")))
    noise = np.random.default_rng(5).integers(0, 256, (640, 640, 3), dtype=np.uint8)  # incompressible
    return {
        "broken/truncated.jpg": whole[: len(whole) // 2],
        "broken/zero_bytes.jpg": b"",
        "broken/random_bytes.jpg": np.random.default_rng(7).bytes(4096),
        "broken/text_named.jpg": b"this is a text file, not a JPEG\n" * 20,
        "broken/too_many_pixels.png": _png(Image.new("L", (2000, 1600), 128)),  # 3.2 MP, a few KB
        "broken/too_many_bytes.png": _png(Image.fromarray(noise)),  # 1.2 MB, only 0.4 MP
    }


def decoding_corpus() -> dict[str, bytes]:
    return {**skimage_data_files(), **sklearn_photo_files(), **corpus_broken_files()}


def png_bomb(width: int, height: int) -> bytes:
    """A valid grayscale PNG of `width` x `height` zeros, compressed ~1000:1: a decompression bomb."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    compressor = zlib.compressobj(9)
    row = b"\0" * (width + 1)  # filter byte + pixels
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
