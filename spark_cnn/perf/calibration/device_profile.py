"""The device profile: what calibration measured on one device, cached on disk per device, and `calibrate()`,
which reads it from the cache or runs the benchmarks (spark_cnn.perf.calibration's *_bench modules) in turn.

A profile is JSON under `~/.cache/spark_cnn/devices/` named by its key (CPU model, cores, threads, torch
version; or GPU name), and `calibrate` reuses it unless `refresh=True` or a job marked it stale
(profile_file.mark_stale). Each run times a sample of its benchmarks again and is repeated when they disagree,
then kept with its spread and a warning (refused when strict; repeatability.py); the profile records that and
the host's load while it ran (host_load.py).
The benchmarks run in a process with the sidecar's malloc settings (spark_cnn.task.sidecar_env), as the sidecar
and validation do: calibrate() starts one when the calling process has other settings.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import torch

from spark_cnn.errors import ConfigError
from spark_cnn.models.timing import CLOCKS
from spark_cnn.perf.calibration.call_warmth_bench import time_call_warmth
from spark_cnn.perf.calibration.conv_bench import CONV_GRID_REVISION, time_convolutions
from spark_cnn.perf.calibration.curve_bench import time_curves
from spark_cnn.perf.calibration.curve_check import transcendental_anomaly
from spark_cnn.perf.calibration.fault_bench import time_faults
from spark_cnn.perf.calibration.gemm_bench import WARMTH_MIN_BUDGET_S, time_gemms, time_weight_warmth
from spark_cnn.perf.calibration.harness import Budget
from spark_cnn.perf.calibration.host_load import load_between, snapshot, ticks_per_second
from spark_cnn.perf.calibration.profile_file import clear_stale, stale_reason
from spark_cnn.perf.calibration.repeatability import NoisyCalibration, SampledBench, noisy_warning, steady
from spark_cnn.perf.calibration.stage_bench import time_decode, time_h2d, time_sidecar_stages
from spark_cnn.perf.child_env import sidecar_child_env
from spark_cnn.task.sidecar_env import RETAINED, allocator_of, cpu_threads

__all__ = ["DEFAULT_BUDGET_S", "DEFAULT_CACHE_DIR", "GPU_MAX_BUDGET_S", "PROFILE_VERSION", "DeviceProfile",
           "cache_path", "calibrate", "device_key", "file_slug"]

# Bumped whenever a table changes meaning: cached profiles of another version are measured again (the
# versions' changes are listed in docs/perf-model.md, "Calibration").
PROFILE_VERSION = 6
# Calibration should take under a minute on a CPU; 45 s leaves room for a loaded machine (each section stops
# at its deadline).
DEFAULT_BUDGET_S = 45.0
# ... and under half a minute on a GPU: a CUDA calibration is capped at 25 s whatever budget it is given.
GPU_MAX_BUDGET_S = 25.0
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "spark_cnn", "devices")

_log = logging.getLogger(__name__)


def _frozen(value: Any) -> Any:
    """JSON lists -> tuples, recursively (dict values too), so a loaded profile cannot be changed in place."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class DeviceProfile:
    """What calibration measured on one device with one thread count. Times are microseconds unless named.

    - `curves`: operator kind -> ((tensor bytes at fp32, us per call), ...), ascending: per-call time without
      page faults, of relu (in place), batch_norm, add, max_pool2d_k3s2 (keyed by output bytes), ... .
    - `conv`: one dict per timed convolution: cin, cout, kernel, stride, groups, in_hw, out_hw, batch,
      backend ("mkldnn" or "slow2d", torch's choice), us (without faults), faults (per call).
    - `conv_call_us`, `conv_weight_us_per_mib`: a oneDNN convolution's fixed cost per call, and per MiB of
      weights (reordered to its blocked layout on every call from a plain NCHW module).
    - `gemm`: one dict per timed nn.Linear: rows, in_features, out_features, us.
    - `fault_us_per_page`: first touch of a fresh page and its release; `mmap_threshold_bytes`: allocations
      this large get fresh pages on every call (glibc's largest dynamic mmap threshold).
    - `call_us`: overhead of a call that moves no data: "module" (nn.Flatten), "function" (torch.flatten),
      "container" (what an nn.Sequential adds around its child: every non-leaf module of a network pays it).
    - `decode_ms`: decode + resize + crop of one JPEG on one core; `h2d`: ((bytes, us), ...) pinned copies.
    - `host`: where it was calibrated; `load`: how busy that host was meanwhile (host_load.load_between);
      `repeatability`: how far a sample of benchmarks moved when timed again (repeatability.py), and in how
      many attempts, and whether it was kept `noisy` (beyond its bound on every attempt). Profiles written
      before these were recorded read them as empty.
    - `spread`: the relative interval its predictions carry, +-: the median disagreement between the tables
      and their repeats (repeatability.py); 0.0 in profiles written before it was recorded.
    - `weight_warmth` (CPU): how a linear layer slows down when more data passed through the cache since its
      last call (gemm_bench.time_weight_warmth); empty on a GPU, with a small budget, and in profiles written
      before it was measured (calibrate() measures those again), which then price weights as the GEMM table.
    - `call_warmth` (CPU): how much faster small operators' calls run in a chain of layers than calibration
      times them, against the bytes written between calls (call_warmth_bench.time_call_warmth); empty where
      `weight_warmth` is, and then calls bound by their overhead cost what calibration measured.
    - `conv_grid`: the revision of the convolution grid timed (conv_bench.CONV_GRID_REVISION; 0 in profiles
      written before revisions were recorded). A profile of an earlier one reads its classes as it has them
      (a missing class from its kin) and calibrate() measures a cached one again.
    """

    key: str
    device: str                # "cpu" or "cuda:0"
    threads: int               # torch threads the benchmarks ran with
    created: str               # ISO 8601, UTC
    device_name: str
    torch_version: str
    calibration_s: float
    budget_s: float
    fault_us_per_page: float
    mmap_threshold_bytes: int
    call_us: dict[str, float]
    curves: dict[str, tuple[tuple[float, float], ...]]
    conv: tuple[dict[str, Any], ...]
    conv_call_us: float
    conv_weight_us_per_mib: float
    gemm: tuple[dict[str, Any], ...]
    decode_ms: float
    h2d: tuple[tuple[float, float], ...] = ()
    notes: tuple[str, ...] = ()
    version: int = PROFILE_VERSION
    host: str = ""
    load: dict[str, Any] = field(default_factory=dict)
    repeatability: dict[str, Any] = field(default_factory=dict)
    weight_warmth: dict[str, Any] = field(default_factory=dict)
    call_warmth: dict[str, Any] = field(default_factory=dict)
    conv_grid: int = CONV_GRID_REVISION
    spread: float = 0.0

    def __post_init__(self):
        if self.threads < 1:
            raise ConfigError(f"DeviceProfile {self.key!r}: threads must be >= 1, got {self.threads}")
        for name in ("call_us", "curves", "load", "repeatability", "weight_warmth", "call_warmth"):
            object.__setattr__(self, name, _frozen(dict(getattr(self, name))))
        for name in ("conv", "gemm", "h2d", "notes"):
            object.__setattr__(self, name, _frozen(list(getattr(self, name))))

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def noisy(self) -> bool:
        """Kept although its repeats disagreed beyond their bound, or timed implausibly, on every attempt
        ("forced" in profiles written while that took --allow-noisy-calibration)."""
        return bool(self.repeatability.get("noisy", self.repeatability.get("forced", False)))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DeviceProfile:
        """The profile in `text`; ConfigError when it is not one, or of another PROFILE_VERSION."""
        try:
            data = json.loads(text)
            version = data.get("version")
            if version != PROFILE_VERSION:
                raise ConfigError(f"device profile version {version!r}, expected {PROFILE_VERSION}: calibrate "
                                  "again (calibrate(..., refresh=True) or delete the cached file)")
            data.setdefault("conv_grid", 0)  # written before the grid's revisions were recorded
            return cls(**data)
        except ConfigError:
            raise
        except (ValueError, TypeError, AttributeError) as e:
            raise ConfigError(f"not a device profile ({type(e).__name__}: {e}); calibrate again with "
                              "refresh=True") from e


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _resolve(device: str) -> torch.device:
    if device in ("cuda", "gpu"):
        device = "cuda:0"
    try:
        resolved = torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"calibrate: unknown device {device!r}; use 'cpu' or 'cuda[:N]'") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"calibrate: device {device!r} asked for but CUDA is not available; use device='cpu'")
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"calibrate: device {device!r} is not supported; use 'cpu' or 'cuda[:N]'")
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda:0")
    return resolved


