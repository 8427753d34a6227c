"""Device calibration: a short set of micro-benchmarks -> a `DeviceProfile`, cached on disk per device.

`calibrate("cpu")` times generic operators on the device, with the thread count the sidecar uses, and never
the network being predicted (nor any torchvision model):

- convolutions over a grid of shapes (regular k=1/3/5/7/11, strided, depthwise, grouped; 3 to 2048 channels,
  1 to 224 pixels) at a small and a medium batch, those with small outputs also at a large one, and the fixed
  cost of one call (weights reordered per call);
- linear layers (GEMMs) from 256 to 9216 inputs at 1 to 64 rows;
- elementwise, normalisation, pooling, concatenation and copy operators at sizes from 4 KB to 105 MB, which
  give their per-call overhead, their cache and memory bandwidth in one curve per operator;
- the cost of fresh memory pages (a first touch faults them in, a free returns them), which large batches pay
  on every call in a process with glibc's malloc defaults (which map big tensors fresh each time);
- the sidecar's own input normalisation and output heads, image decoding per core, and on CUDA the
  host-to-device copy.

The benchmarks run in a process with the sidecar's malloc settings (spark_cnn.task.sidecar_env), as the
sidecar and validation do: calibrate() starts one when the calling process has other settings.

Every timing is the minimum of repeated calls after a warm-up, under `torch.inference_mode`. Each also counts
the minor page faults of one call; the profile stores times *without* their faults (count x cost per fault),
so the time model can add the faults a network's own allocations cause instead of the benchmark's.

A profile is JSON under `~/.cache/spark_cnn/devices/` named by its key (CPU model, cores, threads, torch
version; or GPU name), and `calibrate` reuses it unless `refresh=True`.

>>> profile = calibrate("cpu", budget_s=2.0, cache_dir="/tmp/spark_cnn-doctest")   # doctest: +SKIP
>>> profile.threads, len(profile.conv) > 0                                         # doctest: +SKIP
(1, True)
"""

from __future__ import annotations

import json
import math
import mmap
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

import torch
from torch import nn

from spark_cnn.errors import ConfigError
from spark_cnn.task.sidecar_env import cpu_threads

__all__ = ["DEFAULT_BUDGET_S", "DEFAULT_CACHE_DIR", "GPU_MAX_BUDGET_S", "PROFILE_VERSION", "DeviceProfile",
           "Timing", "calibrate", "device_key", "measure"]

# Bumped whenever a table changes meaning: cached profiles of another version are measured again.
# 2: convolutions with small outputs also at LARGE_CONV_BATCH, GEMMs also at 2 and 4 rows.
# 3: measured with the sidecar's malloc settings; grouped convolutions at LARGE_CONV_BATCH; curves to 105 MB.
PROFILE_VERSION = 3
# The issue allows 60 s on a CPU; 45 s leaves room for a loaded machine (each point stops at its deadline).
DEFAULT_BUDGET_S = 45.0
# The issue allows 30 s on a GPU: a CUDA calibration is capped at 25 s whatever budget it is given.
GPU_MAX_BUDGET_S = 25.0
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "spark_cnn", "devices")

# Share of the budget per section, in the order they run; a section gets its share plus what earlier ones
# left, never what later ones would leave. The convolution grid gets most (conv + conv_large): convolutions
# are most of a CNN's time and their efficiency varies most with shape. Sized from the sections' times in a
# 29 s calibration at load 0.4 to 2 (faults 0.8 s, curves 11.6, conv 8.5, conv_large 5.2, gemm 2.2, sidecar
# 0.1, decode 1.6): at the default budget each section's deadline is at least 1.38 times when it ended
# there. The curves, first, get the most headroom: at 0.22 they had skipped 8 to 30 points; at load 3 they
# needed ~20 s (skipped points are the sign of a busy host: calibrate on a quiet one).
SECTION_SHARES = {"faults": 0.04, "curves": 0.36, "conv": 0.26, "conv_large": 0.14, "gemm": 0.08, "sidecar": 0.03,
                  "decode": 0.05, "h2d": 0.04}
