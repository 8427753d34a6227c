"""Decoding inside the sidecar, for requests that carry image files instead of pixels.

Three places can decode (`--decode`): the Spark tasks (parallel processes; they send uint8 pixels), the
sidecar's connection threads (`sidecar`: Pillow, which releases the GIL while it decodes and resizes), or the
GPU (`gpu`: nvJPEG through torchvision.io.decode_jpeg, batched, then resize and crop on the device). Files the
GPU cannot take (not JPEG, EXIF-rotated, over the guard rails, or rejected by nvJPEG) fall back to Pillow, one by
one. Host decoding is the Spark tasks' own (imaging.decode), under the guard rails the client sent in its HELLO
(`decode_options`: --max-pixels, --max-file-bytes), so a file gives the same pixels or error in either place.

The GPU's bilinear antialiased resize is not bit-identical to Pillow's: on photos the two differ by at most
one grey level, 0.15 on average (tests/unit/sidecar/test_batch_decode.py measures it).
"""

from __future__ import annotations

import io

import numpy as np
import torch

from spark_cnn.errors import ImageError
from spark_cnn.imaging.decode import check_file_size, check_pixels
from spark_cnn.imaging.limits import DEFAULT_DECODE, DecodeOptions
from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels
from spark_cnn.task.run_options import DECODE_PLACES  # noqa: F401  (re-exported: where decoding can happen)

JPEG_MAGIC = b"\xff\xd8\xff"
EXIF_ORIENTATION_TAG = 0x0112


def decode_on_host(images: list[bytes], prep: Preprocessing, options: DecodeOptions = DEFAULT_DECODE
                   ) -> tuple[np.ndarray, list[str | None]]:
    """Pixels of the images that decode, stacked, and one error (or None) per input image.

    The same decoder and guard rails as the Spark tasks' (imaging.decode), so a file gives the same pixels
    or the same error wherever it is decoded."""
    pixels, errors = [], []
    for data in images:
        try:
            pixels.append(preprocess_pixels(data, prep, options))
            errors.append(None)
        except ImageError as e:
            errors.append(str(e))
    stacked = np.stack(pixels) if pixels else np.zeros((0, *prep.pixel_shape), np.uint8)
    return stacked, errors


def gpu_decode_works(device: torch.device) -> bool:
    """Whether nvJPEG decodes on `device` here (torchvision built with it, a driver that accepts it)."""
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 100, 50)).save(buf, format="JPEG")
    try:
        decode_jpeg(torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8), mode=ImageReadMode.RGB,
                    device=device)
        return True
    except Exception:
        return False


def resize_crop_tensor(image: torch.Tensor, prep: Preprocessing) -> torch.Tensor:
    """(3, H, W) uint8 on any device -> (crop, crop, 3) uint8: shorter side to `resize`, then centre crop."""
    _, height, width = image.shape
    short, long = min(height, width), max(height, width)
    new_long = int(prep.resize * long / short)
    size = (prep.resize, new_long) if height <= width else (new_long, prep.resize)
    if short != prep.resize:
        resized = torch.nn.functional.interpolate(image[None].float(), size=size, mode=prep.interpolation,
                                                  antialias=True, align_corners=False)[0]
        image = resized.round_().clamp_(0, 255).to(torch.uint8)
    top = int(round((image.shape[1] - prep.crop) / 2.0))
    left = int(round((image.shape[2] - prep.crop) / 2.0))
    return image[:, top:top + prep.crop, left:left + prep.crop].permute(1, 2, 0)


def _gpu_can_take(data: bytes, options: DecodeOptions = DEFAULT_DECODE) -> bool:
    """A JPEG without an EXIF rotation, within the guard rails (nvJPEG ignores EXIF; such files, and files the
    guard rails refuse, take the Pillow path, which applies the rotation or gives the error)."""
    if not data.startswith(JPEG_MAGIC):
        return False
    from PIL import Image

    try:
        check_file_size(data, options)
        with Image.open(io.BytesIO(data)) as image:
            check_pixels(*image.size, options)
            return image.getexif().get(EXIF_ORIENTATION_TAG, 1) == 1
    except Exception:
        return False  # let Pillow produce the error message


def decode_on_gpu(images: list[bytes], prep: Preprocessing, device: torch.device,
                  options: DecodeOptions = DEFAULT_DECODE) -> tuple[torch.Tensor, list[str | None]]:
    """Like decode_on_host, but the pixels end on `device`, decoded there where possible."""
    from torchvision.io import ImageReadMode, decode_jpeg

    decoded: dict[int, torch.Tensor] = {}
    gpu_rows = [i for i, data in enumerate(images) if _gpu_can_take(data, options)]
    if gpu_rows:
        files = [torch.frombuffer(bytearray(images[i]), dtype=torch.uint8) for i in gpu_rows]
        try:
            decoded = dict(zip(gpu_rows, decode_jpeg(files, mode=ImageReadMode.RGB, device=device), strict=True))
        except RuntimeError:  # one bad file fails the batched call: retry one by one
            for i, data in zip(gpu_rows, files, strict=True):
                try:
                    decoded[i] = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
                except RuntimeError:
                    pass
    pixels, errors = [], []
    for i, data in enumerate(images):
        try:
            if i in decoded:
                pixels.append(resize_crop_tensor(decoded[i], prep))
            else:
                pixels.append(torch.tensor(preprocess_pixels(data, prep, options), device=device))
            errors.append(None)
        except ImageError as e:
            errors.append(str(e))
    stacked = torch.stack(pixels) if pixels else torch.zeros((0, *prep.pixel_shape), dtype=torch.uint8,
                                                            device=device)
    return stacked, errors
