"""Device profiles as files (export, import, refusal), plans from them (no device, --cores), and the checks that
make a calibration trustworthy: repeatability (measurements injected, nothing calibrated), host load, stale marks."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from spark_cnn.errors import ConfigError
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.spec import ModelSpec
from spark_cnn.perf import startpoint
from spark_cnn.perf.device_key import cache_path
from spark_cnn.perf.placement import DECODE_HEADROOM
from spark_cnn.perf.profile import (
    PROFILE_VERSION,
    DeviceProfile,
    export_profile,
    mark_stale,
    read_profile_file,
    stale_reason,
)
from spark_cnn.perf_tools import commands
from spark_cnn.perf_tools.calibration import NoisyCalibration, curve_bench, device_profile
from spark_cnn.perf_tools.calibration import calibrate as real_calibrate
from spark_cnn.perf_tools.calibration.curve_check import (
    RATIO_BOUNDS,
    RATIO_SIDES,
    transcendental_anomaly,
    transcendental_ratios,
)
from spark_cnn.perf_tools.calibration.harness import Budget
from spark_cnn.perf_tools.calibration.host_load import LoadSnapshot, load_between
from spark_cnn.perf_tools.calibration.repeatability import (
    ATTEMPTS,
    REPEAT_BOUND,
    SAMPLE_POINTS,
    SampledBench,
    judge,
    steady,
)
from tests.perf_doubles import CALL_WARMTH, WARMTH, synthetic_profile

QUIET = {"cores": 2, "loadavg_start": 0.1, "loadavg_end": 0.2, "steal_share": 0.0, "others_cpu_share": 0.02,
         "busy": False}
BUSY = {**QUIET, "others_cpu_share": 0.7, "busy": True}


def _steady(median_pct: float) -> dict:
    return judge([1.0] * 8, [1.0 + median_pct / 100] * 8).as_dict()


@pytest.fixture(autouse=True)
def _no_calibration(monkeypatch):
    """Nothing here may calibrate: a plan from a file needs no device."""
    def refuse(*args, **kwargs):
        raise AssertionError("calibrate() was called")
    monkeypatch.setattr("spark_cnn.perf_tools.calibration.calibrate", refuse)


# --- the file ----------------------------------------------------------------------------------------------------

def test_an_exported_profile_reads_back_equal_with_its_host_load_and_repeatability(tmp_path):
    profile = synthetic_profile(host="gpu-node-7", load=BUSY, repeatability=_steady(2.0), device="cuda:0",
                                device_name="NVIDIA H200", h2d=((1 << 20, 100.0), (1 << 24, 1500.0)))
    path = export_profile(profile, str(tmp_path / "device.json"))
    back = read_profile_file(path)
    assert back == profile
    assert (back.host, back.device_name, back.version, back.load["busy"]) == ("gpu-node-7", "NVIDIA H200",
                                                                            PROFILE_VERSION, True)
    assert json.loads(open(path).read())["torch_version"] == torch.__version__
    assert not list(tmp_path.glob("*.tmp"))  # written whole, then renamed


def test_a_profile_from_before_host_and_load_were_recorded_still_reads(tmp_path):
    data = json.loads(synthetic_profile().to_json())
    for name in ("host", "load", "repeatability"):
        del data[name]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = read_profile_file(str(tmp_path / "old.json"))
    assert (old.host, dict(old.load), dict(old.repeatability)) == ("", {}, {})


@pytest.mark.parametrize("text, says", [
    (lambda data: json.dumps({**data, "version": PROFILE_VERSION - 1}), f"version {PROFILE_VERSION - 1}"),
    (lambda data: "{not json", "not JSON"),
    (lambda data: json.dumps({"model": "resnet18", "points": []}), "no key and version"),
    (lambda data: json.dumps({**data, "threads": 0}), "threads must be >= 1"),
    (lambda data: json.dumps({**data, "surprise": 1}), "not a valid device profile"),
])
def test_a_profile_of_another_version_or_a_malformed_file_is_refused_in_one_line(tmp_path, text, says):
    path = tmp_path / "device.json"
    path.write_text(text(json.loads(synthetic_profile().to_json())))
    with pytest.raises(ConfigError) as refused:
        read_profile_file(str(path))
    message = str(refused.value)
    assert says in message and "\n" not in message and "--export" in message


def test_a_missing_profile_file_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"--device-profile .*nothing.json: cannot read it"):
        read_profile_file(str(tmp_path / "nothing.json"))


def test_a_job_option_reads_and_checks_the_file_before_anything_starts(tmp_path):
    from spark_cnn.config import InferenceOptions

    good, bad = tmp_path / "device.json", tmp_path / "bad.json"
    good.write_text(synthetic_profile().to_json())
    bad.write_text(json.dumps({**json.loads(synthetic_profile().to_json()), "version": 99}))
    options = InferenceOptions(ModelSpec(DIGITS_FACTORY), device_profile=str(good))
    assert DeviceProfile.from_json(options.run_options.device_profile) == synthetic_profile()
    assert "chars>" in repr(options.run_options)  # the JSON is named, not printed, in logs
    with pytest.raises(ConfigError, match="version 99"):
        InferenceOptions(ModelSpec(DIGITS_FACTORY), device_profile=str(bad))


# --- plans from a file -------------------------------------------------------------------------------------------

def _plan(path, cores):
    return commands.plan_job(ModelSpec(DIGITS_FACTORY), images=10_000, executors=3, cores=cores,
                             device_profile=str(path))


def test_plan_from_an_exported_cpu_profile_scales_with_the_cores_and_reports_per_executor_and_in_all(tmp_path):
    path = export_profile(synthetic_profile(host="laptop", load=QUIET), str(tmp_path / "cpu.json"))
    one, eight = _plan(path, 1), _plan(path, 8)
    assert eight["images_per_s_per_executor"] == pytest.approx(8 * one["images_per_s_per_executor"], rel=0.01)
    for plan in (one, eight):
        assert plan["images_per_s"] == pytest.approx(3 * plan["images_per_s_per_executor"], rel=0.01)
        assert plan["decode"] == "task" and plan["batch_size"] >= 1 and plan["profile"]["file"] == path
        assert plan["bottleneck"] == "cpu" and sum(plan["core_time_share"].values()) == pytest.approx(1.0)
    # the cores' time per image is decode + compute: neither alone is the rate
    stages = one["stages_images_per_s_per_executor"]
    assert 1 / stages["cpu"] == pytest.approx(1 / stages["decode_alone"] + 1 / stages["compute_alone"], rel=0.02)
    report = commands.plan_report(eight)
    assert "batch size" in report and "decode in task" in report and "per executor" in report
    assert "in all (3 x)" in report and "laptop" in report and "quiet host" in report


def test_plan_from_a_gpu_profile_uses_the_cores_for_decoding_only(tmp_path):
    gpu = synthetic_profile(device="cuda:0", device_name="NVIDIA H200", key="cuda-h200", decode_ms=4.0,
                            h2d=((1 << 20, 100.0), (1 << 24, 1500.0)), load=BUSY, host="gpu-node")
    path = export_profile(gpu, str(tmp_path / "gpu.json"))
    few = _plan(path, 1)
    compute = few["stages_images_per_s_per_executor"]["compute"]
    enough = math.ceil(DECODE_HEADROOM * compute * 4.0 / 1000) + 1  # cores that decode with headroom
    many = _plan(path, enough)
    assert many["stages_images_per_s_per_executor"]["compute"] == compute
    assert few["decode"] == "gpu" and many["decode"] == "task"  # 1 core cannot feed the device; enough can
    assert many["stages_images_per_s_per_executor"]["decode"] == pytest.approx(enough * 1000 / 4.0, rel=0.01)
    assert "warning" in commands.plan_report(few)  # a busy host's calibration is flagged


def test_plan_defaults_to_the_profile_hosts_cores(tmp_path):
    path = export_profile(synthetic_profile(load={**QUIET, "cores": 6}), str(tmp_path / "cpu.json"))
    assert _plan(path, None)["cores_per_executor"] == 6


# --- repeatability -------------------------------------------------------------------------------------------------

def test_judge_reports_the_median_and_largest_disagreement():
    rep = judge([1.0, 1.0, 1.0, 1.0, 2.0], [1.05, 0.9, 1.0, 1.2, 2.0])
    assert (rep.points, rep.median_pct, rep.max_pct) == (5, 5.0, 20.0)
    assert rep.ok and not judge([1.0] * 5, [1.3] * 5).ok
    assert judge([1.0, 1.0], [2.0, 2.0]).ok  # too few points to judge: accepted, and says how many


def _attempts(*medians):
    runs = iter(medians)
    calls = []

    def run():
        calls.append(1)
        return synthetic_profile(load=BUSY, repeatability=_steady(next(runs)))
    return run, calls


def test_a_calibration_that_repeats_is_kept_at_once():
    run, calls = _attempts(3.0)
    profile = steady(run, what="cpu", strict=True)
    assert len(calls) == 1 and profile.repeatability["attempts"] == 1 and not profile.repeatability["noisy"]


def test_a_noisy_calibration_is_repeated_and_kept_when_the_repeat_is_steady():
    run, calls = _attempts(40.0, 4.0)
    profile = steady(run, what="cpu", strict=True)
    assert len(calls) == 2 and profile.repeatability["attempts"] == 2 and profile.repeatability["median_pct"] == 4.0


def test_a_strict_calibration_noisy_every_time_is_refused_in_one_line_saying_how_to_keep_it():
    run, calls = _attempts(40.0, 30.0)
    with pytest.raises(NoisyCalibration) as refused:
        steady(run, what="cpu", strict=True)
    message = str(refused.value)
    assert len(calls) == ATTEMPTS and "\n" not in message
    assert "too busy" in message and "70%" in message and "30.0%" in message
    assert f"{100 * REPEAT_BOUND:.1f}%" in message and "without --strict" in message


def test_without_strict_the_steadiest_attempt_is_kept_with_its_spread_and_marked_noisy():
    run, _ = _attempts(40.0, 30.0)
    profile = steady(run, what="cpu")
    assert profile.repeatability["noisy"] and profile.repeatability["median_pct"] == 30.0 and profile.spread == 0.3
    assert any("kept although" in note and "+-30.0%" in note for note in profile.notes)
    assert "KEPT ALTHOUGH NOISY" in commands.trust_line(commands._profile_origin(profile, None))


def test_the_sampled_bench_keeps_a_bounded_sample_and_times_it_again():
    bench = SampledBench(torch.device("cpu"), Budget(60.0))
    bench.pollute = None  # the cache filler is irrelevant to what is kept
    x = torch.ones(64)
    for i in range(100):
        bench.time(lambda t, i=i: t + i, lambda: (x,))
    kept = len(bench._sample)
    assert SAMPLE_POINTS // 2 <= kept <= SAMPLE_POINTS  # thinned as it went, never grown past the bound
    rep = bench.time_again()
    assert rep.points == kept and rep.judged  # each kept benchmark was timed again
    assert not bench._sample



# --- implausible curves: a state of the host that outlasts a calibration ------------------------------------------

RECORDED = json.loads((Path(__file__).parent / "data" / "transcendental_curves.json").read_text())


def _curves(**ratio) -> dict:
    """relu at 0.8, 3.2 and 12.8 MB plus each named kind at `ratio` times relu's time at the same bytes."""
    relu = tuple((64 * s * s * 4.0, 0.05 * s * s) for s in RATIO_SIDES)
    return {"relu": relu, **{kind: tuple((b, r * us) for b, us in relu) for kind, r in ratio.items()}}


