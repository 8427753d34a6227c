"""Convolution benchmarks: a grid of generic shapes at a few batch sizes, and the fixed cost of one call.

Regular k x k (k = 1, 3, 5, 7, 11), strided, depthwise and grouped convolutions, 3 to 2048 channels, 1 to 224
pixels, never the network being predicted; `conv_backend` is torch's own choice of CPU kernel, which the time
model classifies by.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from spark_cnn.perf.profile import CONV_GRID_REVISION, conv_backend
from spark_cnn.perf_tools.calibration.harness import Bench, fresh

__all__ = ["CONV_BATCHES", "CONV_GRID", "CONV_GRID_REVISION", "CUDA_CONV_BATCHES", "DEPTHWISE_NCHW_BATCHES",
           "DEPTHWISE_NCHW_GRID", "GROUPED_WIDTHS", "LARGE_CONV_BATCH", "LARGE_CONV_MAX_OUT_HW",
           "LARGE_DEPTHWISE_BATCH", "LARGE_DEPTHWISE_GRID", "LARGE_POINTWISE_BATCH", "LARGE_POINTWISE_GRID",
           "POINTWISE_NCHW_BATCHES", "POINTWISE_NCHW_GRID", "POINTWISE_ONEDNN_BATCH", "STRIDED_GROUPED", "conv_backend",
           "time_convolutions"]

# Timed at a small and a medium batch: per-image time changes with the batch (weights are reordered once per
# call; large activations leave the cache), and the time model interpolates in between.
CONV_BATCHES = (1, 8)
# ... and at a large batch where the output is small (oneDNN's GEMM has batch x out_hw^2 rows, too few at
# batch 8 to run at full speed), and for depthwise and grouped convolutions at every size (memory-bound, they
# get dearer per image once a batch leaves the cache); docs/perf-model.md, "Calibration", has the checks.
LARGE_CONV_BATCH = 32
LARGE_CONV_MAX_OUT_HW = 14
# A GPU needs larger batches to fill: timed where the sidecar runs it (its auto batch on CUDA is 64).
CUDA_CONV_BATCHES = (8, 64)
# 1x1 convolutions at batch >= 16 run on oneDNN instead of a GEMM per image (one thread): timed there too.
POINTWISE_ONEDNN_BATCH = 16

# Grouped convolutions at the group widths networks use beyond the grid's 8 and 16 input channels per group
# (4, 24, 32, 48, 128): oneDNN runs up to 16 per group on one kernel, more on another whose rate per FLOP
# grows with the width, which points at 8 and 16 alone cannot show (docs/perf-model.md, "Grouped
# convolutions"). Generic channel counts, timed at every batch as the grid's other grouped shapes.
GROUPED_WIDTHS = ((96, 96, 3, 1, 24, 56), (192, 192, 3, 1, 8, 28), (384, 384, 3, 1, 8, 14), (768, 768, 3, 1, 24, 7),
                  (768, 768, 3, 1, 6, 7), (384, 384, 3, 2, 16, 28))
# Strided grouped convolutions at 16 channels per group (oneDNN's block), the width RegNet's downsampling blocks
# use: timed as calibration times, Conv2d(320, 320, 3, 2, groups=20) on 28x28 took 325 us per image at batch 8
# and 571-594 at 32 and 64, where the grid's strided shape at 24 per group stays flat, so the model priced
# regnet_y_800mf's four at -61% to -73% of their time at batch 64 (docs/perf-model.md, "Strided grouped and
# NCHW pointwise convolutions"). Generic channel counts, timed at every batch as the other grouped shapes.
STRIDED_GROUPED = ((256, 256, 3, 2, 16, 28), (128, 128, 3, 2, 8, 56))
# The convolution grid: (cin, cout, kernel, stride, groups, in_hw). Generic shapes on the manifold CNNs live on
# (channels x pixels per side between ~900 and ~7000), plus channel counts off the multiples of 16 that oneDNN
# blocks by, 3-channel image inputs, strides, depthwise and grouped. Ordered so a prefix spans the kinds.
CONV_GRID: tuple[tuple[int, int, int, int, int, int], ...] = (
    (64, 64, 3, 1, 1, 56), (256, 64, 1, 1, 1, 56), (96, 96, 3, 1, 96, 56), (3, 32, 3, 2, 1, 224),
    (128, 128, 3, 1, 1, 28), (64, 256, 1, 1, 1, 56), (144, 144, 3, 2, 144, 56), (3, 64, 7, 2, 1, 224),
    (256, 256, 3, 1, 1, 14), (512, 128, 1, 1, 1, 28), (240, 240, 5, 1, 240, 28), (48, 48, 3, 1, 6, 56),
    (512, 512, 3, 1, 1, 7), (128, 512, 1, 1, 1, 28), (672, 672, 5, 2, 672, 14), (128, 128, 3, 1, 8, 28),
    (32, 32, 3, 1, 1, 112), (1024, 256, 1, 1, 1, 14), (32, 32, 3, 1, 32, 112), (3, 64, 11, 4, 1, 224),
    (64, 128, 3, 2, 1, 56), (256, 1024, 1, 1, 1, 14), (576, 576, 5, 1, 576, 7), (208, 208, 3, 1, 26, 14),
    (24, 24, 3, 1, 1, 56), (2048, 512, 1, 1, 1, 7), (1152, 1152, 3, 1, 1152, 7), (440, 440, 3, 1, 55, 7),
    (48, 48, 3, 1, 1, 28), (512, 2048, 1, 1, 1, 7), (16, 16, 3, 1, 16, 112), (104, 104, 3, 2, 13, 56),
    (96, 96, 3, 1, 1, 28), (16, 96, 1, 1, 1, 112), (480, 480, 3, 1, 480, 14), (3, 16, 3, 2, 1, 224),
    (192, 192, 3, 1, 1, 14), (24, 144, 1, 1, 1, 56), (96, 96, 3, 2, 96, 112), (128, 256, 3, 2, 1, 28),
    (384, 384, 3, 1, 1, 13), (144, 24, 1, 1, 1, 56), (88, 88, 3, 1, 88, 28), (256, 512, 3, 2, 1, 14),
    (16, 16, 3, 1, 1, 112), (40, 240, 1, 1, 1, 28), (120, 120, 5, 1, 120, 28), (64, 64, 3, 1, 1, 112),
    (40, 40, 3, 1, 1, 28), (240, 40, 1, 1, 1, 28), (200, 200, 5, 2, 200, 28), (32, 64, 3, 1, 1, 56),
    (64, 192, 3, 1, 1, 56), (80, 480, 1, 1, 1, 14), (384, 384, 5, 1, 384, 14), (96, 208, 3, 1, 1, 14),
    (192, 64, 3, 1, 1, 28), (480, 80, 1, 1, 1, 14), (72, 72, 5, 2, 72, 56), (16, 48, 5, 1, 1, 28),
    (112, 112, 3, 1, 1, 28), (160, 960, 1, 1, 1, 7), (960, 160, 1, 1, 1, 7), (32, 96, 5, 1, 1, 14),
    (64, 192, 5, 1, 1, 27), (192, 384, 3, 1, 1, 13), (384, 256, 3, 1, 1, 13), (160, 320, 3, 1, 1, 7),
    (256, 256, 3, 1, 1, 28), (512, 512, 3, 1, 1, 14), (64, 128, 1, 2, 1, 56), (128, 256, 1, 2, 1, 28),
    (256, 512, 1, 2, 1, 14), (96, 16, 1, 1, 1, 56), (64, 16, 1, 1, 1, 56), (16, 64, 1, 1, 1, 56),
    (128, 32, 1, 1, 1, 28), (32, 128, 1, 1, 1, 28), (256, 48, 1, 1, 1, 14), (512, 64, 1, 1, 1, 13),
    (64, 256, 3, 1, 1, 13), (16, 8, 1, 1, 1, 1), (576, 144, 1, 1, 1, 1), (144, 576, 1, 1, 1, 1),
    (1024, 1024, 1, 1, 1, 7), (832, 256, 1, 1, 1, 7), (480, 192, 1, 1, 1, 14), (192, 16, 1, 1, 1, 28),
    (116, 116, 1, 1, 1, 28), (232, 232, 3, 1, 232, 14), (58, 58, 1, 1, 1, 28), (24, 24, 3, 2, 24, 112),
    *GROUPED_WIDTHS, *STRIDED_GROUPED,
)
# Depthwise convolutions on an NCHW input (the layout a model's own `.contiguous()` leaves, as shufflenet's
# channel shuffle does): 2 to 3 times their channels-last time, so a class of their own, timed at every batch.
DEPTHWISE_NCHW_GRID = ((96, 96, 3, 1, 96, 56), (144, 144, 3, 2, 144, 56), (240, 240, 3, 1, 240, 28),
                       (480, 480, 3, 2, 480, 28), (1152, 1152, 3, 1, 1152, 7), (32, 32, 3, 1, 32, 112))
DEPTHWISE_NCHW_BATCHES = (1, 8, LARGE_CONV_BATCH)
# 1x1 convolutions on oneDNN (batch >= 16) on an NCHW input (shufflenet's branches after its shuffle): oneDNN
# reorders it first, 1.2 to 2 times the channels-last time at 7 to 56 pixels (timed as calibration times, with
# the sidecar's allocator); a class of their own. Below batch 16 torch runs them as a GEMM per image, which
# reads NCHW as it is: no class there.
POINTWISE_NCHW_GRID = ((96, 96, 1, 1, 1, 28), (48, 48, 1, 1, 1, 56), (192, 192, 1, 1, 1, 14), (384, 384, 1, 1, 1, 7))
POINTWISE_NCHW_BATCHES = (POINTWISE_ONEDNN_BATCH, 64)
# Channels-last 1x1 convolutions at 28 to 56 pixels at batch 64 too, the zoo's largest, which otherwise reads
# batch 16's rate: from 16 to 64 the time per image stayed flat for some shapes and grew 1.7 times for others
# (Conv2d(116, 116, 1) on 28x28: 193 and 333 us per image in one run, 188 and 184 in the next). Shapes of the
# grid, the larger activations first.
LARGE_POINTWISE_BATCH = 64
LARGE_POINTWISE_GRID = ((64, 256, 1, 1, 1, 56), (144, 24, 1, 1, 1, 56), (256, 64, 1, 1, 1, 56), (24, 144, 1, 1, 1, 56),
                        (116, 116, 1, 1, 1, 28), (240, 40, 1, 1, 1, 28), (128, 512, 1, 1, 1, 28), (58, 58, 1, 1, 1, 28))
# Depthwise convolutions at batch 64, where a batch moves 70-150 MB of activations: the time model reads a
# depthwise layer from points that move as many bytes (timemodel.DEPTHWISE_FEATURE_WEIGHTS), and the grid's k5
# points stopped at 48 MB (36 MB strided), so k5 layers beyond (gen08_dwse's 61-84 MB at batch 8, priced 29-46%
# slow; efficientnet_b0's k5 at 28 px moves 96 MB at batch 64, its strided one at 56 px 72 MB from batch 32) read k3
# points (docs/perf-model-journal.md, "Depthwise convolutions by the bytes they move"). Shapes of the grid, 14-20
# ms a call on the development guest.
LARGE_DEPTHWISE_BATCH = 64
LARGE_DEPTHWISE_GRID = ((240, 240, 5, 1, 240, 28), (72, 72, 5, 2, 72, 56), (96, 96, 3, 1, 96, 56))
# Weight reordering: 3x3 convolutions on one pixel (almost no arithmetic) with 0.15 to 9.4 MiB of weights.
CONV_WEIGHT_PROBES = (64, 192, 512)



def _conv_point(bench: Bench, cin: int, cout: int, kernel: int, stride: int, groups: int, in_hw: int,
                batch: int, threads: int, nchw: bool = False) -> dict[str, Any]:
    conv = nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, groups=groups, bias=False).eval()
    conv.to(bench.device)
    if bench.cuda:  # the runner converts CUDA models to channels-last; CPU models keep their NCHW weights
        conv.to(memory_format=torch.channels_last)
    x = bench.tensor(batch, cin, in_hw, in_hw)
    if nchw:
        x = x.contiguous()
    timing = bench.time(conv, fresh(x))
    out_hw = (in_hw + 2 * (kernel // 2) - kernel) // stride + 1
    backend = "cuda" if bench.cuda else conv_backend(cin, (kernel, kernel), (stride, stride), (1, 1), groups, batch,
                                                     (in_hw, in_hw), threads)
    return {"cin": cin, "cout": cout, "kernel": kernel, "stride": stride, "groups": groups, "in_hw": in_hw,
            "out_hw": out_hw, "batch": batch, "backend": backend, "us": round(bench.us_without_faults(timing), 2),
            "faults": min(timing.faults), **({"nchw": True} if nchw else {})}


def _large_batch(cin: int, cout: int, kernel: int, stride: int, groups: int, in_hw: int) -> bool:
    """Whether a grid shape is timed at LARGE_CONV_BATCH too (CPU): depthwise or grouped, or a small output."""
    return groups > 1 or (in_hw + 2 * (kernel // 2) - kernel) // stride + 1 <= LARGE_CONV_MAX_OUT_HW


def time_convolutions(bench: Bench, threads: int) -> tuple[list[dict], float, float]:
    """The fixed cost per call, the grid at CONV_BATCHES (and pointwise at the oneDNN batch), then, in a
    section of its own so that a small budget keeps the whole grid at the smaller batches first, the shapes
    with small outputs at LARGE_CONV_BATCH (CPU only) and depthwise convolutions on NCHW inputs."""
    weight_points = []
    for channels in CONV_WEIGHT_PROBES:  # first, so a tiny budget still fits the fixed cost
        conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False).eval().to(bench.device)
        x = bench.tensor(2, channels, 1, 1)  # batch 2: oneDNN whatever the thread count
        us = bench.us_without_faults(bench.time(conv, fresh(x)))
        weight_points.append((channels * channels * 9 * 4 / 2**20, us))
    call_us, weight_us = _line(weight_points)
    work = []
    for cin, cout, kernel, stride, groups, in_hw in CONV_GRID:
        batches = list(CUDA_CONV_BATCHES if bench.cuda else CONV_BATCHES)
        if kernel == 1 and groups == 1 and stride == 1 and not bench.cuda:
            batches.append(POINTWISE_ONEDNN_BATCH)
        work.append([(cin, cout, kernel, stride, groups, in_hw, b) for b in batches])
    points = []
    for shape_points in bench.points("conv", work):
        for *shape, batch in shape_points:
            points.append(_conv_point(bench, *shape, batch=batch, threads=threads))
    large = [] if bench.cuda else [(shape, LARGE_CONV_BATCH, False) for shape in CONV_GRID if _large_batch(*shape)]
    large += [(shape, batch, True) for shape in DEPTHWISE_NCHW_GRID
              for batch in (CUDA_CONV_BATCHES if bench.cuda else DEPTHWISE_NCHW_BATCHES)]
    if not bench.cuda:  # on CUDA the runner converts every input to channels-last; its grid covers the batches
        large += [(shape, LARGE_DEPTHWISE_BATCH, False) for shape in LARGE_DEPTHWISE_GRID]
        large += [(shape, LARGE_POINTWISE_BATCH, False) for shape in LARGE_POINTWISE_GRID]
        large += [(shape, batch, True) for shape in POINTWISE_NCHW_GRID for batch in POINTWISE_NCHW_BATCHES]
    for shape, batch, nchw in bench.points("conv_large", large):
        points.append(_conv_point(bench, *shape, batch=batch, threads=threads, nchw=nchw))
    return points, call_us, weight_us


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope (both >= 0) of y against x."""
    if len(points) < 2:
        return (points[0][1] if points else 0.0), 0.0
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = max(sum((p[0] - mx) * (p[1] - my) for p in points) / sxx, 0.0) if sxx else 0.0
    return max(my - slope * mx, 0.0), slope
