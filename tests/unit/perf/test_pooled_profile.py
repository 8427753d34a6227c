"""Pooling a sweep's calibrations point by point, and judging a stored sweep against the pooled profile."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from spark_cnn.errors import ConfigError
from spark_cnn.perf_tools import zoo
from spark_cnn.perf_tools.generated_nets import frozen_set
from spark_cnn.perf_tools.pooled_profile import STATISTICS, pool_profiles
from spark_cnn.perf_tools.validate_command import add_arguments, run
from tests.perf_doubles import synthetic_profile

SETTINGS = {"input_shape": [3, 64, 64], "clock": "wall", "threads": 1, "repeats": 3, "warmup": 1,
            "point_budget_s": 1.0, "attribute_at": 0}


def _scaled(profile, factor: float, **changes):
    """`profile` with every convolution, GEMM and curve point `factor` times as slow."""
    return dataclasses.replace(
        profile, conv=tuple({**c, "us": c["us"] * factor} for c in profile.conv),
        gemm=tuple({**g, "us": g["us"] * factor} for g in profile.gemm),
        curves={k: tuple((b, us * factor) for b, us in pts) for k, pts in profile.curves.items()}, **changes)


def test_each_point_is_pooled_over_every_calibration_that_timed_it():
    base = synthetic_profile()
    first = _scaled(base, 1.0, created="2026-01-01T00:00:00+00:00")
    slow = _scaled(base, 3.0, created="2026-01-02T00:00:00+00:00")
    extra = {**base.conv[0], "cin": 27, "us": 123.0}  # a point only the latest calibration reached
    latest = _scaled(base, 2.0, created="2026-01-03T00:00:00+00:00", decode_ms=9.0)
    latest = dataclasses.replace(latest, conv=(*latest.conv, extra))
    for statistic, factor in (("median", 2.0), ("min", 1.0)):
        pooled = pool_profiles([first, latest, slow], statistic)
        assert [c["us"] for c in pooled.conv[:-1]] == [round(c["us"] * factor, 2) for c in base.conv]
        assert pooled.conv[-1] == {**extra, "us": 123.0}
        assert [g["us"] for g in pooled.gemm] == [round(g["us"] * factor, 2) for g in base.gemm]
        kind = next(iter(base.curves))
        assert pooled.curves[kind] == tuple((b, us * factor) for b, us in base.curves[kind])
        # what is not a table of points is the latest calibration's, and the profile says it was pooled
        assert pooled.created == latest.created and pooled.decode_ms == 9.0
        assert pooled.notes[-1] == f"pooled: each point the {statistic} over 3 calibrations of synthetic"


def test_pooling_refuses_other_devices_unknown_statistics_and_nothing():
    with pytest.raises(ConfigError, match="of 2 devices .*one device only"):
        pool_profiles([synthetic_profile(), synthetic_profile(key="other")], "median")
    with pytest.raises(ConfigError, match="must be one of median, min, got 'mean'"):
        pool_profiles([synthetic_profile()], "mean")
    with pytest.raises(ConfigError, match="no profiles"):
        pool_profiles([], "min")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--generated", "--batch-sizes", "1,8", *argv])


def test_a_stored_sweep_is_judged_against_its_pooled_calibrations_without_measuring(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "generated.json")
    names = [f"spark_cnn.perf_tools.generated_nets:{net.name}" for net in frozen_set()[:2]]
    # the second network's calibration met a slow spell: three times slower at every point
    made = iter([synthetic_profile(created="2026-01-01T00:00:00+00:00"),
                 _scaled(synthetic_profile(), 3.0, created="2026-01-02T00:00:00+00:00")])
    zoo.sweep(path, names, [1, 8], sweeps=1, settings=SETTINGS, gflops={n: 0.1 for n in names},
              log=lambda line: None, measure=lambda *args: (5.0, 0.01, "retained"), calibrate=lambda: next(made))

    def no_calibration(*args, **kwargs):
        raise AssertionError("--judge-pooled must measure nothing")
    monkeypatch.setattr("spark_cnn.perf_tools.calibration.calibrate", no_calibration)
    stored = open(path).read()
    predicted = {}
    for statistic in STATISTICS:  # the command offers each (its choices are spelled there without torch)
        markdown = tmp_path / f"{statistic}.md"
        assert run(_args("--json", path, "--judge-pooled", statistic, "--markdown", str(markdown))) == 0
        table = markdown.read_text()
        assert table.startswith(f"Judged against one profile pooled from the sweep's 2 calibrations, each point "
                                f"their {statistic} ({path}; nothing measured again).")
        row = next(line for line in table.splitlines() if line.startswith(f"| {names[1]} "))
        predicted[statistic] = row
    capsys.readouterr()
    assert open(path).read() == stored
    # the fastest of the two prices the second network as its own fast calibration would; the median (of two:
    # their mean) prices it slower, so their errors differ
    assert predicted["median"] != predicted["min"]


def test_judging_pooled_needs_a_stored_sweep_with_its_own_calibrations(tmp_path):
    with pytest.raises(ConfigError, match="give its file with --json"):
        run(_args("--judge-pooled", "min"))
    not_json, other = tmp_path / "notes.json", tmp_path / "other.json"
    not_json.write_text("not json")
    other.write_text('{"profile": "cpu", "results": []}')  # validate --models' file, not a sweep
    for wrong in (not_json, other):
        with pytest.raises(ConfigError, match="is not a zoo sweep"):
            run(_args("--json", str(wrong), "--judge-pooled", "min"))
    path = str(tmp_path / "common.json")
    name = f"spark_cnn.perf_tools.generated_nets:{frozen_set()[0].name}"
    zoo.sweep(path, [name], [1, 8], sweeps=1, settings=SETTINGS,
              gflops={}, log=lambda line: None, measure=lambda *args: (5.0, 0.01, "retained"))
    with pytest.raises(ConfigError, match="holds no calibration of its own: .*--calibrate-each"):
        run(_args("--json", path, "--judge-pooled", "median"))