def test_transcendental_ratios_are_medians_over_the_sizes_against_relu_at_the_same_bytes():
    curves = _curves(silu=2.5, gelu=4.0)
    curves["sigmoid"] = tuple((b, us * r) for (b, us), r in zip(curves["relu"], (2.0, 9.0, 3.0), strict=True))
    assert transcendental_ratios(curves) == {"silu": 2.5, "sigmoid": 3.0, "gelu": 4.0}
    curves["gelu"] = curves["gelu"][:1]  # one size timed: a small budget, not judged
    assert transcendental_ratios(curves) == {"silu": 2.5, "sigmoid": 3.0}


def test_only_every_judged_transcendental_kind_beyond_its_bound_is_an_anomaly():
    assert transcendental_anomaly(_curves(silu=2.7, sigmoid=2.9, gelu=4.4), "cpu") is None
    slow = transcendental_anomaly(_curves(silu=10.7, sigmoid=9.2, gelu=11.6), "cpu")
    assert slow is not None and "silu 10.7x, sigmoid 9.2x, gelu 11.6x" in slow and "\n" not in slow
    assert transcendental_anomaly(_curves(silu=10.7, sigmoid=2.9, gelu=11.6), "cpu") is None  # one kind normal
    assert transcendental_anomaly(_curves(silu=10.7), "cpu") is None  # one kind says too little
    assert transcendental_anomaly(_curves(silu=10.7, sigmoid=9.2, gelu=11.6), "cuda:0") is None
    at_bounds = _curves(**RATIO_BOUNDS)
    assert transcendental_anomaly(at_bounds, "cpu") is None


