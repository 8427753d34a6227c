"""One profile pooled from several calibrations of one device, point by point (pure).

A calibration prices each point at its median call, and its calls come within milliseconds of each other: on a
host whose speed changes from one moment to the next they share whatever spell they met. A sweep made with
`--calibrate-each` holds one calibration per network, minutes apart. Pooling them per point (the median, or the
fastest, of every calibration that timed it) gives what the time model would predict from a calibration that saw
the host at many moments, so a sweep's stored measurements can be judged against it without measuring anything
again (`spark-cnn validate --judge-pooled`; docs/benchmarks.md, "A calibration that is never cut").
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from spark_cnn.errors import ConfigError
from spark_cnn.perf.profile import DeviceProfile

__all__ = ["STATISTICS", "pool_profiles"]

STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {"median": statistics.median, "min": min}

_CONV_KEY = ("cin", "cout", "kernel", "stride", "groups", "in_hw", "batch")
_GEMM_KEY = ("rows", "in_features", "out_features")


def pool_profiles(profiles: Sequence[DeviceProfile], statistic: str) -> DeviceProfile:
    """The most recent of `profiles` with its convolution, GEMM and curve points replaced by `statistic`
    (STATISTICS) of the same point over every profile that holds it; its other fields (fixed costs, warmth
    probes, decode) are that profile's own. All must be of one device key.

    >>> pool_profiles([], "median")
    Traceback (most recent call last):
    ...
    spark_cnn.errors.ConfigError: pool_profiles: no profiles to pool
    """
    if statistic not in STATISTICS:
        raise ConfigError(f"pool_profiles: statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    if not profiles:
        raise ConfigError("pool_profiles: no profiles to pool")
    keys = sorted({p.key for p in profiles})
    if len(keys) > 1:
        raise ConfigError(f"pool_profiles: the profiles are of {len(keys)} devices ({', '.join(keys)}); pool "
                          "calibrations of one device only")
    of = STATISTICS[statistic]
    latest = max(profiles, key=lambda p: p.created)
    conv = _pooled_rows([p.conv for p in profiles], _conv_key, of)
    gemm = _pooled_rows([p.gemm for p in profiles], lambda row: tuple(row[k] for k in _GEMM_KEY), of)
    curves = {}
    for kind in sorted({kind for p in profiles for kind in p.curves}):
        by_bytes: dict[float, list[float]] = {}
        for p in profiles:
            for nbytes, us in p.curves.get(kind, ()):
                by_bytes.setdefault(nbytes, []).append(us)
        curves[kind] = tuple((nbytes, of(times)) for nbytes, times in sorted(by_bytes.items()))
    note = f"pooled: each point the {statistic} over {len(profiles)} calibrations of {latest.key}"
    return replace(latest, conv=conv, gemm=gemm, curves=curves, notes=(*latest.notes, note))


def _conv_key(row: dict[str, Any]) -> tuple:
    return (*(row[k] for k in _CONV_KEY), bool(row.get("nchw", False)))


def _pooled_rows(tables: Sequence[Sequence[dict[str, Any]]], key: Callable[[dict[str, Any]], tuple],
                 of: Callable[[Sequence[float]], float]) -> tuple[dict[str, Any], ...]:
    """One row per key, in first-seen order: the first row seen with `us` pooled over every row of that key."""
    first: dict[tuple, dict[str, Any]] = {}
    times: dict[tuple, list[float]] = {}
    for table in tables:
        for row in table:
            k = key(row)
            first.setdefault(k, dict(row))
            times.setdefault(k, []).append(row["us"])
    return tuple({**row, "us": round(of(times[k]), 2)} for k, row in first.items())
