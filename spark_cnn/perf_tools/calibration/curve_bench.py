"""Time-against-bytes curves of the operators between convolutions: elementwise, normalisation, pooling,
concatenation and copies, from 4 KB to 105 MB, which give each its per-call overhead and its cache and
memory bandwidth; and the overhead of a call that moves no data. On the CPU, the activations the sidecar
guards (silu, sigmoid, gelu: models/vector_math_guard.py) are timed with their guard, as the sidecar runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from spark_cnn.models.vector_math_guard import guard_vector_math
from spark_cnn.perf_tools.calibration.harness import Bench, Timing, fresh

__all__ = ["CURVE_SIDES", "JUMP_PER_BYTE", "curve_cases", "time_curves"]

# Sizes: 64 channels of s x s pixels, 4 KB to 105 MB at fp32 (1 to 26 M elements). The largest is a batch-64
# activation of a network's first layers: beyond the last-level cache the cost per byte still grows, so
# extrapolating from smaller tensors under-predicts large batches.
CURVE_SIDES = (4, 14, 28, 56, 112, 224, 448, 640)
# A point from 0.8 MB up whose cost per byte is more than JUMP_PER_BYTE times its next smaller neighbour's is
# timed again (JUMP_RETRIES times at most) and priced at the median of all its calls. Over 318 committed
# calibrations the cost per byte grew at most 2.95 times from one size to the next (99.9th percentile), but
# 18 of them held a point 4.2 to 19 times its neighbour's (max_pool, batch_norm, add at 51-105 MB: calls that
# stalled for 0.25-0.6 s), and extrapolated to batch 64 it priced timm's rexnet_100 213% too slow
# (docs/perf-model.md, "Stalled calls in calibration").
JUMP_FROM_BYTES = 800_000
JUMP_PER_BYTE = 4.0
JUMP_RETRIES = 2

# Per-kind elementwise benchmarks: side -> (call, fresh inputs). Tensors are (1, 64, s, s); in-place kinds act
# in place as torchvision's modules do (ReLU(inplace=True), `out += identity`). Inputs are made fresh before
# each call by the operator that makes them in a CNN: a convolution for normalisation, an elementwise
# operator (standing for the normalisation or activation before) for everything else.
Case = Callable[[int], tuple[Callable[..., Any], Callable[[], tuple]]]


def curve_cases(bench: Bench) -> dict[str, Case]:
    """Kind -> a function of the side s that gives the call and the maker of its inputs."""
    def unary(module: nn.Module) -> Case:
        if not bench.cuda:
            # Timed with the guard the sidecar puts before them on the CPU, which keeps their vector exp at full
            # speed (without it, at some moments, 2 to 4 times slower: models/vector_math_guard.py).
            guard_vector_math(module)

        def make(side: int):
            module.to(bench.device)
            return module, fresh(bench.tensor(1, 64, side, side) - 0.5)
        return make

    def binary(inplace: bool) -> Case:
        def make(side: int):
            x, identity = bench.tensor(1, 64, side, side), bench.tensor(1, 64, side, side)
            made = fresh(x)
            if inplace:
                return (lambda a, b: a.add_(b)), (lambda: (*made(), identity))
            return (lambda a, b: a + b), (lambda: (*made(), identity))
        return make

    def scale(side: int):  # squeeze-excitation: per-channel scale, broadcast over the pixels
        return (lambda s, x: s * x), fresh(bench.tensor(1, 64, 1, 1), bench.tensor(1, 64, side, side))

    def batch_norm(side: int):
        bn = nn.BatchNorm2d(64).eval().to(bench.device)
        producer = nn.Conv2d(64, 64, 1, bias=False).eval().to(bench.device)
        x = bench.tensor(1, 64, side, side)
        return bn, (lambda: (producer(x),))

    def max_pool(kernel: int, stride: int) -> Case:
        def make(side: int):
            pool = nn.MaxPool2d(kernel, stride, padding=kernel // 2 if stride == 1 else 0, ceil_mode=True)
            return pool, fresh(bench.tensor(1, 64, side * stride, side * stride))  # `side` is the output's
        return make

    def global_avg_pool(side: int):
        return nn.AdaptiveAvgPool2d(1), fresh(bench.tensor(1, 64, side, side))

    def mean(side: int):
        return (lambda x: x.mean([2, 3])), fresh(bench.tensor(1, 64, side, side))

    def cat(side: int):
        return (lambda a, b: torch.cat([a, b], 1)), fresh(bench.tensor(1, 32, side, side),
                                                           bench.tensor(1, 32, side, side))

    def shuffle_copy(side: int):  # a channel shuffle: a transposed view made contiguous
        # on an NCHW tensor, as shufflenet runs from its first shuffle on (`.contiguous()` leaves channels-last):
        # runs of side x side pixels copied whole. The same on a channels-last tensor gathers one float per
        # cache line and priced shufflenet's shuffles at 7 to 16 times their measured time (docs/perf-model.md).
        return ((lambda x: x.view(1, 2, 32, side, side).transpose(1, 2).contiguous()),
                fresh(bench.tensor(1, 64, side, side).contiguous()))

    return {"relu": unary(nn.ReLU(inplace=True)), "hardswish": unary(nn.Hardswish(inplace=True)),
            "batch_norm": batch_norm, "add": binary(True), "add_out": binary(False),
            "max_pool2d_k3s2": max_pool(3, 2), "max_pool2d_k3s1": max_pool(3, 1), "max_pool2d_k2s2": max_pool(2, 2),
            "relu6": unary(nn.ReLU6(inplace=True)), "silu": unary(nn.SiLU(inplace=True)),
            "hardsigmoid": unary(nn.Hardsigmoid(inplace=True)), "sigmoid": unary(nn.Sigmoid()),
            "gelu": unary(nn.GELU()), "mul": scale, "cat": cat, "copy": shuffle_copy,
            "adaptive_avg_pool2d": global_avg_pool, "mean": mean, "relu_out": unary(nn.ReLU())}


def time_curves(bench: Bench) -> tuple[dict[str, tuple], dict[str, float]]:
    """Per kind, microseconds per call without faults against the bytes of its (fp32) output; for the global
    pools and means, of their input. Sizes interleave so a small budget still spans them; a point whose cost
    per byte jumps beyond JUMP_PER_BYTE times its smaller neighbour's is timed again."""
    cases = curve_cases(bench)
    order = [CURVE_SIDES[i] for i in (0, 4, 2, 6, 3, 5, 1, 7)]
    timings: dict[str, dict[int, Timing]] = {kind: {} for kind in cases}
    work = [(side, kind) for side in order for kind in cases]
    for side, kind in bench.points("curves", work):
        fn, fresh = cases[kind](side)
        timings[kind][side] = bench.time(fn, fresh)
        del fn, fresh
    for _ in range(JUMP_RETRIES):
        for kind, side in _jumps(bench, timings):
            fn, fresh = cases[kind](side)
            again = bench.time(fn, fresh)
            before = timings[kind][side]
            timings[kind][side] = Timing(before.seconds + again.seconds, before.faults + again.faults)
            del fn, fresh
    points = {kind: [(float(_bytes(side)), bench.us_without_faults(t)) for side, t in by_side.items()]
              for kind, by_side in timings.items()}
    flatten_module, flatten = nn.Flatten(), torch.flatten
    leaf, container = nn.Identity(), nn.Sequential(nn.Identity())
    x = bench.tensor(1, 64, 1, 1)
    call_us = {"module": bench.time(flatten_module, lambda: (x,)).best_s * 1e6,
               "function": bench.time(lambda t: flatten(t, 1), lambda: (x,)).best_s * 1e6,
               "container": max(bench.time(container, lambda: (x,)).best_s - bench.time(leaf, lambda: (x,)).best_s,
                                0.0) * 1e6}
    return {kind: tuple(sorted(p)) for kind, p in points.items() if p}, call_us


def _bytes(side: int) -> int:
    return 64 * side * side * 4


def _jumps(bench: Bench, timings: dict[str, dict[int, Timing]]) -> list[tuple[str, int]]:
    """(kind, side) of the points whose cost per byte jumps beyond JUMP_PER_BYTE from the next smaller size."""
    found = []
    for kind, by_side in timings.items():
        for smaller, side in pairwise(sorted(by_side)):
            if _bytes(smaller) < JUMP_FROM_BYTES:
                continue
            per_byte = [bench.us_without_faults(by_side[s]) / _bytes(s) for s in (smaller, side)]
            if per_byte[1] > JUMP_PER_BYTE * per_byte[0]:
                found.append((kind, side))
    return found