@pytest.mark.parametrize("cls", ["normal", "anomalous"])
def test_the_recorded_calibrations_of_the_anomalous_hour_and_only_those_are_flagged(cls):
    """Every calibration of the project's zoo and held-out runs (git history), by hour: the check separates the
    17:13-18:08 UTC hour's 43 from the other 153 with no exception either way."""
    runs = RECORDED[cls]
    flagged = {run: sum(transcendental_anomaly(curves, "cpu") is not None for curves in cals)
               for run, cals in runs.items()}
    total = {run: len(cals) for run, cals in runs.items()}
    assert sum(total.values()) == (153 if cls == "normal" else 43)
    assert flagged == (total if cls == "anomalous" else dict.fromkeys(runs, 0))


def test_the_guarded_activations_and_only_those_are_timed_with_their_guard_on_the_cpu(monkeypatch):
    """silu, sigmoid and gelu run the sidecar's vector-math guard (one tiny matrix product) inside the timed
    call, as the sidecar runs them; no other kind does."""
    products = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *a, **k: (products.append(1), real_mm(*a, **k))[1])
    bench = SampledBench(torch.device("cpu"), Budget(60.0))
    calls = {}
    for kind, case in curve_bench.curve_cases(bench).items():
        fn, make = case(4)
        inputs = make()
        before = len(products)
        fn(*inputs)
        calls[kind] = len(products) - before
    assert {kind for kind, n in calls.items() if n} == {"silu", "sigmoid", "gelu"}
    assert all(n in (0, 1) for n in calls.values())


