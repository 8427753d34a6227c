"""The pipeline's stages around the model: the sidecar's input normalisation and output heads, the task side's
image decoding per core, and on CUDA the host-to-device copy."""

from __future__ import annotations

import torch
from torch import nn

from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels
from spark_cnn.imaging.samples import bench_jpegs
from spark_cnn.models.heads import Predictor
from spark_cnn.models.spec import DEFAULT_TOP_K
from spark_cnn.models.tensors import normalise
from spark_cnn.perf_tools.calibration.harness import Bench, fresh

__all__ = ["time_decode", "time_h2d", "time_sidecar_stages"]

DECODE_IMAGES = 12
NORMALISE_BATCHES = (1, 8, 32)
HEADS_ROWS = (1, 8, 64)
H2D_MIB = (1, 8, 64)
# Sidecar output heads: softmax and top-k over the classes (spark_cnn.models.heads), at ImageNet's width.
HEADS_CLASSES = 1000


def time_sidecar_stages(bench: Bench) -> dict[str, tuple]:
    """The sidecar's work around the model (spark_cnn.sidecar.runner.ModelRunner.forward): uint8 NHWC pixels
    normalised to float NCHW (keyed by the float bytes), and softmax + top-k heads (keyed by logits bytes)."""
    prep = Preprocessing()
    side = prep.crop
    heads = Predictor(nn.Identity(), top_k=DEFAULT_TOP_K)
    work = [("normalise", b) for b in NORMALISE_BATCHES] + [("heads", r) for r in HEADS_ROWS]
    curves: dict[str, list] = {"normalise": [], "heads": []}
    for kind, n in bench.points("sidecar", work):
        if kind == "normalise":
            pixels = torch.randint(0, 256, (n, side, side, 3), dtype=torch.uint8, device=bench.device)
            timing = bench.time(lambda p: normalise(p, prep), lambda pixels=pixels: (pixels.clone(),))
            curves[kind].append((float(n * 3 * side * side * 4), bench.us_without_faults(timing)))
        else:
            logits = bench.tensor(n, HEADS_CLASSES)
            timing = bench.time(heads.predict, fresh(logits))
            curves[kind].append((float(n * HEADS_CLASSES * 4), bench.us_without_faults(timing)))
    return {kind: tuple(sorted(p)) for kind, p in curves.items() if p}


def time_decode(bench: Bench) -> float:
    """Milliseconds to decode, resize and crop one benchmark JPEG on one core (the task side's work)."""
    deadline = bench.budget.section("decode")
    prep = Preprocessing()
    files = bench_jpegs(DECODE_IMAGES)
    preprocess_pixels(files[0], prep)  # warm-up: Pillow's first decode loads its codecs
    times = []
    for data in files:
        start = bench.budget.clock()
        preprocess_pixels(data, prep)
        times.append(bench.budget.clock() - start)
        if bench.budget.clock() > deadline:
            break
    times.sort()
    return round(times[len(times) // 2] * 1e3, 3)  # the median: images differ, and decode is not the minimum


def time_h2d(bench: Bench) -> tuple[tuple[float, float], ...]:
    """Pinned host -> device copies on CUDA: ((bytes, us), ...)."""
    if not bench.cuda:
        bench.budget.section("h2d")
        return ()
    points = []
    for mib in bench.points("h2d", H2D_MIB):
        host = torch.empty(mib << 18, dtype=torch.float32).pin_memory()
        timing = bench.time(lambda host=host: host.to(bench.device, non_blocking=True))
        points.append((float(mib << 20), timing.best_s * 1e6))
    return tuple(points)
