"""How long a device takes per batch, as a small curve: what a simulated device (`--model sim:CURVE`) waits.

Pure and torch-free: the driver checks a `sim:` source with it before any Spark work, the sidecar's simulated
model (models/simulated.py) asks it for each batch's time. A curve is a few (batch size, ms per batch) points;
between two points the time is interpolated linearly, outside them extrapolated along the nearest two, and never
below FLOOR_MS. `sim:` names one of three ways:

- a built-in curve by name (BUILTIN_CURVES), e.g. `sim:resnet50-h200`;
- a line, `sim:A+Bn`: A ms per batch plus B ms per image (`sim:2.8+0.107n`);
- a JSON file: `spark-cnn profile --json`'s output (`points` of `batch_size` and `measured_ms`, else
  `predicted_ms`), or `{"points": [{"batch_size": 64, "ms": 9.66}, ...]}`. The file is read where the model is
  built (the driver, then each sidecar), so give a path every host can read.

>>> round(parse_curve("resnet50-h200").ms(64), 2)
9.66
>>> parse_curve("2+0.5n").ms(8)
6.0
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from spark_cnn.errors import ConfigError

SIM_PREFIX = "sim:"  # --model sim:CURVE
# A batch never takes less than this: a launch and a synchronisation cost something on any device, and a curve
# extrapolated below its smallest point must not reach zero (a device that is free hides the framework's cost).
FLOOR_MS = 0.05
# ResNet-50 on one NVIDIA H200 (random weights, 224 px, precision `auto`: bf16 or fp32, not recorded for these
# points), `spark-cnn bench-sidecar --model resnet50 --device cuda` device_only: 6,625 img/s at batch 64, 7,757 at
# 128 (docs/benchmarks.md, "GPU: the first device run"). ms per batch = 1000 * batch / rate.
H200_RESNET50 = ((64, 1000.0 * 64 / 6625.0), (128, 1000.0 * 128 / 7757.0))
BUILTIN_CURVES = {"resnet50-h200": H200_RESNET50}
_LINE = re.compile(r"^\s*(?P<a>\d+(?:\.\d*)?)\s*\+\s*(?P<b>\d+(?:\.\d*)?)\s*\*?\s*n\s*$")


@dataclass(frozen=True)
class LatencyCurve:
    """Milliseconds per batch by batch size, from points sorted by batch size (at least one)."""

    points: tuple[tuple[int, float], ...]
    name: str = ""

    def __post_init__(self) -> None:
        points = tuple(sorted((int(b), float(ms)) for b, ms in self.points))
        if not points:
            raise ConfigError(f"simulated device {self.name!r}: the curve has no points; give at least one "
                              "(batch size, ms per batch)")
        if any(b < 1 or ms <= 0 for b, ms in points) or len({b for b, _ in points}) != len(points):
            raise ConfigError(f"simulated device {self.name!r}: points {points} must have distinct positive batch "
                              "sizes and positive times")
        object.__setattr__(self, "points", points)

    def ms(self, batch_size: int) -> float:
        """Milliseconds the device takes for one batch of `batch_size` images."""
        if batch_size < 1:
            return 0.0
        points = self.points
        if len(points) == 1:  # one point: the time scales with the batch (no fixed cost known)
            b, ms = points[0]
            return max(FLOOR_MS, ms * batch_size / b)
        # the segment that holds batch_size, else the nearest one (extrapolated)
        i = next((i for i in range(1, len(points)) if batch_size <= points[i][0]), len(points) - 1)
        (b0, ms0), (b1, ms1) = points[i - 1], points[i]
        return max(FLOOR_MS, ms0 + (ms1 - ms0) * (batch_size - b0) / (b1 - b0))

    def images_per_s(self, batch_size: int) -> float:
        return 1000.0 * batch_size / self.ms(batch_size)


def line_curve(a_ms: float, b_ms: float, name: str = "") -> LatencyCurve:
    """A + B*n ms per batch of n, as two points (1 and 2 images) of a linear curve."""
    return LatencyCurve(((1, a_ms + b_ms), (2, a_ms + 2 * b_ms)), name=name)


def curve_from_json(data: dict, name: str = "") -> LatencyCurve:
    """A curve from a profile document: `points` with `batch_size` and one of `measured_ms`, `ms`, `predicted_ms`."""
    points = []
    for point in data.get("points") or []:
        ms = next((point[k] for k in ("measured_ms", "ms", "predicted_ms") if point.get(k) is not None), None)
        if ms is None or "batch_size" not in point:
            raise ConfigError(f"simulated device {name}: point {point} lacks batch_size or a time (measured_ms, ms "
                              "or predicted_ms)")
        points.append((point["batch_size"], ms))
    return LatencyCurve(tuple(points), name=name)


def parse_curve(spec: str) -> LatencyCurve:
    """The curve `spec` names (what follows `sim:`): a built-in name, `A+Bn`, or a JSON file."""
    if spec in BUILTIN_CURVES:
        return LatencyCurve(BUILTIN_CURVES[spec], name=spec)
    line = _LINE.match(spec)
    if line:
        return line_curve(float(line["a"]), float(line["b"]), name=spec)
    if os.path.isfile(spec):
        try:
            with open(spec) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"--model {SIM_PREFIX}{spec}: not a readable JSON profile ({e})") from e
        return curve_from_json(data, name=spec)
    raise ConfigError(f"--model {SIM_PREFIX}{spec}: not a simulated device; give a built-in curve "
                      f"({', '.join(sorted(BUILTIN_CURVES))}), A+Bn (ms per batch of n, e.g. 2.8+0.107n), or a JSON "
                      "profile file (spark-cnn profile --json)")


def curve_points(curve: LatencyCurve, sizes: Sequence[int] = (1, 8, 32, 64, 128)) -> dict[int, float]:
    """ms per batch at a few sizes, for reports."""
    return {b: round(curve.ms(b), 3) for b in sizes}