def _implausible_attempts(*anomalous):
    runs = iter(anomalous)
    calls = []

    def run():
        calls.append(1)
        rep = judge([1.0] * 8, [1.03] * 8)
        rep = dataclasses.replace(rep, anomalies=("transcendental operators timed slow",) if next(runs) else ())
        return synthetic_profile(load=QUIET, repeatability=rep.as_dict())
    return run, calls


def test_an_implausible_calibration_that_repeated_is_run_again_and_kept_when_the_repeat_is_plausible():
    run, calls = _implausible_attempts(True, False)
    profile = steady(run, what="cpu", strict=True)
    assert len(calls) == 2 and profile.repeatability["ok"] and not profile.repeatability["anomalies"]


def test_an_implausible_strict_calibration_every_time_is_refused_naming_the_anomaly_not_the_load():
    run, calls = _implausible_attempts(True, True)
    with pytest.raises(NoisyCalibration) as refused:
        steady(run, what="cpu", strict=True)
    message = str(refused.value)
    assert len(calls) == ATTEMPTS and "\n" not in message
    assert "transcendental operators timed slow" in message and "too busy" not in message
    assert "without --strict" in message


def test_an_implausible_calibration_kept_says_so_in_its_notes_and_its_trust_line():
    run, _ = _implausible_attempts(True, True)
    profile = steady(run, what="cpu")
    assert profile.noisy and any("kept although transcendental" in note for note in profile.notes)
    line = commands.trust_line(commands._profile_origin(profile, None))
    assert "KEPT ALTHOUGH IMPLAUSIBLE" in line and "transcendental operators timed slow" in line


