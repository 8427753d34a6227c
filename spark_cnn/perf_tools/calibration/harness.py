"""How calibration times an operator: repeated calls after a warm-up, with the page faults of each call, inputs
made fresh as a network's previous layer makes them, a cache filled with other data, and a budget per section.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SECTION_SHARES", "Bench", "Budget", "Timing", "fresh", "measure"]

# Share of the budget per section, in the order they run; a section gets its share plus what earlier ones
# left, never what later ones would leave. Convolutions (conv + conv_large) get most after the curves: they are
# most of a CNN's time and their efficiency varies most with shape. "warmth" takes no points: its share keeps the
# later deadlines after the warmth probes, which always run whole. Sized from the sections' times on the slowest
# host measured (46 s in all, nothing skipped; docs/perf-model.md, "Calibration") so that each deadline falls
# 1.16-1.2 times after the section ended there; on a host that slow the old shares of a 45 s budget cut the
# large-batch convolutions in 7 of 10 calibrations of one run, and the sidecar points in every one.
SECTION_SHARES = {"faults": 0.02, "curves": 0.37, "conv": 0.19, "conv_large": 0.23, "gemm": 0.05, "warmth": 0.07,
                  "sidecar": 0.01, "decode": 0.03, "h2d": 0.03}
# Calls timed per point after one warm-up; their median is kept (Bench.us_without_faults). 3 is the fewest
# that gave the same table twice within a few per cent on a noisy host; calls over LONG_CALL_S get 2, and calls
# short enough get up to MAX_REPEATS within SHORT_CALLS_S.
REPEATS = 3
LONG_CALL_S = 0.05
SHORT_CALLS_S = 0.01
MAX_REPEATS = 10
WARMUP = 1
# A point whose calls disagree by more than STALL_RATIO (slowest over fastest) gets STALL_EXTRA_CALLS more, and
# its median is taken over all of them. On this project's VM guest a call over 50-100 MB sometimes stalled
# for 0.25-0.7 s against 8-46 ms (cause unknown; not reproduced on demand); such a call made long, so the
# point got one more call, and the upper median of two was the stall. 18 of 318
# committed calibrations carried a curve point over 4 times its neighbour's cost per byte (max_pool,
# batch_norm, add at 51-105 MB); two in one run priced timm's rexnet_100 and dla34 at batch 64 213% and 59% too
# slow (docs/perf-model.md, "Stalled calls in calibration").
STALL_RATIO = 2.0
STALL_EXTRA_CALLS = 2
# When the cache size cannot be read: the development host's L3.
FALLBACK_LAST_LEVEL_CACHE_BYTES = 32 << 20
# Written before each call: half the last-level cache, at most 16 MiB, about what a network's other layers
# touch between two calls of one layer at the batch sizes a CPU runs. A virtual machine may report its host's
# whole L3 (491 520 KiB on a 2-core Xeon guest): writing half of that before each call left nothing of the
# call's code and weights in any cache and priced every small operator as cold (module call 15.6 us against
# 5.3; mobilenet_v3_small at batch 1 predicted +64%; docs/perf-model.md, "The zoo").
MAX_POLLUTE_BYTES = 16 << 20


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

    def typical_without_faults_s(self, fault_s: float) -> float:
        """The median call once each call's own page faults are taken out, as best_without_faults_s does; of an
        even count, the mean of the middle two. A long point has two calls: taking the upper of them priced it
        in whichever slow spell either call met, so under load that switches on and off long points came out
        dearer than short ones, whose calls sit in one spell (resnet18's batch 32 at 4.1-4.7 times its batch 8
        against 3.5-3.9 measured; docs/perf-model-journal.md, "The long calls' statistic")."""
        corrected = sorted(max(t - f * fault_s, 0.05 * t) for t, f in zip(self.seconds, self.faults, strict=True))
        middle = len(corrected) // 2
        return corrected[middle] if len(corrected) % 2 else (corrected[middle - 1] + corrected[middle]) / 2

    def best_without_faults_s(self, fault_s: float) -> float:
        """The fastest call once each call's own page faults (at `fault_s` each) are taken out. Faults come
        and go between calls of one benchmark (the allocator returns memory to the kernel now and then), so
        they are taken out call by call; never below a twentieth of the call."""
        return min(max(t - f * fault_s, 0.05 * t) for t, f in zip(self.seconds, self.faults, strict=True))


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


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


class Budget:
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


class Bench:
    """Shared state of one calibration run: the device, the budget, the fault cost found first."""

    def __init__(self, device: torch.device, budget: Budget):
        self.device = device
        self.budget = budget
        self.cuda = device.type == "cuda"
        self.sync = (lambda: torch.cuda.synchronize(device)) if self.cuda else None
        self.fault_us = 0.0
        self.pollute = None if self.cuda else torch.empty(pollute_bytes() // 4).fill_(1.0)

    def time(self, fn: Callable[..., Any], fresh: Callable[[], tuple] | None = None) -> Timing:
        """REPEATS calls after a warm-up; 2 when a call is longer than LONG_CALL_S, more when it is short.

        Each call starts as a layer inside a network does (CPU): the cache holds other data (`pollute`, half
        the last-level cache up to MAX_POLLUTE_BYTES, is written first), the operator's weights and code have
        to come back, and its inputs were just made by another operator into new memory (`fresh()` returns
        them). Timed hot in a
        loop on the same input, small operators ran 1.5 to 3 times faster than inside a network
        (docs/perf-model.md); after a flush of the whole cache, several times slower. Calls that disagree by
        more than STALL_RATIO get STALL_EXTRA_CALLS more (a stalled call is not the typical one)."""
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
        seconds, faults = first.seconds + more.seconds, first.faults + more.faults
        if max(seconds) > STALL_RATIO * min(seconds):  # a stalled call: enough calls for a median without it
            extra = measure(fn, repeats=STALL_EXTRA_CALLS, warmup=0, sync=self.sync, before=before, clock=clock)
            seconds, faults = seconds + extra.seconds, faults + extra.faults
        return Timing(seconds, faults)

    def us_without_faults(self, timing: Timing) -> float:
        """Microseconds of a typical call (the median) less the page faults the benchmark itself caused (CPU
        only). A network runs each operator once per forward, at its typical time, not its best: mnasnet0_5 at
        batch 8 took the sum of its blocks' medians, not of their minimums, and the same calibration's points
        priced at the median took the zoo's median MAPE at batch >= 8 from 10.5% to 5.6% (docs/perf-model.md,
        "The zoo on a quiet host")."""
        return timing.typical_without_faults_s(self.fault_us * 1e-6) * 1e6

    def points(self, section: str, items: Iterable[Any]) -> Iterable[Any]:
        """`items` in order until the section's deadline; the first always, the rest counted as skipped."""
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


def fresh(*sources: torch.Tensor) -> Callable[[], tuple]:
    """New copies of `sources` made by an elementwise operator, as a previous layer's outputs."""
    return lambda: tuple(source * 1.0 for source in sources)


def pollute_bytes() -> int:
    """Bytes written before each timed call on the CPU (Bench.time)."""
    return min(_last_level_cache_bytes() // 2, MAX_POLLUTE_BYTES)


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
