"""GEMM benchmarks: nn.Linear layers of common classifier shapes (256 to 9216 inputs) at 1 to 64 rows."""

from __future__ import annotations

from typing import Any

from torch import nn

from spark_cnn.perf.calibration.harness import Bench, fresh

__all__ = ["GEMM_ROWS", "GEMM_SHAPES", "time_gemms"]

# Rows of the GEMM table. 2 and 4: a large linear layer at a few rows streams its weights from DRAM, which
# interpolating between 1 and 8 rows misses (docs/perf-model.md, "Calibration").
GEMM_ROWS = (1, 2, 4, 8, 64)
GEMM_SHAPES = ((1024, 1000), (4096, 4096), (256, 1000), (9216, 4096), (4096, 1000), (576, 1024), (2048, 1000),
               (1280, 1000), (256, 64))


def time_gemms(bench: Bench) -> list[dict[str, Any]]:
    points = []
    for in_features, out_features in bench.points("gemm", GEMM_SHAPES):
        linear = nn.Linear(in_features, out_features).eval().to(bench.device)
        for rows in GEMM_ROWS:
            x = bench.tensor(rows, in_features)
            timing = bench.time(linear, fresh(x))
            points.append({"rows": rows, "in_features": in_features, "out_features": out_features,
                           "us": round(bench.us_without_faults(timing), 2)})
        del linear
    return points