# --- host load ------------------------------------------------------------------------------------------------------

def test_load_between_counts_what_other_processes_used_and_the_stolen_time():
    start = LoadSnapshot(0.0, 0.0, 0, 0, 0, 0.3)
    quiet = load_between(start, LoadSnapshot(10.0, 9.5, 1000, 1000, 0, 1.0), cores=2)
    busy = load_between(start, LoadSnapshot(10.0, 9.5, 1900, 100, 0, 2.9), cores=2)
    stolen = load_between(start, LoadSnapshot(10.0, 9.5, 1000, 800, 200, 1.0), cores=2)
    assert quiet["others_cpu_share"] == pytest.approx(0.025) and not quiet["busy"]
    assert busy["others_cpu_share"] == pytest.approx(0.475) and busy["busy"]
    assert stolen["steal_share"] == pytest.approx(0.1) and stolen["busy"]
    assert load_between(start, LoadSnapshot(1.0, 0.0, None, None, None, None), cores=2)["others_cpu_share"] is None


# --- stale marks ----------------------------------------------------------------------------------------------------

def test_a_profile_marked_stale_is_not_a_start_point_and_is_measured_again(tmp_path, monkeypatch):
    cache = str(tmp_path)
    path = cache_path("cpu", 1, cache)
    profile = dataclasses.replace(synthetic_profile(), key=device_profile.device_key("cpu", 1))
    with open(path, "w") as f:
        f.write(profile.to_json())
    assert startpoint.cached_profile("cpu", 1, cache) == profile
    assert not mark_stale(str(tmp_path / "absent.json"), "no profile there")
    assert mark_stale(path, "batches 1.6x faster than predicted")
    assert "1.6x faster" in stale_reason(path)
    assert startpoint.cached_profile("cpu", 1, cache) is None
    assert startpoint.cached_profile("cpu", 1, cache, include_stale=True) == profile

    fresh = dataclasses.replace(profile, created="2027-01-01T00:00:00+00:00", weight_warmth=WARMTH,
                                call_warmth=CALL_WARMTH)
    monkeypatch.setattr(device_profile, "_needs_sidecar_allocator", lambda: False)
    monkeypatch.setattr(device_profile, "_run", lambda *args, **kwargs: fresh)
    assert real_calibrate("cpu", threads=1, cache_dir=cache).created == fresh.created  # stale: measured again
    assert stale_reason(path) is None and startpoint.cached_profile("cpu", 1, cache).created == fresh.created
    monkeypatch.setattr(device_profile, "_run", lambda *args, **kwargs: pytest.fail("measured a fresh profile"))
    assert real_calibrate("cpu", threads=1, cache_dir=cache).created == fresh.created  # not stale: the cache