# Calls timed per point after one warm-up; the minimum is kept. 3 was the fewest that, on the noisy 2-core
# development host, gave the same table twice within a few per cent; calls over LONG_CALL_S get 2, and
# calls short enough get up to MAX_REPEATS within SHORT_CALLS_S.
REPEATS = 3
LONG_CALL_S = 0.05
SHORT_CALLS_S = 0.01
MAX_REPEATS = 10
WARMUP = 1
# Convolutions are timed at a small and a medium batch: per-image time changes with the batch (weights are
# reordered once per call; large activations leave the cache), and the time model interpolates in between.
CONV_BATCHES = (1, 8)
# ... and at a large batch where the output is small: oneDNN's GEMM has batch x out_hw^2 rows, which at
# 7-14 px and batch 8 are too few to run at full speed. Sized from checks of grid shapes (one thread, thread
# CPU time, min of 2-3, load 0.8 to 2), per image at batch 32 against 8: regular 3x3 -13 to -16% at 7 px, -2
# to -4.5% at 13-14 px, -2 to +1% at 28 px, 0% at 56 px; oneDNN pointwise (from batch 16 to 32) -2 to -9% at
# 7 px, -1 to -2% at 14-28 px. Depthwise and grouped convolutions are timed there at every size: memory-bound,
# they get dearer per image once a batch's activations leave the cache (+10 to +65% at 7-14 px), which the
# model must know too (without them mobilenet_v3_small at batch 64 was predicted 14.8% fast).
LARGE_CONV_BATCH = 32
LARGE_CONV_MAX_OUT_HW = 14
# A GPU needs larger batches to fill: timed where the sidecar runs it (its auto batch on CUDA is 64).
CUDA_CONV_BATCHES = (8, 64)
# 1x1 convolutions at batch >= 16 run on oneDNN instead of a GEMM per image (one thread): timed there too.
POINTWISE_ONEDNN_BATCH = 16
# Rows of the GEMM table. 2 and 4: a large linear layer at a few rows streams its weights from DRAM, which
# interpolating between 1 and 8 rows missed (alexnet at batch 2 -19.7%); their 18 points add 0.3 s (the
# section alone: 1.02 s of CPU time at rows 1, 8, 64, 1.29 s with 2 and 4, load 1.7).
GEMM_ROWS = (1, 2, 4, 8, 64)
# Elementwise sizes: 64 channels of s x s pixels, 4 KB to 105 MB at fp32 (1 to 26 M elements). The largest is a
# batch-64 activation of the first layers: beyond the L3 cost per byte still grew (relu 28 us/MB at 51 MB, 46
# at 205 MB, under the sidecar's malloc settings), so extrapolating from 51 MB under-predicted large batches.
CURVE_SIDES = (4, 14, 28, 56, 112, 224, 448, 640)
FAULT_PROBE_BYTES = (48 << 20, 96 << 20)   # above glibc's largest mmap threshold (32 MiB): fresh pages every call
PAGE_BYTES = resource.getpagesize()
DECODE_IMAGES = 12
NORMALISE_BATCHES = (1, 8, 32)
HEADS_ROWS = (1, 8, 64)
H2D_MIB = (1, 8, 64)
# Sidecar output heads: softmax and top-k over the classes (spark_cnn.models.heads), at ImageNet's width.
HEADS_CLASSES = 1000


# --- the profile ---------------------------------------------------------------------------------------------


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

    def __post_init__(self):
        if self.threads < 1:
            raise ConfigError(f"DeviceProfile {self.key!r}: threads must be >= 1, got {self.threads}")
        for name in ("call_us", "curves"):
            object.__setattr__(self, name, _frozen(dict(getattr(self, name))))
        for name in ("conv", "gemm", "h2d", "notes"):
            object.__setattr__(self, name, _frozen(list(getattr(self, name))))

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

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
            return cls(**data)
        except ConfigError:
            raise
        except (ValueError, TypeError, AttributeError) as e:
            raise ConfigError(f"not a device profile ({type(e).__name__}: {e}); calibrate again with "
                              "refresh=True") from e


# --- timing ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """The timed calls of one benchmark: seconds and minor page faults of each, in call order."""

    seconds: tuple[float, ...]
    faults: tuple[int, ...]

    @property
    def best_s(self) -> float:
        return min(self.seconds)

    @property
    def median_s(self) -> float:
        return sorted(self.seconds)[len(self.seconds) // 2]

    @property
    def spread(self) -> float:
        """(median - best) / best: how much the repeats disagreed."""
        return (self.median_s - self.best_s) / self.best_s if self.best_s > 0 else 0.0

    def best_without_faults_s(self, fault_s: float) -> float:
        """The fastest call once each call's own page faults (at `fault_s` each) are taken out. Faults come
        and go between calls of one benchmark (the allocator returns memory to the kernel now and then), so
        they are taken out call by call; never below a twentieth of the call."""
        return min(max(t - f * fault_s, 0.05 * t) for t, f in zip(self.seconds, self.faults, strict=True))


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# What a benchmark's time is read from. "wall": elapsed time, what a batch's latency is. "cpu": the calling
# thread's CPU time (user + system, so page faults count), the same as "wall" for one torch thread on an idle
# host, and far steadier on a busy one, where wall time also counts the time other processes held the core
# (development host at load 15 on 2 cores: resnet18 batch 8 wall 1100-1346 ms, thread CPU time 307-318 ms).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def measure(fn: Callable[..., Any], *, repeats: int = REPEATS, warmup: int = WARMUP,
            sync: Callable[[], None] | None = None, max_s: float | None = None,
            before: Callable[[], tuple] | None = None, clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time `fn()`: `warmup` untimed calls, then up to `repeats` timed ones (fewer once `max_s` is spent).

    `sync` is called after each call before the clock stops (torch.cuda.synchronize for CUDA work).
    `before`, untimed, runs before every call and returns the arguments of that call: fresh inputs, made
    as a network's previous layer would make them.

    >>> t = measure(lambda: sum(range(1000)), repeats=3)
    >>> len(t.seconds), t.best_s <= t.median_s
    (3, True)
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats} warmup={warmup}")
    sync = sync or (lambda: None)
    before = before or tuple
    for _ in range(warmup):
        fn(*before())
        sync()
    seconds: list[float] = []
    faults: list[int] = []
    for _ in range(repeats):
        args = before()
        sync()
        faults_before = _minor_faults()
        start = clock()
        fn(*args)
        sync()
        seconds.append(clock() - start)
        faults.append(_minor_faults() - faults_before)
        del args
        if max_s is not None and sum(seconds) > max_s:
            break
    return Timing(seconds=tuple(seconds), faults=tuple(faults))


