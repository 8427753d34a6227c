"""A noisy host gets a calibration, with its measured spread and one warning; --strict keeps the refusal.

Timings are injected: nothing here calibrates, sleeps or starts a process (`device_profile._run`, the whole
benchmark run, is replaced by one whose repeated sample is judged from given numbers).
"""

from __future__ import annotations

import json
import logging

import pytest

from spark_cnn.cli import build_parser
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.spec import ModelSpec
from spark_cnn.perf.device_key import cache_path
from spark_cnn.perf.profile import DeviceProfile
from spark_cnn.perf_tools import commands
from spark_cnn.perf_tools.calibration import NoisyCalibration, device_profile
from spark_cnn.perf_tools.calibration.repeatability import REPEAT_BOUND, REPEAT_PASSES, judge_passes, repeat_passes
from tests.perf_doubles import synthetic_profile

BUSY = {"cores": 2, "loadavg_start": 1.0, "loadavg_end": 1.3, "steal_share": 0.0, "others_cpu_share": 0.01,
        "busy": False}
FIRST = [1.0] * 8  # the tables' minima of the sampled benchmarks, seconds


def _passes(*factors):
    """time_pass() stand-ins: each call returns the next pass, every benchmark at `factor` x its first time."""
    it = iter(factors)

    def one_pass():
        factor = next(it)
        return [factor * t for t in FIRST]
    return one_pass


# --- repeats and robust statistics -------------------------------------------------------------------------------

def test_a_repeat_hit_by_a_burst_is_outvoted_by_more_passes():
    rep = repeat_passes(FIRST, _passes(1.4, 1.0, 1.02))
    assert (rep.passes, rep.ok, rep.median_pct) == (3, True, 2.0)


def test_a_steady_first_repeat_takes_one_pass():
    assert repeat_passes(FIRST, _passes(1.03, 5.0)).passes == 1


def test_tables_that_disagree_with_every_repeat_stay_noisy_after_the_bounded_passes():
    rep = repeat_passes(FIRST, _passes(*[1.111, 1.2, 1.13, 1.4, 1.12, 9.0]))
    assert rep.passes == REPEAT_PASSES and not rep.ok
    assert rep.median_pct == 13.0  # the median of the five repeats, not the outlying one


def test_the_median_of_the_repeats_is_what_the_tables_are_judged_against():
    assert judge_passes(FIRST, [[1.5] * 8, [1.0] * 8, [1.04] * 8]).median_pct == 4.0
    assert judge_passes(FIRST, [[1.5] * 8]).median_pct == 50.0


# --- calibrate(): kept with its spread and one warning, or refused when strict -----------------------------------

@pytest.fixture
def noisy_host(monkeypatch):
    """calibrate() in-process with a run whose repeated sample differs from its tables by 11.1% on every pass
    (the user's report); returns the list of runs made."""
    runs = []

    def run(device, threads, key, budget_s, clock="wall"):
        runs.append(1)
        rep = repeat_passes(FIRST, _passes(*[1.111] * REPEAT_PASSES))
        return synthetic_profile(key=key, threads=threads, load=BUSY, repeatability=rep.as_dict())
    monkeypatch.setattr(device_profile, "_run", run)
    monkeypatch.setattr(device_profile, "_needs_sidecar_allocator", lambda: False)
    return runs


def test_a_noisy_host_gets_a_calibration_with_its_spread_and_one_warning_line(noisy_host, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        profile = device_profile.calibrate("cpu", threads=1, cache_dir=str(tmp_path), refresh=True)
    assert profile.noisy and profile.spread == pytest.approx(0.111)
    assert profile.repeatability["passes"] == REPEAT_PASSES and profile.repeatability["attempts"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "11.1%" in warnings[0] and "+-11.1%" in warnings[0] and "--strict" in warnings[0]
    # saved with the profile, and read back with it
    with open(cache_path("cpu", 1, str(tmp_path))) as f:
        cached = DeviceProfile.from_json(f.read())
    assert cached.noisy and cached.spread == profile.spread


def test_strict_keeps_the_one_line_refusal_and_caches_nothing(noisy_host, tmp_path):
    with pytest.raises(NoisyCalibration) as refused:
        device_profile.calibrate("cpu", threads=1, cache_dir=str(tmp_path), refresh=True, strict=True)
    message = str(refused.value)
    assert "\n" not in message and "too busy" in message
    assert f"differed by 11.1% (median of 8; bound {100 * REPEAT_BOUND:.1f}%) in 2 attempts" in message
    assert "without --strict" in message
    assert not list(tmp_path.glob("*.json"))


def test_strict_measures_a_cached_noisy_profile_again(noisy_host, tmp_path):
    device_profile.calibrate("cpu", threads=1, cache_dir=str(tmp_path), refresh=True)
    assert device_profile.calibrate("cpu", threads=1, cache_dir=str(tmp_path)).noisy  # the cache, as it is
    assert len(noisy_host) == 2
    with pytest.raises(NoisyCalibration):
        device_profile.calibrate("cpu", threads=1, cache_dir=str(tmp_path), strict=True)
    assert len(noisy_host) == 4


def test_a_profile_file_from_before_the_spread_still_reads_and_a_forced_one_counts_as_noisy():
    data = json.loads(synthetic_profile(repeatability={"median_pct": 30.0, "forced": True}).to_json())
    del data["spread"]
    old = DeviceProfile.from_json(json.dumps(data))
    assert old.spread == 0.0 and old.noisy
    assert not synthetic_profile().noisy


# --- the spread in the prediction, the flags ----------------------------------------------------------------------

def test_profile_points_carry_the_calibrations_spread_and_the_report_says_so(monkeypatch):
    noisy = synthetic_profile(load=BUSY, spread=0.12,
                              repeatability={**judge_passes(FIRST, [[1.12] * 8]).as_dict(), "noisy": True})
    monkeypatch.setattr("spark_cnn.perf_tools.calibration.calibrate", lambda *a, **k: noisy)
    result = commands.profile_model(ModelSpec(DIGITS_FACTORY), batch_sizes=[1, 8])
    for p in result["points"]:
        assert p["predicted_ms_low"] == pytest.approx(0.88 * p["predicted_ms"], abs=1e-3)
        assert p["predicted_ms_high"] == pytest.approx(1.12 * p["predicted_ms"], abs=1e-3)
    report = commands.profile_report(result)
    assert "+-12.0%" in report and "KEPT ALTHOUGH NOISY" in report and "--strict" in report


def test_strict_reaches_calibrate_and_the_old_flag_is_accepted_with_a_deprecation_line(monkeypatch, capsys):
    seen = {}

    def profile_model(spec, **options):
        seen.update(options)
        raise SystemExit(0)
    monkeypatch.setattr(commands, "profile_model", profile_model)
    parser = build_parser()
    args = parser.parse_args(["profile", "--model", "resnet18", "--strict"])
    with pytest.raises(SystemExit):
        args.run(args)
    assert seen["strict"] is True
    args = parser.parse_args(["profile", "--model", "resnet18", "--allow-noisy-calibration"])
    with pytest.raises(SystemExit):
        args.run(args)
    err = capsys.readouterr().err
    assert seen["strict"] is False and "--allow-noisy-calibration is deprecated" in err and err.count("\n") == 1
