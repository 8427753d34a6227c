"""CPU time per image by process kind (JVM, Python workers, sidecar, driver), from `/proc/PID/stat`.

The core is pure: `parse_stat` reads one stat line, `process_kind` classifies a command line, `cpu_seconds_by_kind`
takes snapshots (every process of the tree: kind and utime+stime ticks so far, keyed by (pid, start time) so a
reused pid is a new process) and returns what each kind spent between two moments; `per_image_ms` divides.
`TreeCpuSampler` is the shell: a thread that snapshots the process tree below the bench while a variant runs.
The variant itself snapshots the same tree at the exact start and end of its measured run (`tree_snapshot`, sent
back as JSON), so the window's edges are exact and the periodic samples only fill in processes that come and go.

A process that exits mid-run takes its last ticks with it. The sampler keeps, for every process, the last value it
read, so an exited process still counts up to its last sample: what is lost is at most one SAMPLE_INTERVAL_S of
CPU per process that exits inside the measured window. Spark reuses its Python workers and the JVM and the sidecar
outlive the measured job, so in the bench's runs only short-lived helpers (a shell, a launcher) can lose any.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

# Five samples a second: an exiting process loses at most 0.2 s of CPU, and a snapshot of the tree (0.7 ms of CPU
# with 68 processes on the 2-core development host) costs the measured variant ~0.3% of a core.
SAMPLE_INTERVAL_S = 0.2
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
KINDS = ("jvm", "python_worker", "sidecar", "driver", "other")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    start_ticks: int  # since boot: with the pid, identifies one process even when pids are reused
    cpu_ticks: int    # utime + stime, user and kernel CPU so far


def parse_stat(line: bytes) -> ProcStat:
    """One `/proc/PID/stat` line. The command name in parentheses may hold spaces and ')', so fields are counted
    from the last ')'; after it: state (3), ppid (4), ..., utime (14), stime (15), ..., starttime (22).

    >>> parse_stat(b"42 (a) b) S 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 900 0 0").cpu_ticks
    10
    """
    pid = int(line[:line.index(b" ")])
    fields = line[line.rindex(b")") + 2:].split()
    return ProcStat(pid=pid, ppid=int(fields[1]), start_ticks=int(fields[19]),
                    cpu_ticks=int(fields[11]) + int(fields[12]))


def process_kind(args: Sequence[bytes]) -> str:
    """What a process is, from its command line (`/proc/PID/cmdline` split at NUL): one of KINDS.

    jvm: Spark's JVM (driver and, in local mode, the executors; an executor JVM elsewhere). python_worker: the
    pyspark daemon and the workers it forks (they keep its command line). sidecar: spark_cnn's sidecar. driver:
    the bench's variant process (the user's Python driver, or the bare loop itself), or bench-scale's job.
    """
    text = b" ".join(args)
    if args and args[0].endswith(b"java"):
        return "jvm"
    if b"spark_cnn.sidecar" in text:
        return "sidecar"
    if b"pyspark.daemon" in text or b"pyspark.worker" in text:
        return "python_worker"
    if b"spark_cnn.bench.variants" in text or b"spark_cnn.bench.scale_job" in text:
        return "driver"
    return "other"


Key = tuple[int, int]  # (pid, start_ticks)


@dataclass(frozen=True)
class Snapshot:
    at: float                                    # time.time() when read
    processes: dict[Key, tuple[str, int]] = field(default_factory=dict)  # -> (kind, cpu ticks so far)


def cpu_seconds_by_kind(snapshots: Sequence[Snapshot], start: float, end: float,
                        ticks_per_s: float = TICKS_PER_S) -> dict[str, float]:
    """CPU seconds each kind spent from `start` to `end` (time.time()), from snapshots in time order.

    The baseline is the last snapshot at or before `start` (a process absent from it started later: from 0); the
    end is the first snapshot at or after `end` (else the last one). Each process counts its last value read up
    to the end, so one that exited mid-run counts up to its last sample. Kinds seen in the window are all
    present, even at 0.
    """
    if not snapshots:
        return {}
    base_index = max((i for i, s in enumerate(snapshots) if s.at <= start), default=-1)
    end_index = next((i for i, s in enumerate(snapshots) if s.at >= end), len(snapshots) - 1)
    base = snapshots[base_index].processes if base_index >= 0 else {}
    last: dict[Key, tuple[str, int]] = {}
    for snapshot in snapshots[base_index + 1:end_index + 1]:
        last.update(snapshot.processes)
    spent: dict[str, float] = {}
    for key, (kind, ticks) in last.items():
        before = base.get(key, (kind, 0))[1]
        spent[kind] = spent.get(kind, 0.0) + max(0, ticks - before) / ticks_per_s
    return spent


def snapshot_to_json(snapshot: Snapshot) -> dict:
    return {"at": snapshot.at, "processes": [[pid, start, kind, ticks]
                                             for (pid, start), (kind, ticks) in snapshot.processes.items()]}


def snapshot_from_json(data: dict) -> Snapshot:
    return Snapshot(at=data["at"], processes={(pid, start): (kind, ticks)
                                              for pid, start, kind, ticks in data["processes"]})


def per_image_ms(seconds_by_kind: dict[str, float], images: int) -> dict[str, float] | None:
    """Milliseconds of CPU per image by kind, and `total`; None without images."""
    if not images or not seconds_by_kind:
        return None
    out = {kind: round(1000.0 * seconds_by_kind[kind] / images, 3) for kind in KINDS if kind in seconds_by_kind}
    out["total"] = round(1000.0 * sum(seconds_by_kind.values()) / images, 3)
    return out


# --- the shell: reading /proc --------------------------------------------------------------------------------

def read_stats() -> list[ProcStat]:
    stats = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stats.append(parse_stat(f.read()))
        except (OSError, ValueError, IndexError):  # gone since the listing, or a line being rewritten
            continue
    return stats


def _command(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return []


def tree_snapshot(root: int) -> Snapshot:
    """Every process below `root` (not `root` itself): kind (its command line now) and CPU ticks so far."""
    stats = read_stats()
    children: dict[int, list[ProcStat]] = {}
    for stat in stats:
        children.setdefault(stat.ppid, []).append(stat)
    processes, stack = {}, list(children.get(root, []))
    while stack:
        stat = stack.pop()
        processes[(stat.pid, stat.start_ticks)] = (process_kind(_command(stat.pid)), stat.cpu_ticks)
        stack += children.get(stat.pid, [])
    return Snapshot(at=time.time(), processes=processes)


class TreeCpuSampler:
    """Snapshots the process tree below `root` (default: this process) every `interval_s` until stopped; one
    more on entry and on exit, so a window inside the run always has a snapshot on each side.

    >>> with TreeCpuSampler() as cpu:  # doctest: +SKIP
    ...     subprocess.run([...])
    >>> cpu_seconds_by_kind(cpu.snapshots, start, end)  # doctest: +SKIP
    """

    def __init__(self, root: int | None = None, interval_s: float = SAMPLE_INTERVAL_S):
        self.root = root or os.getpid()
        self.interval_s = interval_s
        self.snapshots: list[Snapshot] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.snapshots.append(tree_snapshot(self.root))

    def __enter__(self) -> TreeCpuSampler:
        self.snapshots.append(tree_snapshot(self.root))
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.snapshots.append(tree_snapshot(self.root))