def test_a_cached_cpu_profile_without_a_warmth_probe_is_measured_again(tmp_path, monkeypatch):
    cache = str(tmp_path)
    key = device_profile.device_key("cpu", 1)
    monkeypatch.setattr(device_profile, "_needs_sidecar_allocator", lambda: False)
    monkeypatch.setattr(device_profile, "_run", lambda *args, **kwargs: pytest.fail("measured a fresh profile"))
    # calibrated with a budget too small for the probe: the cache, whatever budget is asked now
    quick = dataclasses.replace(synthetic_profile(), key=key, budget_s=device_profile.WARMTH_MIN_BUDGET_S - 1)
    with open(cache_path("cpu", 1, cache), "w") as f:
        f.write(quick.to_json())
    assert real_calibrate("cpu", threads=1, cache_dir=cache) == quick
    # calibrated with the time for it but before the probe existed: measured again
    older = dataclasses.replace(quick, budget_s=device_profile.DEFAULT_BUDGET_S)
    with open(cache_path("cpu", 1, cache), "w") as f:
        f.write(older.to_json())
    measured = dataclasses.replace(older, created="2027-01-01T00:00:00+00:00", weight_warmth=WARMTH,
                                   call_warmth=CALL_WARMTH)
    monkeypatch.setattr(device_profile, "_run", lambda *args, **kwargs: measured)
    assert real_calibrate("cpu", threads=1, cache_dir=cache).weight_warmth == measured.weight_warmth
    monkeypatch.setattr(device_profile, "_run", lambda *args, **kwargs: pytest.fail("measured a fresh profile"))
    again = real_calibrate("cpu", threads=1, cache_dir=cache)  # now it is the cache
    assert again.created == measured.created and again.call_warmth == measured.call_warmth
    # with the weights' probe but written before the calls' probe existed: measured again
    with open(cache_path("cpu", 1, cache), "w") as f:
        f.write(dataclasses.replace(measured, call_warmth={}).to_json())
    monkeypatch.setattr(device_profile, "_run", lambda *args, **kwargs: measured)
    assert real_calibrate("cpu", threads=1, cache_dir=cache).call_warmth == measured.call_warmth


def test_a_cached_profile_of_an_earlier_convolution_grid_is_measured_again(tmp_path, monkeypatch):
    from spark_cnn.perf.profile import CONV_GRID_REVISION

    cache = str(tmp_path)
    key = device_profile.device_key("cpu", 1)
    monkeypatch.setattr(device_profile, "_needs_sidecar_allocator", lambda: False)
    current = dataclasses.replace(synthetic_profile(), key=key, weight_warmth=WARMTH, call_warmth=CALL_WARMTH)
    assert current.conv_grid == CONV_GRID_REVISION
    monkeypatch.setattr(device_profile, "_run", lambda *args, **kwargs: pytest.fail("measured a fresh profile"))
    with open(cache_path("cpu", 1, cache), "w") as f:
        f.write(current.to_json())
    assert real_calibrate("cpu", threads=1, cache_dir=cache) == current
    # a file written before revisions were recorded reads as revision 0, and is measured again
    older = json.loads(current.to_json())
    del older["conv_grid"]
    assert DeviceProfile.from_json(json.dumps(older)).conv_grid == 0
    with open(cache_path("cpu", 1, cache), "w") as f:
        f.write(json.dumps(older))
    measured = dataclasses.replace(current, created="2027-01-01T00:00:00+00:00")
    monkeypatch.setattr(device_profile, "_run", lambda *args, **kwargs: measured)
    assert real_calibrate("cpu", threads=1, cache_dir=cache).created == measured.created


def test_a_sidecar_starts_from_the_jobs_profile_when_it_is_for_its_kind_of_device(tmp_path, monkeypatch):
    from spark_cnn.models.digits import DigitsCNN

    monkeypatch.setenv(startpoint.CACHE_DIR_ENV, str(tmp_path))  # an empty cache: only the job's profile
    cpu, gpu = synthetic_profile().to_json(), synthetic_profile(device="cuda:0").to_json()
    start = startpoint.predicted_start(DigitsCNN(), (3, 32, 32), "cpu", threads=1, max_size=64, profile_json=cpu)
    assert start is not None and start[2] == "job" and start[0] in start[1] and set(start[1]) == {1, 2, 4, 8, 16,
                                                                                                  32, 64}
    # a GPU's profile says nothing about this CPU: the (empty) cache decides
    assert startpoint.predicted_start(DigitsCNN(), (3, 32, 32), "cpu", threads=1, max_size=64,
                                      profile_json=gpu) is None


def test_an_export_to_a_missing_folder_stops_before_calibrating(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):  # the autouse fixture fails any calibration
        commands.export_device("cpu", str(tmp_path / "no" / "device.json"))