class _Budget:
    """Deadlines per section: a section stops taking points when its share (plus what earlier ones left) is
    spent, so a small budget gives a sparser profile, never a longer run."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.start = clock()
        self.total_s = total_s
        self.share_end = 0.0
        self.skipped: dict[str, int] = {}

    def section(self, name: str) -> float:
        self.share_end += SECTION_SHARES[name]
        return self.start + self.total_s * self.share_end

    def elapsed(self) -> float:
        return self.clock() - self.start


# --- device identity and cache -------------------------------------------------------------------------------


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
        return _slug(f"cuda-{name}-torch{version}")
    threads = cpu_threads(threads)
    return _slug(f"cpu-{_cpu_name()}-{os.cpu_count()}c-{threads}t-torch{version}")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")


def _cache_path(cache_dir: str | None, key: str) -> str:
    return os.path.join(os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR), f"{key}.json")


def calibrate(device: str = "cpu", *, threads: int | None = None, budget_s: float = DEFAULT_BUDGET_S,
              cache_dir: str | None = None, refresh: bool = False, clock: str = "wall") -> DeviceProfile:
    """The DeviceProfile of `device` with `threads` torch threads (CPU; default: the sidecar's, half the
    cores), from the cache under `cache_dir` unless `refresh`, else measured in about `budget_s` seconds
    (at most GPU_MAX_BUDGET_S on CUDA) and cached. `clock` (CLOCKS; "cpu" on the CPU only) is what the
    benchmarks and the budget are read from: "cpu" on a busy host gives the profile an idle host would, in
    `budget_s` of CPU time and more wall time.

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
    if not refresh and os.path.exists(path):
        try:
            with open(path) as f:
                return DeviceProfile.from_json(f.read())
        except (OSError, ConfigError):
            pass  # unreadable or of another version: measure again and overwrite
    if resolved.type == "cuda":
        budget_s = min(budget_s, GPU_MAX_BUDGET_S)
    elif _needs_sidecar_allocator():
        return _calibrate_in_child(device, threads, float(budget_s), path, clock)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        profile = _run(resolved, threads, key, float(budget_s), clock)
    finally:
        torch.set_num_threads(previous)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        f.write(profile.to_json())
    os.replace(partial, path)
    return profile


# Set in the child calibrate() starts with the sidecar's malloc settings: it measures in-process, whatever
# allocator_of() says (a C library other than glibc never reads those settings).
_IN_CHILD_ENV = "SPARK_CNN_CALIBRATION_CHILD"


def _needs_sidecar_allocator() -> bool:
    """True when this process's malloc is not the sidecar's (its settings apply only from a process's start).

    Large tensors behave differently under the two: with glibc's defaults a 49 MB batch norm input is mapped
    afresh each call, and even with its page faults taken out it measured 152 us/MB, against 72 us/MB under
    the sidecar's settings (development host, one thread); max pooling 687 against 429. A profile measured
    so over-predicted every validation network at batch 64 by 5-6%."""
    from spark_cnn.task.sidecar_env import RETAINED, allocator_of
    return os.environ.get(_IN_CHILD_ENV) != "1" and platform.libc_ver()[0] == "glibc" and allocator_of() != RETAINED


def _calibrate_in_child(device: str, threads: int, budget_s: float, path: str, clock: str) -> DeviceProfile:
    """calibrate() in a fresh process started with the sidecar's malloc settings; it writes the cache file."""
    from spark_cnn.task.sidecar_env import sidecar_environment
    env = sidecar_environment()
    env[_IN_CHILD_ENV] = "1"
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)  # this spark_cnn
    code = ("import sys; from spark_cnn.perf.calibrate import calibrate; "
            "calibrate(sys.argv[1], threads=int(sys.argv[2]), budget_s=float(sys.argv[3]), "
            "cache_dir=sys.argv[4], refresh=True, clock=sys.argv[5])")
    done = subprocess.run([sys.executable, "-c", code, device, str(threads), repr(budget_s),
                           os.path.dirname(path), clock], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"calibrate: the calibration process failed ({tail[0]}); run it in-process with "
                          f"{_IN_CHILD_ENV}=1 to see the whole error")
    with open(path) as f:
        return DeviceProfile.from_json(f.read())


