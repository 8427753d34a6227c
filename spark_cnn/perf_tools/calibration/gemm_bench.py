"""GEMM benchmarks: nn.Linear layers of common classifier shapes (256 to 9216 inputs) at 1 to 64 rows, the
token-wise layers of transformers and ConvNeXt (a linear layer applied to every pixel or token) at 256 and
1,024 rows, and how much slower one linear layer gets as more data passes through the cache before it runs
(its weights no longer there)."""

from __future__ import annotations

import mmap
from typing import Any

import torch
from torch import nn

from spark_cnn.perf_tools.calibration.harness import Bench, fresh, measure, pollute_bytes

__all__ = ["GEMM_ROWS", "GEMM_SHAPES", "TOKEN_ROWS", "TOKEN_SHAPES", "WARMTH_MIN_BUDGET_S", "WARMTH_PROBE",
           "WARMTH_ROWS", "WARMTH_STEPS", "time_gemms", "time_weight_warmth"]

# Rows of the GEMM table. 2 and 4: a large linear layer at a few rows streams its weights from DRAM, which
# interpolating between 1 and 8 rows misses (docs/perf-model.md, "Calibration").
GEMM_ROWS = (1, 2, 4, 8, 64)
GEMM_SHAPES = ((1024, 1000), (4096, 4096), (256, 1000), (9216, 4096), (4096, 1000), (576, 1024), (2048, 1000),
               (1280, 1000), (256, 64))
# A linear layer over tokens or pixels runs hundreds to tens of thousands of rows per batch (convnext_tiny at
# batch 8: 25,088 in its first stage), where one core reached 1.2 to 1.6 times its 64-row rate; read from the
# 64-row points, such layers were predicted about 30% too slow (docs/perf-model.md, "The zoo"). Beyond 1,024
# rows the rate stays within ~10% (measured to 4,096), so the time model reads larger row counts here. The
# shapes are the widths of a 4x MLP, each way, from 96 to 768 channels.
TOKEN_ROWS = (256, 1024)
TOKEN_SHAPES = ((96, 384), (384, 96), (384, 1536), (1536, 384), (768, 3072), (3072, 768))


def time_gemms(bench: Bench) -> list[dict[str, Any]]:
    """The classifier shapes at GEMM_ROWS, then the token shapes at TOKEN_ROWS, until the section's deadline."""
    shapes = [(shape, GEMM_ROWS) for shape in GEMM_SHAPES] + [(shape, TOKEN_ROWS) for shape in TOKEN_SHAPES]
    points = []
    for (in_features, out_features), row_counts in bench.points("gemm", shapes):
        linear = nn.Linear(in_features, out_features).eval().to(bench.device)
        for rows in row_counts:
            x = bench.tensor(rows, in_features)
            timing = bench.time(linear, fresh(x))
            points.append({"rows": rows, "in_features": in_features, "out_features": out_features,
                           "us": round(bench.us_without_faults(timing), 2)})
        del linear
    return points


# The weight-warmth probe: a transformer MLP's linear layer (9 MiB of weights), timed after writing the
# harness's pollution (what every other benchmark runs after) and after 2, 4, ... 32 times as much. On the
# development host, at 50 rows (vit_b_32's tokens) it took 2.1 ms after 16 MiB, 2.6 after 64, 3.3-3.5 from
# 256 MiB on: a network whose forward moves hundreds of MiB reads its linear layers' weights from DRAM, which
# the GEMM table, timed after 16 MiB, does not see (vit_b_32 at batch 1: -29%). How much slower depends on
# the rows, which decide how often the weights are read: +0.4 ms at 1 row, +1.3 at 50, +0.7 at 200; at 400
# and 1,600 rows no more than the noise, the arithmetic hides it (docs/perf-model.md, "Weights that do not stay
# in the cache").
WARMTH_PROBE = (768, 3072)
WARMTH_SWEEP_ROWS = 50
WARMTH_ROWS = (1, 8, 50, 200)
# A calibration given less than this skips the probe (3 s): the profile then prices weights as the GEMM table does.
WARMTH_MIN_BUDGET_S = 20.0
WARMTH_STEPS = 6
WARMTH_REPEATS = 5


def time_weight_warmth(bench: Bench) -> dict[str, Any]:
    """On the CPU: {"weight_bytes": the probe's, "curve": [(bytes through the cache between two calls, us),
    ...] at WARMTH_SWEEP_ROWS (the probe's own weights and what was written before it), "cold_extra":
    [(rows, us slower after the most writing than after the least), ...]}; {} on a GPU, whose calls do not
    share a cache with the host's."""
    if bench.cuda:
        return {}
    in_features, out_features = WARMTH_PROBE
    linear = nn.Linear(in_features, out_features).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in linear.parameters())
    base = pollute_bytes()
    # mapped for the probe and unmapped after it: a process that calibrates in place (the sidecar's malloc
    # never trims) would otherwise keep the 512 MiB for good
    with mmap.mmap(-1, base << (WARMTH_STEPS - 1)) as area:
        pages = torch.frombuffer(area, dtype=torch.float32)
        pages.fill_(1.0)  # faulted in once, before anything is timed
        curve = [(float(weight_bytes + (base << step)),
                  round(_us_after(bench, linear, pages[: (base << step) // 4], WARMTH_SWEEP_ROWS), 2))
                 for step in range(WARMTH_STEPS)]
        least = pages[: base // 4]
        extra = [(rows, round(_us_after(bench, linear, pages, rows) - _us_after(bench, linear, least, rows), 2))
                 for rows in WARMTH_ROWS]
        del least
        del pages  # the mapping closes only once no tensor views it
    return {"weight_bytes": weight_bytes, "curve": curve, "cold_extra": extra}


def _us_after(bench: Bench, linear: nn.Module, written: torch.Tensor, rows: int) -> float:
    """Median microseconds of `linear` on `rows` rows, each call after `written` was written over."""
    x = bench.tensor(rows, linear.in_features)
    timing = measure(lambda: linear(x), repeats=WARMTH_REPEATS, before=lambda: (written.mul_(1.0), ())[1],
                     clock=bench.budget.clock)
    return timing.median_s * 1e6
