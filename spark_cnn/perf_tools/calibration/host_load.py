"""How busy the host was while calibration ran: load average, CPU stolen by the hypervisor, and the CPU other
processes used, from /proc/stat and this process's own CPU time (Linux; elsewhere only what os offers).

A profile records it (`DeviceProfile.load`) so that `spark-cnn profile` and `plan` can say when a calibration
was made on a busy host: its times are slower than the device is, and every prediction made from it too.
`load_between` is pure: two snapshots in, the summary out.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

__all__ = ["BUSY_OTHERS_SHARE", "BUSY_STEAL_SHARE", "LoadSnapshot", "describe_load", "load_between", "snapshot",
           "ticks_per_second"]

# Other processes using over a quarter of the host's CPU while calibration ran: k/4 of a k-core host's cores,
# caches and memory bandwidth taken from the benchmarks, the order of a Spark job's decoding tasks beside them
# (a busy-host calibration ran beside one).
BUSY_OTHERS_SHARE = 0.25
# The hypervisor taking over 5% of the CPU: the guest's timings then depend on its neighbours.
BUSY_STEAL_SHARE = 0.05
# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal (guest time is already in user).
_BUSY_FIELDS = (0, 1, 2, 5, 6)
_IDLE_FIELDS = (3, 4)
_STEAL_FIELD = 7


@dataclass(frozen=True)
class LoadSnapshot:
    """The counters at one moment: wall clock, this process's CPU seconds, the host's CPU ticks per kind
    (None without /proc/stat), and the 1-minute load average (None where the OS has none)."""

    wall_s: float
    own_cpu_s: float
    busy_ticks: int | None
    idle_ticks: int | None
    steal_ticks: int | None
    loadavg: float | None


def _proc_stat() -> tuple[int, int, int] | tuple[None, None, None]:
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None, None, None
    fields += [0] * (8 - len(fields))
    return (sum(fields[i] for i in _BUSY_FIELDS), sum(fields[i] for i in _IDLE_FIELDS), fields[_STEAL_FIELD])


def snapshot() -> LoadSnapshot:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    busy, idle, steal = _proc_stat()
    try:
        loadavg = os.getloadavg()[0]
    except OSError:
        loadavg = None
    return LoadSnapshot(time.monotonic(), usage.ru_utime + usage.ru_stime, busy, idle, steal, loadavg)


def load_between(start: LoadSnapshot, end: LoadSnapshot, *, cores: int, ticks_per_s: float = 100.0) -> dict:
    """What the host did between two snapshots: {"cores", "loadavg_start", "loadavg_end", "steal_share",
    "others_cpu_share" (of the host's CPU, used by processes other than this one), "busy"} (shares None where
    /proc/stat is missing).

    >>> a = LoadSnapshot(0.0, 0.0, 0, 0, 0, 0.5)
    >>> b = LoadSnapshot(10.0, 10.0, 1500, 500, 0, 1.7)      # 2 cores for 10 s: 15 s busy, 10 of them ours
    >>> load = load_between(a, b, cores=2)
    >>> load["others_cpu_share"], load["busy"]
    (0.25, False)
    """
    result = {"cores": cores, "loadavg_start": _round(start.loadavg), "loadavg_end": _round(end.loadavg),
              "steal_share": None, "others_cpu_share": None}
    if None not in (start.busy_ticks, end.busy_ticks, start.idle_ticks, end.idle_ticks):
        busy = end.busy_ticks - start.busy_ticks
        steal = end.steal_ticks - start.steal_ticks
        ticks = busy + (end.idle_ticks - start.idle_ticks) + steal
        wall = max(end.wall_s - start.wall_s, 1e-9)
        others_s = max(0.0, busy / ticks_per_s - (end.own_cpu_s - start.own_cpu_s))
        result["steal_share"] = round(steal / ticks, 3) if ticks > 0 else 0.0
        result["others_cpu_share"] = round(min(1.0, others_s / (wall * cores)), 3)
    result["busy"] = bool((result["others_cpu_share"] or 0.0) > BUSY_OTHERS_SHARE
                          or (result["steal_share"] or 0.0) > BUSY_STEAL_SHARE)
    return result


def ticks_per_second() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


def describe_load(load: dict) -> str:
    """One line for a report: 'quiet host (...)' or 'BUSY host (...)'; 'host load not recorded' for old profiles.

    >>> describe_load({"cores": 2, "loadavg_start": 0.1, "loadavg_end": 0.4, "steal_share": 0.0,
    ...                "others_cpu_share": 0.02, "busy": False})
    'quiet host (others used 2% of 2 cores, 0% stolen, load 0.1 -> 0.4)'
    """
    if not load:
        return "host load not recorded"
    parts = []
    if load.get("others_cpu_share") is not None:
        parts.append(f"others used {100 * load['others_cpu_share']:.0f}% of {load.get('cores')} cores")
        parts.append(f"{100 * (load.get('steal_share') or 0.0):.0f}% stolen")
    if load.get("loadavg_start") is not None:
        parts.append(f"load {load['loadavg_start']} -> {load['loadavg_end']}")
    return f"{'BUSY' if load.get('busy') else 'quiet'} host ({', '.join(parts) or 'no counters'})"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
