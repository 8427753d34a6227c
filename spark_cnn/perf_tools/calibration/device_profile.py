"""`calibrate()`: the device profile (spark_cnn.perf.profile.DeviceProfile) of one device, read from its cache on
disk or measured by running the benchmarks (spark_cnn.perf_tools.calibration's *_bench modules) in turn.

A profile is JSON under `~/.cache/spark_cnn/devices/` named by its key (CPU model, cores, threads, torch
version; or GPU name), and `calibrate` reuses it unless `refresh=True` or a job marked it stale
(spark_cnn.perf.profile.mark_stale). Each run times a sample of its benchmarks again and is repeated when they disagree,
then kept with its spread and a warning (refused when strict; repeatability.py); the profile records that and
the host's load while it ran (host_load.py). Each run is also kept beside the cache (`<key>.runs/`), and the
cached profile pools the latest `pool` of them, each point their median (pooled_profile.py): one run prices
each point in whatever spell of the host it met. A profile a job marked stale forgets its runs.
The benchmarks run in a process with the sidecar's malloc settings (spark_cnn.task.sidecar_env), as the sidecar
and validation do: calibrate() starts one when the calling process has other settings.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone

import torch

from spark_cnn.errors import ConfigError
from spark_cnn.models.timing import CLOCKS
from spark_cnn.perf.device_key import cpu_name, device_key, resolve_device
from spark_cnn.perf.profile import (
    CONV_GRID_REVISION,
    DEFAULT_CACHE_DIR,
    PROFILE_VERSION,
    DeviceProfile,
    cache_file,
    clear_stale,
    stale_reason,
)
from spark_cnn.perf_tools.calibration.call_warmth_bench import time_call_warmth
from spark_cnn.perf_tools.calibration.conv_bench import time_convolutions
from spark_cnn.perf_tools.calibration.curve_bench import time_curves
from spark_cnn.perf_tools.calibration.curve_check import transcendental_anomaly
from spark_cnn.perf_tools.calibration.fault_bench import time_faults
from spark_cnn.perf_tools.calibration.gemm_bench import WARMTH_MIN_BUDGET_S, time_gemms, time_weight_warmth
from spark_cnn.perf_tools.calibration.harness import Budget
from spark_cnn.perf_tools.calibration.host_load import load_between, snapshot, ticks_per_second
from spark_cnn.perf_tools.calibration.repeatability import NoisyCalibration, SampledBench, noisy_warning, steady
from spark_cnn.perf_tools.calibration.stage_bench import time_decode, time_h2d, time_sidecar_stages
from spark_cnn.perf_tools.child_env import sidecar_child_env
from spark_cnn.perf_tools.pooled_profile import POOL_RUNS, pool_profiles, poolable_runs
from spark_cnn.task.sidecar_env import RETAINED, allocator_of, cpu_threads

# The profile's data, its key and its cache file are the runtime's (spark_cnn.perf.profile, .device_key); the
# names below that come from there are kept for calibration's callers.
__all__ = ["DEFAULT_BUDGET_S", "DEFAULT_CACHE_DIR", "GPU_MAX_BUDGET_S", "POOL_KEPT", "POOL_RUNS", "PROFILE_VERSION",
           "DeviceProfile", "calibrate", "device_key", "runs_dir"]

# Calibration should take under a minute on a CPU (each section stops at its deadline). 55 s, with the repeat
# at the end and the process's start, keeps within that and fits the whole calibration on the slowest host
# measured, which took 46 s (at 45 s, 7 of 10 calibrations on it cut points, mostly large-batch convolutions).
DEFAULT_BUDGET_S = 55.0
# ... and under half a minute on a GPU: a CUDA calibration is capped at 25 s whatever budget it is given.
GPU_MAX_BUDGET_S = 25.0
# Runs kept beside a cached profile, whatever `pool` a call asks for (about 80 KB each on a CPU).
POOL_KEPT = 10

_log = logging.getLogger(__name__)


def calibrate(device: str = "cpu", *, threads: int | None = None, budget_s: float = DEFAULT_BUDGET_S,
              cache_dir: str | None = None, refresh: bool = False, clock: str = "wall",
              strict: bool = False, pool: int = POOL_RUNS) -> DeviceProfile:
    """The DeviceProfile of `device` with `threads` torch threads (CPU; default: the sidecar's, half the
    cores), from the cache under `cache_dir` unless `refresh`, else measured in about `budget_s` seconds
    (at most GPU_MAX_BUDGET_S on CUDA) and cached. `clock` (CLOCKS; "cpu" on the CPU only) is what the
    benchmarks and the budget are read from: "cpu" on a busy host gives the profile an idle host would, in
    `budget_s` of CPU time and more wall time.

    A cached profile a job marked stale is measured again. A run whose repeated sample disagrees is run once
    more, then kept with its measured spread (`DeviceProfile.spread`, `noisy`) and one warning logged, or
    refused (repeatability.NoisyCalibration) when `strict`; a strict call measures a cached noisy profile again.
    What is cached and returned pools the new run with up to `pool` - 1 earlier runs of this device on this host
    (pooled_profile.poolable_runs; 1: the new run alone), each point their median; its other fields are the new
    run's. Earlier runs are forgotten when the cached profile was marked stale: they may share its load.

    >>> calibrate("cpu", threads=1, budget_s=1.0, cache_dir="/tmp/x").threads   # doctest: +SKIP
    1
    """
    if not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise ConfigError(f"calibrate: budget_s must be a positive number of seconds, got {budget_s!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"calibrate: threads must be a positive integer or None, got {threads!r}")
    resolved = resolve_device(device)
    if clock not in CLOCKS or (clock == "cpu" and resolved.type != "cpu"):
        raise ConfigError(f"calibrate: clock must be one of {', '.join(CLOCKS)} ('cpu' on the CPU only), "
                          f"got {clock!r}")
    if isinstance(pool, bool) or not isinstance(pool, int) or pool < 1:
        raise ConfigError(f"calibrate: pool must be a positive integer (1: this calibration alone), got {pool!r}")
    threads = cpu_threads(threads)
    if clock == "cpu" and threads != 1:
        raise ConfigError(f"calibrate: clock 'cpu' times the calling thread: it needs threads=1, not {threads}")
    key = device_key(str(resolved), threads)
    path = cache_file(cache_dir, key)
    if not refresh and os.path.exists(path) and stale_reason(path) is None:
        try:
            with open(path) as f:
                cached = DeviceProfile.from_json(f.read())
            if not _predates_calibration(cached, resolved) and not (strict and cached.noisy):
                return cached
        except (OSError, ConfigError):
            pass  # unreadable or of another version: measure again and overwrite
    if resolved.type == "cuda":
        budget_s = min(budget_s, GPU_MAX_BUDGET_S)
    elif _needs_sidecar_allocator():
        return _warned(_calibrate_in_child(device, threads, float(budget_s), path, clock, strict, pool))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run = steady(lambda: _run(resolved, threads, key, float(budget_s), clock), what=str(resolved),
                     strict=strict)
    finally:
        torch.set_num_threads(previous)
    if stale_reason(path) is not None:
        _forget_runs(path)
    profile = _pooled(run, path, pool)
    _write(path, profile.to_json())
    clear_stale(path)
    return _warned(profile)


def runs_dir(path: str) -> str:
    """Where the runs behind the cached profile at `path` are kept, one file each."""
    return f"{os.path.splitext(path)[0]}.runs"


def _pooled(run: DeviceProfile, path: str, pool: int) -> DeviceProfile:
    """Keep `run` beside the cache; `run` pooled with the earlier runs that poolable_runs takes (itself alone
    when none). Runs beyond the latest POOL_KEPT, and unreadable ones, are deleted."""
    folder = runs_dir(path)
    _write(os.path.join(folder, f"{run.created.replace(':', '')}-{os.getpid()}.json"), run.to_json())
    runs = []
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".json")):  # not another process's .tmp
        file = os.path.join(folder, name)
        try:
            with open(file) as f:
                runs.append((DeviceProfile.from_json(f.read()), file))
        except (OSError, ConfigError):  # of another version, or unreadable
            _remove(file)
    runs.sort(key=lambda pair: pair[0].created, reverse=True)
    for _, file in runs[POOL_KEPT:]:
        _remove(file)
    chosen = poolable_runs([r for r, _ in runs[:POOL_KEPT]], run, pool)
    return run if len(chosen) == 1 else pool_profiles(chosen, "median")


def _forget_runs(path: str) -> None:
    folder = runs_dir(path)
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        if name.endswith(".json"):  # another process's .tmp is its own to rename
            _remove(os.path.join(folder, name))


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, path)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _warned(profile: DeviceProfile) -> DeviceProfile:
    """`profile`, once a calibration kept noisy has been reported in one line (a calibration child's own line
    is not shown: its parent reports what it read back)."""
    if profile.noisy:
        _log.warning(noisy_warning(profile, profile.device))
    return profile


def _predates_calibration(cached: DeviceProfile, device: torch.device) -> bool:
    """Whether a cached profile lacks what this calibration measures: the warmth probes its budget should
    have timed, or the convolution grid's latest shapes (CONV_GRID_REVISION); such a profile is measured again."""
    lacks_warmth = ((not cached.weight_warmth or not cached.call_warmth)
                    and _measures_warmth(device, cached.budget_s))
    return lacks_warmth or cached.conv_grid < CONV_GRID_REVISION


