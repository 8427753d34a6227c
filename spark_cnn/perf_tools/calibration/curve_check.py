"""Whether a CPU calibration's transcendental curves can be believed: silu, sigmoid and gelu against relu.

The repeatability check catches a host whose speed changes *during* a calibration. It cannot catch a state
that lasts: on a 2-core Xeon guest, every calibration for about an hour timed silu, sigmoid and gelu 3 to 4 times
slower than usual, agreed with itself, and priced every efficientnet 14-53% too slow at batch 8, where networks ran
them at about their usual speed (docs/perf-model-journal.md). curve_bench now times them behind the sidecar's
vector-math guard, an MKL call that ends that state (models/vector_math_guard.py).

What does not move with the hour is the ratio of those kinds to relu at the same bytes: relu (in place) is
bound by memory, the others by the vector unit's exp/erf, so their ratio is a property of the CPU. Over the
153 calibrations of the project's other zoo and held-out runs, the median ratio over 0.8-12.8 MB of one
calibration stayed at or below 4.96 (silu), 3.90 (sigmoid) and 5.56 (gelu); over the anomalous hour's 43 it
stayed at or above 7.75, 6.81 and 8.66. The bounds sit between (near the geometric mean of each pair), and a
calibration is flagged only when every kind it timed is beyond its bound: a vector path slow for one kind
alone is not the state seen. The bounds come from this one CPU; another whose exp is much slower against its
memory could cross them (such a calibration is kept with a warning; --strict refuses it).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

__all__ = ["RATIO_BOUNDS", "RATIO_SIDES", "transcendental_anomaly", "transcendental_ratios"]

# Kind -> the largest believable median ratio of its time to relu's at the same bytes (see the docstring).
RATIO_BOUNDS = {"silu": 6.2, "sigmoid": 5.2, "gelu": 7.0}
# The curve sides (64 channels of s x s fp32: 0.8, 3.2 and 12.8 MB) the ratio is taken over: large enough
# that a call's fixed cost does not dilute it, small enough to be in every calibration's budget.
RATIO_SIDES = (56, 112, 224)
# A kind needs this many sizes timed (of RATIO_SIDES) to be judged; a calibration needs two kinds judged.
MIN_SIZES = 2
MIN_KINDS = 2

Curve = Sequence[Sequence[float]]


def _bytes_of(side: int) -> int:
    return 64 * side * side * 4


def transcendental_ratios(curves: Mapping[str, Curve]) -> dict[str, float]:
    """Kind -> the median, over RATIO_SIDES, of its time over relu's at the same bytes; kinds with fewer than
    MIN_SIZES such sizes (a small budget skips points) are left out.

    >>> relu = ((802816.0, 30.0), (3211264.0, 120.0))
    >>> transcendental_ratios({"relu": relu, "silu": ((802816.0, 90.0), (3211264.0, 300.0))})
    {'silu': 2.75}
    """
    relu = {round(b): us for b, us in curves.get("relu", ()) if us > 0}
    wanted = {_bytes_of(side) for side in RATIO_SIDES}
    ratios = {}
    for kind in RATIO_BOUNDS:
        points = [us / relu[round(b)] for b, us in curves.get(kind, ()) if round(b) in wanted and round(b) in relu]
        if len(points) >= MIN_SIZES:
            ratios[kind] = round(statistics.median(points), 2)
    return ratios


def transcendental_anomaly(curves: Mapping[str, Curve], device: str) -> str | None:
    """None when the curves look like this CPU's, else one line saying which kinds ran how slow against relu.
    Only CPU calibrations are judged: on a GPU every one of these kinds is bound by memory."""
    if device != "cpu":
        return None
    ratios = transcendental_ratios(curves)
    if len(ratios) < MIN_KINDS or any(ratio <= RATIO_BOUNDS[kind] for kind, ratio in ratios.items()):
        return None
    timed = ", ".join(f"{kind} {ratio:.1f}x" for kind, ratio in ratios.items())
    bounds = ", ".join(f"{RATIO_BOUNDS[kind]:.1f}x" for kind in ratios)
    return f"transcendental operators timed slow against relu at the same bytes ({timed}; believable up to {bounds})"
