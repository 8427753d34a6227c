"""How much faster a small operator's call runs inside a network than calibration times it.

Every calibrated call starts cold (`harness.Bench.time` writes 16 MiB over the cache first): the framework's
code and state (Python frames, torch's dispatch, oneDNN's primitives) have to come back, which on a small
tensor is most of the call. Inside a small network at batch 1 the layers before it moved a few hundred KB,
so the call finds much of that still cached. The probe runs a chain of the layers small networks are made
of (pointwise and depthwise convolutions, batch norms, activations) at varied widths, each shape its own
module as in a network, on one 14 x 14 image, and times every call as the chain runs, with a given number of
bytes written over the cache before each (what the previous layers moved); the sum against the same calls
timed by the harness gives the warm share at that traffic. The time model scales the layers it finds bound
by their call overhead by that share, at what the layer before read and wrote (timemodel, "warm calls").
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from spark_cnn.perf_tools.calibration.harness import Bench, fresh

__all__ = ["CALL_WARMTH_TRAFFIC", "CALL_WARMTH_WIDTHS", "call_warmth_chain", "time_call_warmth"]

# Channels of the chain's stages: varied, as a network's are (per-shape state is part of what a call reloads;
# a chain repeating one shape ran warmer than one of varied widths, docs/perf-model.md).
CALL_WARMTH_WIDTHS = (16, 24, 40, 48, 72, 96, 120, 144)
CALL_WARMTH_SIDE = 14
# Bytes written over the cache before each call of the warm chain: none, then what a small network's layers
# move at batch 1 up to a large one's at batch 8 (the harness's 16 MiB is the cold end).
CALL_WARMTH_TRAFFIC = (0, 128 << 10, 512 << 10, 2 << 20, 8 << 20)
CALL_WARMTH_REPEATS = 7


def call_warmth_chain(bench: Bench) -> list[nn.Module]:
    """The probe's layers in order: per width, a pointwise convolution into it, batch norm, ReLU, a 3 x 3
    depthwise convolution, batch norm, hard-swish."""
    layers: list[nn.Module] = []
    previous = CALL_WARMTH_WIDTHS[0]
    for width in CALL_WARMTH_WIDTHS:
        layers += [nn.Conv2d(previous, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                   nn.Conv2d(width, width, 3, padding=1, groups=width, bias=False), nn.BatchNorm2d(width),
                   nn.Hardswish(inplace=True)]
        previous = width
    return [layer.eval().to(bench.device) for layer in layers]


def time_call_warmth(bench: Bench) -> dict[str, Any]:
    """On the CPU: {"layers": the chain's length, "cold_us": the sum of its calls timed by the harness (as
    calibration times every operator), "curve": [(bytes written before each call, sum of the calls' median
    microseconds in the running chain), ...]}; {} on a GPU, whose kernels do not share the host's cache."""
    if bench.cuda:
        return {}
    layers = call_warmth_chain(bench)
    inputs = _chain_inputs(bench, layers)
    cold = sum(bench.us_without_faults(bench.time(layer, fresh(x))) for layer, x in zip(layers, inputs,
                                                                                         strict=True))
    scratch = torch.empty(max(CALL_WARMTH_TRAFFIC) // 4).fill_(1.0)
    curve = []
    for traffic in CALL_WARMTH_TRAFFIC:
        written = scratch[: traffic // 4] if traffic else None
        curve.append((float(traffic), round(_running_chain_us(layers, inputs[0], written), 2)))
    return {"layers": len(layers), "cold_us": round(cold, 2), "curve": curve}


def _chain_inputs(bench: Bench, layers: list[nn.Module]) -> list[torch.Tensor]:
    """Each layer's input as the chain makes it (so the harness times the shapes the chain runs)."""
    x = bench.tensor(1, CALL_WARMTH_WIDTHS[0], CALL_WARMTH_SIDE, CALL_WARMTH_SIDE)
    inputs = []
    for layer in layers:
        inputs.append(x.clone())
        x = layer(x.clone())
    return inputs


def _running_chain_us(layers: list[nn.Module], first: torch.Tensor, written: torch.Tensor | None) -> float:
    """Sum over the chain's layers of each call's median microseconds over CALL_WARMTH_REPEATS runs of the
    chain (after one untimed run), `written` written over before every call."""
    clock = time.perf_counter
    per_layer: list[list[float]] = [[] for _ in layers]
    for run in range(CALL_WARMTH_REPEATS + 1):
        x = first * 1.0
        for i, layer in enumerate(layers):
            if written is not None:
                written.mul_(1.0)
            start = clock()
            x = layer(x)
            if run:
                per_layer[i].append(clock() - start)
    return sum(sorted(times)[len(times) // 2] for times in per_layer) * 1e6