# --- the benchmarks ------------------------------------------------------------------------------------------


class _Bench:
    """Shared state of one calibration run: the device, the budget, the fault cost found first."""

    def __init__(self, device: torch.device, budget: _Budget):
        self.device = device
        self.budget = budget
        self.cuda = device.type == "cuda"
        self.sync = (lambda: torch.cuda.synchronize(device)) if self.cuda else None
        self.fault_us = 0.0
        self.pollute = None if self.cuda else torch.empty(_last_level_cache_bytes() // 2 // 4).fill_(1.0)

    def time(self, fn: Callable[..., Any], fresh: Callable[[], tuple] | None = None) -> Timing:
        """REPEATS calls after a warm-up; 2 when a call is longer than LONG_CALL_S, more when it is short.

        Each call starts as a layer inside a network does (CPU): the cache holds other data (`pollute`, half
        the last-level cache, is written first), the operator's weights and code have to come back, and its
        inputs were just made by another operator into new memory (`fresh()` returns them). Timed hot in a
        loop on the same input, small operators ran 1.5 to 3 times faster than inside the development
        networks (an in-place ReLU of 6 MB: 90 us hot, 180 us after a batch norm made its input); after a
        flush of the whole cache, several times slower."""
        def before() -> tuple:
            if self.pollute is not None:
                self.pollute.mul_(1.0)
            return fresh() if fresh is not None else ()
        clock = self.budget.clock
        first = measure(fn, repeats=1, warmup=WARMUP, sync=self.sync, before=before, clock=clock)
        if first.best_s > LONG_CALL_S:
            repeats = 1
        else:  # short calls are cheap to repeat and noisier: up to SHORT_CALLS_S of them
            repeats = min(MAX_REPEATS, max(REPEATS, int(SHORT_CALLS_S / max(first.best_s, 1e-7)))) - 1
        more = measure(fn, repeats=repeats, warmup=0, sync=self.sync, before=before, clock=clock)
        return Timing(first.seconds + more.seconds, first.faults + more.faults)

    def us_without_faults(self, timing: Timing) -> float:
        """Microseconds per call less the page faults the benchmark itself caused (CPU only)."""
        return timing.best_without_faults_s(self.fault_us * 1e-6) * 1e6

    def points(self, section: str, items: Iterable[Any]) -> Iterable[Any]:
        deadline = self.budget.section(section)
        items = list(items)
        for i, item in enumerate(items):
            if i > 0 and self.budget.clock() > deadline:
                self.budget.skipped[section] = len(items) - i
                return
            yield item

    def tensor(self, *shape: int) -> torch.Tensor:
        """Random values; 4-D tensors channels-last, the layout the sidecar's CNNs run in on every device:
        on CUDA the runner converts to it, on the CPU normalising NHWC pixels yields it and it propagates."""
        x = torch.rand(*shape, device=self.device)
        return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


# When the cache size cannot be read: the development host's L3.
FALLBACK_LAST_LEVEL_CACHE_BYTES = 32 << 20


def _last_level_cache_bytes() -> int:
    """The largest CPU cache of cpu0 (sysfs), e.g. 32 MiB of L3."""
    sizes = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
            sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    except (OSError, ValueError):
        pass
    return max(sizes) if sizes else FALLBACK_LAST_LEVEL_CACHE_BYTES


def _run(device: torch.device, threads: int, key: str, budget_s: float, clock: str = "wall") -> DeviceProfile:
    budget = _Budget(budget_s, CLOCKS[clock])
    wall_start = time.perf_counter()
    bench = _Bench(device, budget)
    with torch.inference_mode():
        fault_us, mmap_threshold = _fault_cost(bench)
        bench.fault_us = fault_us
        curves, call_us = _curves(bench)
        conv, conv_call_us, conv_weight_us = _convolutions(bench, threads)
        gemm = _gemms(bench)
        curves.update(_sidecar_stages(bench))
        decode_ms = _decode(bench)
        h2d = _h2d(bench)
    notes = tuple(f"{section}: {n} point(s) skipped to keep within the {budget_s:.0f} s budget"
                  for section, n in budget.skipped.items())
    if clock != "wall":
        notes += (f"clock: {clock} (thread CPU time); {time.perf_counter() - wall_start:.1f} s wall",)
    if device.type == "cpu":
        from spark_cnn.task.sidecar_env import allocator_of
        notes += (f"allocator: {allocator_of()}",)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return DeviceProfile(key=key, device=str(device), threads=threads,
                         created=datetime.now(timezone.utc).isoformat(timespec="seconds"), device_name=name,
                         torch_version=torch.__version__, calibration_s=round(budget.elapsed(), 2),
                         budget_s=budget_s, fault_us_per_page=fault_us, mmap_threshold_bytes=mmap_threshold,
                         call_us=call_us, curves=curves, conv=tuple(conv), conv_call_us=conv_call_us,
                         conv_weight_us_per_mib=conv_weight_us, gemm=tuple(gemm), decode_ms=decode_ms, h2d=h2d,
                         notes=notes)


# glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts: a freed mmapped chunk raises the threshold up to this,
# so in steady state smaller tensors come from the heap and larger ones are mapped (and faulted) every call.
GLIBC_MMAP_THRESHOLD_MAX = 32 << 20


def _fault_cost(bench: _Bench) -> tuple[float, int]:
    """Microseconds per fresh page: a tensor on a new anonymous mapping filled and unmapped, minus the same fill
    of a kept tensor. The mapping is made here, not by malloc: under the sidecar's malloc settings (which
    calibration runs with) malloc never maps and never returns memory, so its tensors would not fault."""
    if bench.cuda:
        return 0.0, 0
    costs = []
    for nbytes in bench.points("faults", FAULT_PROBE_BYTES):
        numel = nbytes // 4
        kept = torch.empty(numel)
        reuse = bench.time(lambda kept=kept: kept.fill_(1.0))
        fresh = bench.time(lambda nbytes=nbytes: _fill_fresh_mapping(nbytes))
        for seconds, faults in zip(fresh.seconds, fresh.faults, strict=True):
            if faults >= 0.5 * numel * 4 / PAGE_BYTES:
                costs.append(max(seconds - reuse.best_s, 0.0) * 1e6 / faults)
        del kept
    costs.sort()
    return (costs[len(costs) // 2] if costs else 0.0), GLIBC_MMAP_THRESHOLD_MAX


def _fill_fresh_mapping(nbytes: int) -> None:
    pages = mmap.mmap(-1, nbytes)
    try:
        view = torch.frombuffer(pages, dtype=torch.float32)
        view.fill_(1.0)
        del view
    finally:
        pages.close()


# Per-kind elementwise benchmarks: side -> (call, fresh inputs). Tensors are (1, 64, s, s); in-place kinds act
# in place as torchvision's modules do (ReLU(inplace=True), `out += identity`). Inputs are made fresh before
# each call by the operator that makes them in a CNN: a convolution for normalisation, an elementwise
# operator (standing for the normalisation or activation before) for everything else.
Case = Callable[[int], tuple[Callable[..., Any], Callable[[], tuple]]]


def _fresh(*sources: torch.Tensor) -> Callable[[], tuple]:
    """New copies of `sources` made by an elementwise operator, as a previous layer's outputs."""
    return lambda: tuple(source * 1.0 for source in sources)


def _curve_cases(bench: _Bench) -> dict[str, Case]:
    """Kind -> a function of the side s that gives the call and the maker of its inputs."""
    def unary(module: nn.Module) -> Case:
        def make(side: int):
            module.to(bench.device)
            return module, _fresh(bench.tensor(1, 64, side, side) - 0.5)
        return make

    def binary(inplace: bool) -> Case:
        def make(side: int):
            x, identity = bench.tensor(1, 64, side, side), bench.tensor(1, 64, side, side)
            made = _fresh(x)
            if inplace:
                return (lambda a, b: a.add_(b)), (lambda: (*made(), identity))
            return (lambda a, b: a + b), (lambda: (*made(), identity))
        return make

    def scale(side: int):  # squeeze-excitation: per-channel scale, broadcast over the pixels
        return (lambda s, x: s * x), _fresh(bench.tensor(1, 64, 1, 1), bench.tensor(1, 64, side, side))

    def batch_norm(side: int):
        bn = nn.BatchNorm2d(64).eval().to(bench.device)
        producer = nn.Conv2d(64, 64, 1, bias=False).eval().to(bench.device)
        x = bench.tensor(1, 64, side, side)
        return bn, (lambda: (producer(x),))

    def max_pool(kernel: int, stride: int) -> Case:
        def make(side: int):
            pool = nn.MaxPool2d(kernel, stride, padding=kernel // 2 if stride == 1 else 0, ceil_mode=True)
            return pool, _fresh(bench.tensor(1, 64, side * stride, side * stride))  # `side` is the output's
        return make

    def global_avg_pool(side: int):
        return nn.AdaptiveAvgPool2d(1), _fresh(bench.tensor(1, 64, side, side))

    def mean(side: int):
        return (lambda x: x.mean([2, 3])), _fresh(bench.tensor(1, 64, side, side))

    def cat(side: int):
        return (lambda a, b: torch.cat([a, b], 1)), _fresh(bench.tensor(1, 32, side, side),
                                                           bench.tensor(1, 32, side, side))

    def shuffle_copy(side: int):  # a transposed view made contiguous (channel shuffle)
        return ((lambda x: x.view(1, 2, 32, side, side).transpose(1, 2).contiguous()),
                _fresh(bench.tensor(1, 64, side, side)))

    return {"relu": unary(nn.ReLU(inplace=True)), "hardswish": unary(nn.Hardswish(inplace=True)),
            "batch_norm": batch_norm, "add": binary(True), "add_out": binary(False),
            "max_pool2d_k3s2": max_pool(3, 2), "max_pool2d_k3s1": max_pool(3, 1), "max_pool2d_k2s2": max_pool(2, 2),
            "relu6": unary(nn.ReLU6(inplace=True)), "silu": unary(nn.SiLU(inplace=True)),
            "hardsigmoid": unary(nn.Hardsigmoid(inplace=True)), "sigmoid": unary(nn.Sigmoid()),
            "gelu": unary(nn.GELU()), "mul": scale, "cat": cat, "copy": shuffle_copy,
            "adaptive_avg_pool2d": global_avg_pool, "mean": mean, "relu_out": unary(nn.ReLU())}


def _curves(bench: _Bench) -> tuple[dict[str, tuple], dict[str, float]]:
    """Per kind, microseconds per call without faults against the bytes of its (fp32) output; for the global
    pools and means, of their input. Sizes interleave so a small budget still spans them."""
    cases = _curve_cases(bench)
    order = [CURVE_SIDES[i] for i in (0, 4, 2, 6, 3, 5, 1, 7)]
    points: dict[str, list[tuple[float, float]]] = {kind: [] for kind in cases}
    work = [(side, kind) for side in order for kind in cases]
    for side, kind in bench.points("curves", work):
        fn, fresh = cases[kind](side)
        timing = bench.time(fn, fresh)
        points[kind].append((float(64 * side * side * 4), bench.us_without_faults(timing)))
        del fn, fresh
    flatten_module, flatten = nn.Flatten(), torch.flatten
    leaf, container = nn.Identity(), nn.Sequential(nn.Identity())
    x = bench.tensor(1, 64, 1, 1)
    call_us = {"module": bench.time(flatten_module, lambda: (x,)).best_s * 1e6,
               "function": bench.time(lambda t: flatten(t, 1), lambda: (x,)).best_s * 1e6,
               "container": max(bench.time(container, lambda: (x,)).best_s - bench.time(leaf, lambda: (x,)).best_s,
                                0.0) * 1e6}
    return {kind: tuple(sorted(p)) for kind, p in points.items() if p}, call_us


# The convolution grid: (cin, cout, kernel, stride, groups, in_hw). Generic shapes on the manifold CNNs live on
# (channels x pixels per side between ~900 and ~7000), plus channel counts off the multiples of 16 that oneDNN
# blocks by, 3-channel image inputs, strides, depthwise and grouped. Ordered so a prefix spans the kinds.
CONV_GRID: tuple[tuple[int, int, int, int, int, int], ...] = (
    (64, 64, 3, 1, 1, 56), (256, 64, 1, 1, 1, 56), (96, 96, 3, 1, 96, 56), (3, 32, 3, 2, 1, 224),
    (128, 128, 3, 1, 1, 28), (64, 256, 1, 1, 1, 56), (144, 144, 3, 2, 144, 56), (3, 64, 7, 2, 1, 224),
    (256, 256, 3, 1, 1, 14), (512, 128, 1, 1, 1, 28), (240, 240, 5, 1, 240, 28), (48, 48, 3, 1, 6, 56),
    (512, 512, 3, 1, 1, 7), (128, 512, 1, 1, 1, 28), (672, 672, 5, 2, 672, 14), (128, 128, 3, 1, 8, 28),
    (32, 32, 3, 1, 1, 112), (1024, 256, 1, 1, 1, 14), (32, 32, 3, 1, 32, 112), (3, 64, 11, 4, 1, 224),
    (64, 128, 3, 2, 1, 56), (256, 1024, 1, 1, 1, 14), (576, 576, 5, 1, 576, 7), (208, 208, 3, 1, 26, 14),
    (24, 24, 3, 1, 1, 56), (2048, 512, 1, 1, 1, 7), (1152, 1152, 3, 1, 1152, 7), (440, 440, 3, 1, 55, 7),
    (48, 48, 3, 1, 1, 28), (512, 2048, 1, 1, 1, 7), (16, 16, 3, 1, 16, 112), (104, 104, 3, 2, 13, 56),
    (96, 96, 3, 1, 1, 28), (16, 96, 1, 1, 1, 112), (480, 480, 3, 1, 480, 14), (3, 16, 3, 2, 1, 224),
    (192, 192, 3, 1, 1, 14), (24, 144, 1, 1, 1, 56), (96, 96, 3, 2, 96, 112), (128, 256, 3, 2, 1, 28),
    (384, 384, 3, 1, 1, 13), (144, 24, 1, 1, 1, 56), (88, 88, 3, 1, 88, 28), (256, 512, 3, 2, 1, 14),
    (16, 16, 3, 1, 1, 112), (40, 240, 1, 1, 1, 28), (120, 120, 5, 1, 120, 28), (64, 64, 3, 1, 1, 112),
    (40, 40, 3, 1, 1, 28), (240, 40, 1, 1, 1, 28), (200, 200, 5, 2, 200, 28), (32, 64, 3, 1, 1, 56),
    (64, 192, 3, 1, 1, 56), (80, 480, 1, 1, 1, 14), (384, 384, 5, 1, 384, 14), (96, 208, 3, 1, 1, 14),
    (192, 64, 3, 1, 1, 28), (480, 80, 1, 1, 1, 14), (72, 72, 5, 2, 72, 56), (16, 48, 5, 1, 1, 28),
    (112, 112, 3, 1, 1, 28), (160, 960, 1, 1, 1, 7), (960, 160, 1, 1, 1, 7), (32, 96, 5, 1, 1, 14),
    (64, 192, 5, 1, 1, 27), (192, 384, 3, 1, 1, 13), (384, 256, 3, 1, 1, 13), (160, 320, 3, 1, 1, 7),
    (256, 256, 3, 1, 1, 28), (512, 512, 3, 1, 1, 14), (64, 128, 1, 2, 1, 56), (128, 256, 1, 2, 1, 28),
    (256, 512, 1, 2, 1, 14), (96, 16, 1, 1, 1, 56), (64, 16, 1, 1, 1, 56), (16, 64, 1, 1, 1, 56),
    (128, 32, 1, 1, 1, 28), (32, 128, 1, 1, 1, 28), (256, 48, 1, 1, 1, 14), (512, 64, 1, 1, 1, 13),
    (64, 256, 3, 1, 1, 13), (16, 8, 1, 1, 1, 1), (576, 144, 1, 1, 1, 1), (144, 576, 1, 1, 1, 1),
    (1024, 1024, 1, 1, 1, 7), (832, 256, 1, 1, 1, 7), (480, 192, 1, 1, 1, 14), (192, 16, 1, 1, 1, 28),
    (116, 116, 1, 1, 1, 28), (232, 232, 3, 1, 232, 14), (58, 58, 1, 1, 1, 28), (24, 24, 3, 2, 24, 112),
)
# Weight reordering: 3x3 convolutions on one pixel (almost no arithmetic) with 0.15 to 9.4 MiB of weights.
CONV_WEIGHT_PROBES = (64, 192, 512)


def conv_backend(cin: int, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
                 groups: int, batch: int, in_hw: tuple[int, ...], threads: int) -> str:
    """"mkldnn" or "slow2d": the CPU kernel torch picks for an fp32 NCHW Conv2d (torch's use_mkldnn rule in
    aten/native/Convolution.cpp: a 1x1 convolution at batch < 16 on one thread runs as a GEMM per image)."""
    strided = any(s != 1 for s in stride)
    dilated = any(d != 1 for d in dilation)
    numel = batch * cin * math.prod(in_hw)
    if not (strided or dilated or batch >= 16 or any(k != 1 for k in kernel) or threads > 1):
        return "slow2d"
    if groups > 1 or all(k > 3 for k in kernel) or batch > 1 or numel > 20480:
        return "mkldnn"
    return "slow2d"


def _conv_point(bench: _Bench, cin: int, cout: int, kernel: int, stride: int, groups: int, in_hw: int,
                batch: int, threads: int) -> dict[str, Any]:
    conv = nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, groups=groups, bias=False).eval()
    conv.to(bench.device)
    if bench.cuda:  # the runner converts CUDA models to channels-last; CPU models keep their NCHW weights
        conv.to(memory_format=torch.channels_last)
    x = bench.tensor(batch, cin, in_hw, in_hw)
    timing = bench.time(conv, _fresh(x))
    out_hw = (in_hw + 2 * (kernel // 2) - kernel) // stride + 1
    backend = "cuda" if bench.cuda else conv_backend(cin, (kernel, kernel), (stride, stride), (1, 1), groups, batch,
                                                     (in_hw, in_hw), threads)
    return {"cin": cin, "cout": cout, "kernel": kernel, "stride": stride, "groups": groups, "in_hw": in_hw,
            "out_hw": out_hw, "batch": batch, "backend": backend, "us": round(bench.us_without_faults(timing), 2),
            "faults": min(timing.faults)}


def _large_batch(cin: int, cout: int, kernel: int, stride: int, groups: int, in_hw: int) -> bool:
    """Whether a grid shape is timed at LARGE_CONV_BATCH too (CPU): depthwise or grouped, or a small output."""
    return groups > 1 or (in_hw + 2 * (kernel // 2) - kernel) // stride + 1 <= LARGE_CONV_MAX_OUT_HW


def _convolutions(bench: _Bench, threads: int) -> tuple[list[dict], float, float]:
    """The fixed cost per call, the grid at CONV_BATCHES (and pointwise at the oneDNN batch), then, in a
    section of its own so that a small budget keeps the whole grid at the smaller batches first, the shapes
    with small outputs at LARGE_CONV_BATCH (CPU only)."""
    weight_points = []
    for channels in CONV_WEIGHT_PROBES:  # first, so a tiny budget still fits the fixed cost
        conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False).eval().to(bench.device)
        x = bench.tensor(2, channels, 1, 1)  # batch 2: oneDNN whatever the thread count
        us = bench.us_without_faults(bench.time(conv, _fresh(x)))
        weight_points.append((channels * channels * 9 * 4 / 2**20, us))
    call_us, weight_us = _line(weight_points)
    work = []
    for cin, cout, kernel, stride, groups, in_hw in CONV_GRID:
        batches = list(CUDA_CONV_BATCHES if bench.cuda else CONV_BATCHES)
        if kernel == 1 and groups == 1 and stride == 1 and not bench.cuda:
            batches.append(POINTWISE_ONEDNN_BATCH)
        work.append([(cin, cout, kernel, stride, groups, in_hw, b) for b in batches])
    points = []
    for shape_points in bench.points("conv", work):
        for *shape, batch in shape_points:
            points.append(_conv_point(bench, *shape, batch=batch, threads=threads))
    large = [] if bench.cuda else [shape for shape in CONV_GRID if _large_batch(*shape)]
    for shape in bench.points("conv_large", large):
        points.append(_conv_point(bench, *shape, batch=LARGE_CONV_BATCH, threads=threads))
    return points, call_us, weight_us


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope (both >= 0) of y against x."""
    if len(points) < 2:
        return (points[0][1] if points else 0.0), 0.0
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = max(sum((p[0] - mx) * (p[1] - my) for p in points) / sxx, 0.0) if sxx else 0.0
    return max(my - slope * mx, 0.0), slope


GEMM_SHAPES = ((1024, 1000), (4096, 4096), (256, 1000), (9216, 4096), (4096, 1000), (576, 1024), (2048, 1000),
               (1280, 1000), (256, 64))


def _gemms(bench: _Bench) -> list[dict[str, Any]]:
    points = []
    for in_features, out_features in bench.points("gemm", GEMM_SHAPES):
        linear = nn.Linear(in_features, out_features).eval().to(bench.device)
        for rows in GEMM_ROWS:
            x = bench.tensor(rows, in_features)
            timing = bench.time(linear, _fresh(x))
            points.append({"rows": rows, "in_features": in_features, "out_features": out_features,
                           "us": round(bench.us_without_faults(timing), 2)})
        del linear
    return points


def _sidecar_stages(bench: _Bench) -> dict[str, tuple]:
    """The sidecar's work around the model (spark_cnn.sidecar.runner.ModelRunner.forward): uint8 NHWC pixels
    normalised to float NCHW (keyed by the float bytes), and softmax + top-k heads (keyed by logits bytes)."""
    from spark_cnn.imaging.preprocess import Preprocessing
    from spark_cnn.models.heads import Predictor
    from spark_cnn.models.spec import DEFAULT_TOP_K
    from spark_cnn.models.tensors import normalise

    prep = Preprocessing()
    side = prep.crop
    heads = Predictor(nn.Identity(), top_k=DEFAULT_TOP_K)
    work = [("normalise", b) for b in NORMALISE_BATCHES] + [("heads", r) for r in HEADS_ROWS]
    curves: dict[str, list] = {"normalise": [], "heads": []}
    for kind, n in bench.points("sidecar", work):
        if kind == "normalise":
            pixels = torch.randint(0, 256, (n, side, side, 3), dtype=torch.uint8, device=bench.device)
            timing = bench.time(lambda p: normalise(p, prep), lambda pixels=pixels: (pixels.clone(),))
            curves[kind].append((float(n * 3 * side * side * 4), bench.us_without_faults(timing)))
        else:
            logits = bench.tensor(n, HEADS_CLASSES)
            timing = bench.time(heads.predict, _fresh(logits))
            curves[kind].append((float(n * HEADS_CLASSES * 4), bench.us_without_faults(timing)))
    return {kind: tuple(sorted(p)) for kind, p in curves.items() if p}


def _decode(bench: _Bench) -> float:
    """Milliseconds to decode, resize and crop one benchmark JPEG on one core (the task side's work)."""
    from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels
    from spark_cnn.imaging.samples import bench_jpegs

    deadline = bench.budget.section("decode")
    prep = Preprocessing()
    files = bench_jpegs(DECODE_IMAGES)
    preprocess_pixels(files[0], prep)  # warm-up: Pillow's first decode loads its codecs
    times = []
    for data in files:
        start = bench.budget.clock()
        preprocess_pixels(data, prep)
        times.append(bench.budget.clock() - start)
        if bench.budget.clock() > deadline:
            break
    times.sort()
    return round(times[len(times) // 2] * 1e3, 3)  # the median: images differ, and decode is not the minimum


def _h2d(bench: _Bench) -> tuple[tuple[float, float], ...]:
    """Pinned host -> device copies on CUDA: ((bytes, us), ...)."""
    if not bench.cuda:
        bench.budget.section("h2d")
        return ()
    points = []
    for mib in bench.points("h2d", H2D_MIB):
        host = torch.empty(mib << 18, dtype=torch.float32).pin_memory()
        timing = bench.time(lambda host=host: host.to(bench.device, non_blocking=True))
        points.append((float(mib << 20), timing.best_s * 1e6))
    return tuple(points)

