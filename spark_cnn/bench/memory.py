"""Peak memory of a whole process tree: the variant's driver, its JVM, Python workers and sidecars together.

Linux only (/proc). A sampler thread reads, every SAMPLE_INTERVAL_S, the parent of every process, takes the
descendants of the root (this process), and sums their resident set size (RSS, /proc/PID/statm) and, where
readable, their proportional set size (PSS, /proc/PID/smaps_rollup: shared pages split between the processes
that map them, so libraries mapped by several workers count once). The peak of each sum is kept.

The sampler runs beside the variant it measures, on the same cores, so it must cost little: an RSS scan of
the tree takes ~1.5 ms of CPU, but reading smaps_rollup of a JVM and a torch process takes ~25 ms (the kernel
walks their page tables). PSS is therefore read only when the RSS sum is within PSS_NEAR_PEAK of its peak so
far, and at most every PSS_MIN_INTERVAL_S.

A sidecar is started in a new session by a Spark Python worker and outlives it; to keep such processes in the
tree, `become_subreaper()` makes this process adopt orphaned descendants (prctl PR_SET_CHILD_SUBREAPER)
instead of init.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

from spark_cnn.bench.cputime import process_kind

# Four samples a second: a Spark variant lives tens of seconds, and an RSS scan of the tree costs ~1.5 ms of CPU.
SAMPLE_INTERVAL_S = 0.25
# PSS (~25 ms of CPU per read of a Spark variant's tree) at most once a second, and only near the RSS peak: read
# four times a second it took 0.11 of a core from the measured variant (5% of the 2-core development host).
PSS_MIN_INTERVAL_S = 1.0
PSS_NEAR_PEAK = 0.95
_PR_SET_CHILD_SUBREAPER = 36
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it (so they stay counted and can be reaped)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "(comm)", which may hold spaces
        parents[int(name)] = int(fields[1])
    return parents


def _vm_and_rss(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            size, resident = f.read().split()[:2]
        return int(size), int(resident)
    except (OSError, ValueError):
        return None


def shares_parent_memory(pid: int, parent: int) -> bool:
    """A child between vfork and exec (the JVM starts processes that way) reports its parent's memory as its
    own; counting it would count the JVM twice."""
    mine = _vm_and_rss(pid)
    return mine is not None and mine[1] > 0 and mine == _vm_and_rss(parent)


def descendants(root: int, parents: dict[int, int] | None = None) -> list[int]:
    """Every live process below `root` (not `root` itself); `parents` from one scan of /proc, if at hand."""
    children: dict[int, list[int]] = {}
    for pid, ppid in (parents if parents is not None else _parents()).items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack += children.get(pid, [])
    return found


def role(pid: int) -> str:
    """What a process is, for the memory breakdown: jvm, sidecar, python_worker, driver or other."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return "other"
    return process_kind(args)


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


def pss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class TreeMemorySampler:
    """Samples the process tree below `root` until stopped; `peak_rss`/`peak_pss` in bytes, `peak_processes`.

    >>> with TreeMemorySampler() as sampler:  # doctest: +SKIP
    ...     subprocess.run([...])
    >>> sampler.peak_rss
    """

    def __init__(self, root: int | None = None, interval_s: float = SAMPLE_INTERVAL_S):
        self.root = root or os.getpid()
        self.interval_s = interval_s
        self.peak_rss = 0
        self.peak_pss: int | None = None
        self.peak_processes = 0
        self.peak_rss_by_role: dict[str, int] = {}  # at the sample with the highest total
        self.peak_rss_of_role: dict[str, int] = {}  # each role's own peak, whenever it came
        self.samples = 0
        self.pss_reads = 0
        self._last_pss = -float("inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)

    def sample(self) -> None:
        parents = _parents()
        pids = descendants(self.root, parents)
        pids = [pid for pid in pids if not shares_parent_memory(pid, parents.get(pid, 0))]
        by_pid = {pid: rss_bytes(pid) for pid in pids}
        rss = sum(by_pid.values())
        now = time.monotonic()
        if rss >= PSS_NEAR_PEAK * self.peak_rss and now - self._last_pss >= PSS_MIN_INTERVAL_S:
            self._last_pss = now
            self.pss_reads += 1
            # A process without resident memory (a zombie, or one that just exited) has no PSS to read either.
            pss_values = [pss_bytes(pid) if by_pid[pid] else 0 for pid in pids]
            if pids and all(v is not None for v in pss_values):
                self.peak_pss = max(self.peak_pss or 0, sum(pss_values))
        by_role: dict[str, int] = {}
        for pid, value in by_pid.items():
            name = role(pid)
            by_role[name] = by_role.get(name, 0) + value
        for name, value in by_role.items():
            self.peak_rss_of_role[name] = max(self.peak_rss_of_role.get(name, 0), value)
        if rss > self.peak_rss:
            self.peak_rss = rss
            self.peak_rss_by_role = by_role
        self.peak_processes = max(self.peak_processes, len(pids))
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def reap_leftovers(root: int | None = None, grace_s: float = 10.0) -> list[str]:
    """Wait up to `grace_s` for the tree below `root` to empty; SIGKILL what is left. Returns what was killed
    (`pid command`), so a variant that leaves processes behind is reported, not hidden."""
    root = root or os.getpid()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap_zombies()
        if not descendants(root):
            return []
        time.sleep(0.1)
    killed = []
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
            os.kill(pid, signal.SIGKILL)
            killed.append(f"{pid} {command}")
        except (OSError, ProcessLookupError):
            continue
    time.sleep(0.2)
    _reap_zombies()
    return killed


def _reap_zombies() -> None:
    """Collect exited adopted children (a subreaper must wait for them, or they linger as zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
