"""Real test images: scikit-learn's sample photos and digits in several sizes and modes, and broken files."""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image


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


def write_files(root: str, files: dict[str, bytes]) -> str:
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return root
