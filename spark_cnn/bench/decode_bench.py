"""Reading-side throughput: decode + preprocess images/s on one core, per decoder configuration.

Every case runs the same function the Spark tasks run (`preprocess_pixels`: decode, resize, centre crop) in
this one process and thread, over the same files, for a fixed time; the cases take turns image by image (since
2026-12-07; before, one second each), so drift on a shared machine spreads over all of them. The rate per core is
images per CPU second of this thread, which other processes on a shared machine disturb far less than wall
time; the wall-clock rate is reported beside it. Each case's pixels are also compared with the full decode's (Pillow,
no DCT scaling): the tolerance the reduced decoders stay within.

One more case, `reduced_resize_whole`, decodes as `reduced` does but resizes the whole picture before cropping
(the product's way until 2026-12-07): beside `reduced`, it shows what resizing only the crop saves
(imaging.crop_window), and its largest pixel difference from `reduced` (`max_diff_vs_reduced`, 0 when both
give the same bytes) that nothing else changed.
"""

from __future__ import annotations

import io
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image

from spark_cnn.errors import ConfigError
from spark_cnn.imaging import fastjpeg
from spark_cnn.imaging.decode import dct_scale, decode_for_resize
from spark_cnn.imaging.limits import DecodeOptions
from spark_cnn.imaging.preprocess import Preprocessing, center_crop, preprocess_pixels, resize_shorter_side
from spark_cnn.imaging.samples import bench_jpegs, large_photo_jpegs

# The cases, in the order they run and print. `full` is the reference the others are compared with.
CASES = {
    "full": DecodeOptions(reduced_dct=False, jpeg_decoder="pillow"),
    "reduced": DecodeOptions(reduced_dct=True, jpeg_decoder="pillow"),
    "reduced_headroom1": DecodeOptions(reduced_dct=True, jpeg_decoder="pillow", dct_headroom=1),
    "simplejpeg_full": DecodeOptions(reduced_dct=False, jpeg_decoder="simplejpeg"),
    "simplejpeg_reduced": DecodeOptions(reduced_dct=True, jpeg_decoder="simplejpeg"),
}
FAST_CASES = ("simplejpeg_full", "simplejpeg_reduced")
RESIZE_WHOLE_CASE = "reduced_resize_whole"


def _resize_whole(data: bytes, prep: Preprocessing, options: DecodeOptions) -> np.ndarray:
    """preprocess_pixels as it was before resizing only the crop: the whole picture resized, then cropped."""
    image, box = decode_for_resize(data, options, min_short_side=prep.resize)
    return np.asarray(center_crop(resize_shorter_side(image, prep.resize, box, prep.interpolation), prep.crop))


@dataclass(frozen=True)
class DecodeBenchConfig:
    images: int = 12          # files per image set (the large set has 6 distinct photos, then repeats)
    seconds: float = 2.0      # measured seconds per case and round (the cases take turns image by image)
    rounds: int = 2           # each round runs every case once
    resize: int = 256
    crop: int = 224
    sets: tuple[str, ...] = ("bench_320", "large")

    def __post_init__(self) -> None:
        if self.images < 1 or self.seconds <= 0 or self.rounds < 1:
            raise ConfigError("--images, --seconds and --rounds must be positive")
        unknown = set(self.sets) - set(IMAGE_SETS)
        if unknown or not self.sets:
            raise ConfigError(f"--sets {','.join(self.sets)}: expected some of {', '.join(IMAGE_SETS)}")


IMAGE_SETS = {"bench_320": bench_jpegs, "large": large_photo_jpegs}


def machine_info() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}; {os.cpu_count()} CPU cores; 1 core used"


def _round(files: list[bytes], prep: Preprocessing, cases: dict[str, tuple[Callable, DecodeOptions]],
           seconds: float, counts: dict[str, np.ndarray]) -> None:
    """One round: every case on each file in turn (the order rotated from file to file), until each case has had
    about `seconds` of wall time, adding images, wall and CPU seconds to `counts`. Taking the cases image by image
    pairs them within milliseconds, so a host whose speed changes from one second to the next (a shared guest)
    slows them all alike."""
    names = list(cases)
    deadline = time.perf_counter() + seconds * len(names)
    turn = 0
    while time.perf_counter() < deadline:
        for data in files:
            shift = turn % len(names)
            turn += 1
            for name in names[shift:] + names[:shift]:
                preprocess, options = cases[name]
                started, cpu_started = time.perf_counter(), time.thread_time()
                preprocess(data, prep, options)
                counts[name] += (1, time.perf_counter() - started, time.thread_time() - cpu_started)


def _differences(files: list[bytes], prep: Preprocessing, options: DecodeOptions,
                 reference: list[np.ndarray], preprocess: Callable = preprocess_pixels) -> dict:
    diffs = np.concatenate([np.abs(preprocess(data, prep, options).astype(np.int16) - ref).ravel()
                            for data, ref in zip(files, reference, strict=True)])
    return {"mean_diff": round(float(diffs.mean()), 3), "p99_diff": float(np.percentile(diffs, 99)),
            "max_diff": int(diffs.max())}


def run_decode_bench(config: DecodeBenchConfig) -> dict:
    prep = Preprocessing(resize=config.resize, crop=config.crop)
    cases = {name: options for name, options in CASES.items() if name not in FAST_CASES or fastjpeg.available()}
    cases[RESIZE_WHOLE_CASE] = CASES["reduced"]
    preprocess = {name: _resize_whole if name == RESIZE_WHOLE_CASE else preprocess_pixels for name in cases}
    results = {}
    for set_name in config.sets:
        files = IMAGE_SETS[set_name](config.images)
        sizes = sorted({Image.open(io.BytesIO(data)).size for data in files})
        reference = [preprocess_pixels(data, prep, CASES["full"]).astype(np.int16) for data in files]
        counts = {name: np.zeros(3) for name in cases}  # images, wall s, CPU s
        for _ in range(config.rounds):
            _round(files, prep, {name: (preprocess[name], options) for name, options in cases.items()},
                   config.seconds, counts)
        full_rate = counts["full"][0] / counts["full"][2]
        set_result = {"image_sizes": [f"{w}x{h}" for w, h in sizes], "files": len(files),
                      "mean_file_bytes": int(np.mean([len(d) for d in files])), "cases": {}}
        for name, options in cases.items():
            images, wall, cpu = counts[name]
            rate = images / cpu
            scales = sorted({dct_scale(w, h, prep.resize, options.dct_headroom) if options.reduced_dct else 1
                             for w, h in sizes})
            set_result["cases"][name] = {"images_per_cpu_s": round(rate, 1), "vs_full": round(rate / full_rate, 2),
                                         "images_per_wall_s": round(images / wall, 1),
                                         "dct_scales": scales,
                                         **_differences(files, prep, options, reference, preprocess[name])}
        whole = set_result["cases"][RESIZE_WHOLE_CASE]
        whole["max_diff_vs_reduced"] = max(
            int(np.abs(_resize_whole(data, prep, CASES["reduced"]).astype(np.int16)
                       - preprocess_pixels(data, prep, CASES["reduced"])).max()) for data in files)
        results[set_name] = set_result
    return {"machine": machine_info(), "config": asdict(config), "simplejpeg": fastjpeg.available(),
            "sets": results}