def _measures_warmth(device: torch.device, budget_s: float) -> bool:
    """Whether a calibration of `device` with `budget_s` times the warmth probes (a CPU's, given enough
    time); a cached profile whose budget should have timed them and that lacks one is measured again."""
    return device.type == "cpu" and budget_s >= WARMTH_MIN_BUDGET_S


# Set in the child calibrate() starts with the sidecar's malloc settings: it measures in-process, whatever
# allocator_of() says (a C library other than glibc never reads those settings).
_IN_CHILD_ENV = "SPARK_CNN_CALIBRATION_CHILD"


def _needs_sidecar_allocator() -> bool:
    """True when this process's malloc is not the sidecar's (its settings apply only from a process's start).
    Large tensors time differently under the two, even with their page faults taken out, enough to make a
    profile mislead the tuner (docs/perf-model.md, "Calibration")."""
    return os.environ.get(_IN_CHILD_ENV) != "1" and platform.libc_ver()[0] == "glibc" and allocator_of() != RETAINED


def _calibrate_in_child(device: str, threads: int, budget_s: float, path: str, clock: str,
                        strict: bool, pool: int) -> DeviceProfile:
    """calibrate() in a fresh process started with the sidecar's malloc settings; it writes the cache file."""
    env = sidecar_child_env(**{_IN_CHILD_ENV: "1"})
    code = ("import sys; from spark_cnn.perf_tools.calibration import calibrate; "
            "calibrate(sys.argv[1], threads=int(sys.argv[2]), budget_s=float(sys.argv[3]), "
            "cache_dir=sys.argv[4], refresh=True, clock=sys.argv[5], strict=sys.argv[6] == '1', "
            "pool=int(sys.argv[7]))")
    done = subprocess.run([sys.executable, "-c", code, device, str(threads), repr(budget_s),
                           os.path.dirname(path), clock, "1" if strict else "0", str(pool)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        if tail[0].startswith(f"{NoisyCalibration.__module__}.{NoisyCalibration.__name__}: "):
            raise NoisyCalibration(tail[0].split(": ", 1)[1])
        raise ConfigError(f"calibrate: the calibration process failed ({tail[0]}); run it in-process with "
                          f"{_IN_CHILD_ENV}=1 to see the whole error")
    with open(path) as f:
        return DeviceProfile.from_json(f.read())


def _run(device: torch.device, threads: int, key: str, budget_s: float, clock: str = "wall") -> DeviceProfile:
    budget = Budget(budget_s, CLOCKS[clock])
    wall_start = time.perf_counter()
    load_start = snapshot()
    bench = SampledBench(device, budget)
    with torch.inference_mode():
        fault_us, mmap_threshold = time_faults(bench)
        bench.fault_us = fault_us
        curves, call_us = time_curves(bench)
        conv, conv_call_us, conv_weight_us = time_convolutions(bench, threads)
        gemm = time_gemms(bench)
        bench.budget.section("warmth")  # the probes run whole; their share keeps them off the later deadlines
        warmth = time_weight_warmth(bench) if _measures_warmth(device, budget_s) else {}
        call_warmth = time_call_warmth(bench) if _measures_warmth(device, budget_s) else {}
        curves.update(time_sidecar_stages(bench))
        decode_ms = time_decode(bench)
        h2d = time_h2d(bench)
        repeatability = bench.time_again()
    anomaly = transcendental_anomaly(curves, device.type)
    repeatability = replace(repeatability, anomalies=(anomaly,) if anomaly else ())
    load = load_between(load_start, snapshot(), cores=os.cpu_count() or 1, ticks_per_s=ticks_per_second())
    notes = tuple(f"{section}: {n} point(s) skipped to keep within the {budget_s:.0f} s budget"
                  for section, n in budget.skipped.items())
    if clock != "wall":
        notes += (f"clock: {clock} (thread CPU time); {time.perf_counter() - wall_start:.1f} s wall",)
    if device.type == "cpu":  # the vector path torch dispatched to: what transcendental kinds' speed rests on
        notes += (f"allocator: {allocator_of()}", f"cpu capability: {torch.backends.cpu.get_cpu_capability()}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return DeviceProfile(key=key, device=str(device), threads=threads,
                         created=datetime.now(timezone.utc).isoformat(timespec="seconds"), device_name=name,
                         torch_version=torch.__version__, calibration_s=round(budget.elapsed(), 2),
                         budget_s=budget_s, fault_us_per_page=fault_us, mmap_threshold_bytes=mmap_threshold,
                         call_us=call_us, curves=curves, conv=tuple(conv), conv_call_us=conv_call_us,
                         conv_weight_us_per_mib=conv_weight_us, gemm=tuple(gemm), decode_ms=decode_ms, h2d=h2d,
                         notes=notes, host=socket.gethostname(), load=load,
                         repeatability=repeatability.as_dict(), weight_warmth=warmth,
                         call_warmth=call_warmth, conv_grid=CONV_GRID_REVISION)
