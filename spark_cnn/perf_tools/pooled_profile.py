"""One profile pooled from several calibrations of one device, point by point (pure).

A calibration prices each point at its median call, and its calls come within milliseconds of each other: on a
host whose speed changes from one moment to the next they share whatever spell they met. A sweep made with
`--calibrate-each` holds one calibration per network, minutes apart. Pooling them per point (the median, or the
fastest, of every calibration that timed it) gives what the time model would predict from a calibration that saw
the host at many moments, so a sweep's stored measurements can be judged against it without measuring anything
again (`spark-cnn validate --judge-pooled`; docs/benchmarks.md, "A calibration that is never cut").

`calibrate()` does the same for a device's cached profile: each calibration is kept, and the cached profile pools
the latest POOL_RUNS of them that `poolable_runs` (pure) accepts beside the newest (docs/perf-model.md,
"A profile pooled over calibrations").
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from spark_cnn.errors import ConfigError
from spark_cnn.perf.profile import DeviceProfile

__all__ = ["POOL_RUNS", "STATISTICS", "pool_profiles", "poolable_runs", "pooled_runs"]

STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {"median": statistics.median, "min": min}
# Calibrations a device's cached profile pools by default: its latest five, the median of each point. Two
# calibrations made back to back on the development guest judged the same measurements of a network a median 7.4
# points of MAPE apart (ten networks); judged offline against the median of the last five calibrations made up to
# each network, 4 of 5 stored sweeps of the generated set met issue 36's targets, against 2 of 5 against each
# network's own; two fresh runs with it gave 4.4% and 7.9% median MAPE at batch >= 8 where each network's own
# run gave 7.2% and 10.1% (docs/perf-model-journal.md, "One calibration, or five").
POOL_RUNS = 5
_POOLED_NOTE = "pooled: "


def poolable_runs(runs: Sequence[DeviceProfile], newest: DeviceProfile, pool: int) -> list[DeviceProfile]:
    """The runs to pool with `newest` (itself included, first): the latest `pool` - 1 others of its host, clock
    and grid revision, newest first. A run of another host (a cache folder shared between machines), timed by
    another clock (thread CPU time is not wall time) or of an older grid is never pooled with it.

    >>> from types import SimpleNamespace as Run
    >>> a, b, c, d = (Run(key="k", host="h", notes=(), conv_grid=1, created=t) for t in ("01", "02", "03", "04"))
    >>> [p.created for p in poolable_runs([a, b, c, d], d, 3)]
    ['04', '03', '02']
    >>> elsewhere = Run(key="k", host="other", notes=(), conv_grid=1, created="05")
    >>> [p.created for p in poolable_runs([a, b, c, elsewhere], elsewhere, 5)], poolable_runs([a], b, 1) == [b]
    (['05'], True)
    """
    if pool < 1:
        raise ConfigError(f"pool: the calibrations to pool must be at least 1 (this one alone), got {pool}")
    def kin(run: DeviceProfile) -> tuple:
        return (run.key, run.host, _clock_of(run), run.conv_grid)
    others = sorted((run for run in runs if run.created != newest.created and kin(run) == kin(newest)),
                    key=lambda run: run.created, reverse=True)
    return [newest, *others[:pool - 1]]


def pooled_runs(profile: DeviceProfile) -> int:
    """How many calibrations `profile` pools (pool_profiles' note), 1 when it is a calibration alone.

    >>> from types import SimpleNamespace as Profile
    >>> pooled_runs(Profile(notes=("cpu capability: AVX512", "pooled: each point the median over 4 calibrations of k")))
    4
    """
    note = next((n for n in profile.notes if n.startswith(_POOLED_NOTE)), None)
    return int(note.split(" over ")[1].split()[0]) if note else 1


def _clock_of(profile: DeviceProfile) -> str:
    return next((note.split()[1] for note in profile.notes if note.startswith("clock: ")), "wall")

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
    note = f"{_POOLED_NOTE}each point the {statistic} over {len(profiles)} calibrations of {latest.key}"
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
