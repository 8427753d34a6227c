"""A device's cached profile pools its latest calibrations on this host, each point their median; a stale mark
forgets them, and what is never pooled (another host, another clock, an older grid) stays out.

Runs are injected (`device_profile._run` replaced): nothing here calibrates, sleeps or starts a process.
"""

from __future__ import annotations

import os

import pytest

from spark_cnn.cli import build_parser
from spark_cnn.errors import ConfigError
from spark_cnn.perf.profile import cache_file, mark_stale
from spark_cnn.perf_tools import commands
from spark_cnn.perf_tools.calibration import device_profile
from spark_cnn.perf_tools.pooled_profile import POOL_RUNS
from tests.perf_doubles import synthetic_profile

KEY = "synthetic"


@pytest.fixture
def runs(monkeypatch):
    """calibrate() in-process, each run the next of `runs.queue`: (conv scale, host, notes); returns the fixture's
    namespace with the queue and a counter for distinct creation times."""
    class Runs:
        queue: list[tuple[float, str, tuple[str, ...]]] = []
        made = 0

    def run(device, threads, key, budget_s, clock="wall"):
        scale, host, notes = Runs.queue.pop(0)
        Runs.made += 1
        base = synthetic_profile(key=key, threads=threads)
        conv = tuple({**row, "us": row["us"] * scale} for row in base.conv)
        curves = {kind: tuple((b, us * scale) for b, us in points) for kind, points in base.curves.items()}
        return synthetic_profile(key=key, threads=threads, host=host, notes=notes, conv=conv, curves=curves,
                                 created=f"2026-12-07T10:{Runs.made:02d}:00+00:00")
    monkeypatch.setattr(device_profile, "_run", run)
    monkeypatch.setattr(device_profile, "_needs_sidecar_allocator", lambda: False)
    monkeypatch.setattr(device_profile, "device_key", lambda device, threads: KEY)
    return Runs


def _calibrate(tmp_path, runs, scale, host="h", notes=(), **kwargs):
    runs.queue.append((scale, host, notes))
    return device_profile.calibrate("cpu", threads=1, cache_dir=str(tmp_path), refresh=True, **kwargs)


def _scale(profile):
    """The profile's first convolution point against the synthetic device's."""
    return profile.conv[0]["us"] / synthetic_profile().conv[0]["us"]


def test_the_cached_profile_is_the_median_of_the_latest_runs_of_this_host(tmp_path, runs):
    first = _calibrate(tmp_path, runs, 1.0)
    assert _scale(first) == pytest.approx(1.0, rel=1e-3) and not any("pooled" in note for note in first.notes)
    assert _scale(_calibrate(tmp_path, runs, 3.0)) == pytest.approx(2.0, rel=1e-3)  # the median of two: their mean
    third = _calibrate(tmp_path, runs, 1.2)
    assert _scale(third) == pytest.approx(1.2, rel=1e-3)  # 1.0, 3.0, 1.2: one slow calibration is outvoted
    assert third.created == "2026-12-07T10:03:00+00:00"  # the newest run's own fields
    assert third.notes[-1].startswith("pooled: each point the median over 3 calibrations")
    curve_point = third.curves["relu"][0][1] / synthetic_profile().curves["relu"][0][1]
    assert curve_point == pytest.approx(1.2, rel=1e-3)
    line = commands.trust_line(commands._profile_origin(third, None))
    assert line.startswith("calibration cached (each point the median of its latest 3 runs; the newest's fields)")
    assert "median of its latest" not in commands.trust_line(commands._profile_origin(first, None))
    with open(cache_file(str(tmp_path), KEY)) as f:  # what later jobs read is the pooled profile
        assert f.read() == third.to_json()
    assert len(os.listdir(device_profile.runs_dir(cache_file(str(tmp_path), KEY)))) == 3


def test_the_pool_takes_the_latest_runs_and_pool_1_takes_the_new_one_alone(tmp_path, runs):
    for scale in (5.0, 5.0, 1.0, 1.0, 1.0, 1.0):
        profile = _calibrate(tmp_path, runs, scale)
    assert _scale(profile) == pytest.approx(1.0, rel=1e-3)  # the two slow ones are older than the latest POOL_RUNS
    assert POOL_RUNS == 5 and profile.notes[-1].startswith(f"pooled: each point the median over {POOL_RUNS}")
    assert _scale(_calibrate(tmp_path, runs, 2.5, pool=1)) == pytest.approx(2.5, rel=1e-3)
    assert _scale(_calibrate(tmp_path, runs, 1.0, pool=2)) == pytest.approx(1.75, rel=1e-3)  # kept although unpooled


def test_runs_kept_are_bounded(tmp_path, runs):
    for _ in range(device_profile.POOL_KEPT + 3):
        _calibrate(tmp_path, runs, 1.0)
    assert len(os.listdir(device_profile.runs_dir(cache_file(str(tmp_path), KEY)))) == device_profile.POOL_KEPT


def test_a_stale_profile_forgets_its_runs(tmp_path, runs):
    _calibrate(tmp_path, runs, 2.0)
    _calibrate(tmp_path, runs, 2.0)
    assert mark_stale(cache_file(str(tmp_path), KEY), "batches ran 40% faster than predicted")
    folder = device_profile.runs_dir(cache_file(str(tmp_path), KEY))
    with open(os.path.join(folder, "2026-12-07T100500+0000-2.json.2.tmp"), "w") as f:
        f.write('{"half": ')  # another process writing its run: left to it
    runs.queue.append((1.0, "h", ()))
    fresh = device_profile.calibrate("cpu", threads=1, cache_dir=str(tmp_path))  # no refresh: the mark measures
    assert _scale(fresh) == pytest.approx(1.0, rel=1e-3) and not any("pooled" in note for note in fresh.notes)
    assert sorted(name.endswith(".tmp") for name in os.listdir(folder)) == [False, True]


def test_runs_of_another_host_or_clock_are_never_pooled(tmp_path, runs):
    _calibrate(tmp_path, runs, 4.0, host="other-host")
    _calibrate(tmp_path, runs, 4.0, notes=("clock: cpu (thread CPU time); 70.0 s wall",))
    assert _scale(_calibrate(tmp_path, runs, 1.0)) == pytest.approx(1.0, rel=1e-3)
    assert _scale(_calibrate(tmp_path, runs, 2.0)) == pytest.approx(1.5, rel=1e-3)


def test_an_unreadable_run_is_dropped_and_the_cache_still_pools(tmp_path, runs):
    _calibrate(tmp_path, runs, 1.0)
    folder = device_profile.runs_dir(cache_file(str(tmp_path), KEY))
    with open(os.path.join(folder, "2026-12-07T100000+0000-1.json"), "w") as f:
        f.write('{"version": 0}')  # another version's, or unreadable
    with open(os.path.join(folder, "2026-12-07T100500+0000-2.json.2.tmp"), "w") as f:
        f.write('{"half": ')  # another process writing its run: neither read nor removed
    assert _scale(_calibrate(tmp_path, runs, 3.0)) == pytest.approx(2.0, rel=1e-3)
    assert sorted(name.endswith(".tmp") for name in os.listdir(folder)) == [False, False, True]


def test_a_pool_below_one_stops_with_one_line(tmp_path, runs):
    with pytest.raises(ConfigError, match="pool must be a positive integer"):
        device_profile.calibrate("cpu", threads=1, cache_dir=str(tmp_path), refresh=True, pool=0)
    args = build_parser().parse_args(["profile", "--export", "x.json", "--pool", "3"])
    assert args.pool == 3