def device_key(device: str = "cpu", threads: int | None = None) -> str:
    """The cache key of a device: what changes the timings (CPU model, cores, torch threads; GPU name) and
    the torch version (kernels change between releases).

    >>> device_key("cpu", 1).startswith("cpu-")
    True
    """
    resolved = _resolve(device)
    version = torch.__version__.split("+")[0]
    if resolved.type == "cuda":
        name = torch.cuda.get_device_name(resolved)
        return file_slug(f"cuda-{name}-torch{version}")
    threads = cpu_threads(threads)
    return file_slug(f"cpu-{_cpu_name()}-{os.cpu_count()}c-{threads}t-torch{version}")


def file_slug(text: str) -> str:
    """`text` as a file name every system takes: runs of other characters become one `_`."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")


def _cache_path(cache_dir: str | None, key: str) -> str:
    return os.path.join(os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR), f"{key}.json")


def cache_path(device: str = "cpu", threads: int | None = None, cache_dir: str | None = None) -> str:
    """Where calibrate() caches the profile of `device` with `threads` (it may not exist yet)."""
    return _cache_path(cache_dir, device_key(device, threads))


def calibrate(device: str = "cpu", *, threads: int | None = None, budget_s: float = DEFAULT_BUDGET_S,
              cache_dir: str | None = None, refresh: bool = False, clock: str = "wall",
              strict: bool = False) -> DeviceProfile:
    """The DeviceProfile of `device` with `threads` torch threads (CPU; default: the sidecar's, half the
    cores), from the cache under `cache_dir` unless `refresh`, else measured in about `budget_s` seconds
    (at most GPU_MAX_BUDGET_S on CUDA) and cached. `clock` (CLOCKS; "cpu" on the CPU only) is what the
    benchmarks and the budget are read from: "cpu" on a busy host gives the profile an idle host would, in
    `budget_s` of CPU time and more wall time.

    A cached profile a job marked stale is measured again. A run whose repeated sample disagrees is run once
    more, then kept with its measured spread (`DeviceProfile.spread`, `noisy`) and one warning logged, or
    refused (repeatability.NoisyCalibration) when `strict`; a strict call measures a cached noisy profile again.

    >>> calibrate("cpu", threads=1, budget_s=1.0, cache_dir="/tmp/x").threads   # doctest: +SKIP
    1
    """
    if not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise ConfigError(f"calibrate: budget_s must be a positive number of seconds, got {budget_s!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"calibrate: threads must be a positive integer or None, got {threads!r}")
    resolved = _resolve(device)
    if clock not in CLOCKS or (clock == "cpu" and resolved.type != "cpu"):
        raise ConfigError(f"calibrate: clock must be one of {', '.join(CLOCKS)} ('cpu' on the CPU only), "
                          f"got {clock!r}")
    threads = cpu_threads(threads)
    if clock == "cpu" and threads != 1:
        raise ConfigError(f"calibrate: clock 'cpu' times the calling thread: it needs threads=1, not {threads}")
    key = device_key(str(resolved), threads)
    path = _cache_path(cache_dir, key)
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
        return _warned(_calibrate_in_child(device, threads, float(budget_s), path, clock, strict))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        profile = steady(lambda: _run(resolved, threads, key, float(budget_s), clock), what=str(resolved),
                         strict=strict)
    finally:
        torch.set_num_threads(previous)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        f.write(profile.to_json())
    os.replace(partial, path)
    clear_stale(path)
    return _warned(profile)


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
                        strict: bool) -> DeviceProfile:
    """calibrate() in a fresh process started with the sidecar's malloc settings; it writes the cache file."""
    env = sidecar_child_env(**{_IN_CHILD_ENV: "1"})
    code = ("import sys; from spark_cnn.perf.calibration import calibrate; "
            "calibrate(sys.argv[1], threads=int(sys.argv[2]), budget_s=float(sys.argv[3]), "
            "cache_dir=sys.argv[4], refresh=True, clock=sys.argv[5], strict=sys.argv[6] == '1')")
    done = subprocess.run([sys.executable, "-c", code, device, str(threads), repr(budget_s),
                           os.path.dirname(path), clock, "1" if strict else "0"], env=env, capture_output=True,
                          text=True)
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
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return DeviceProfile(key=key, device=str(device), threads=threads,
                         created=datetime.now(timezone.utc).isoformat(timespec="seconds"), device_name=name,
                         torch_version=torch.__version__, calibration_s=round(budget.elapsed(), 2),
                         budget_s=budget_s, fault_us_per_page=fault_us, mmap_threshold_bytes=mmap_threshold,
                         call_us=call_us, curves=curves, conv=tuple(conv), conv_call_us=conv_call_us,
                         conv_weight_us_per_mib=conv_weight_us, gemm=tuple(gemm), decode_ms=decode_ms, h2d=h2d,
                         notes=notes, host=socket.gethostname(), load=load,
                         repeatability=repeatability.as_dict(), weight_warmth=warmth,
                         call_warmth=call_warmth, conv_grid=CONV_GRID_REVISION)
