"""GEMM benchmarks: nn.Linear layers of common classifier shapes (256 to 9216 inputs) at 1 to 64 rows, and
the token-wise layers of transformers and ConvNeXt (a linear layer applied to every pixel or token) at 256 and
1,024 rows."""

from __future__ import annotations

from typing import Any

from torch import nn

from spark_cnn.perf.calibration.harness import Bench, fresh

__all__ = ["GEMM_ROWS", "GEMM_SHAPES", "TOKEN_ROWS", "TOKEN_SHAPES", "time_gemms"]

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
