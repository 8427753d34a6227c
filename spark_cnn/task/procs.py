"""Process facts the launcher and the sidecar need: who is my executor, is a process still the same one.

Linux /proc is read directly: a pid alone can be reused, so a process is identified by (pid, start time).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessId:
    pid: int
    start_time: int  # clock ticks since boot (field 22 of /proc/PID/stat); 0 where /proc is unavailable


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    return text[text.rindex(")") + 2:].split()


def process_id(pid: int) -> ProcessId:
    fields = _stat_fields(pid)
    return ProcessId(pid, int(fields[19]) if fields else 0)


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def is_alive(proc: ProcessId) -> bool:
    """True while the very process `proc` names runs (not a later process that reused its pid)."""
    try:
        os.kill(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat_fields(proc.pid)
    if fields is None:
        return not os.path.exists("/proc")  # no /proc (not Linux): os.kill is all we have
    return fields[0] != "Z" and (proc.start_time == 0 or int(fields[19]) == proc.start_time)


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:
        return []


@dataclass(frozen=True)
class ExecutorProcess:
    """The JVM this Python worker serves: an executor, or the driver in local mode."""

    process: ProcessId
    executor_id: str


def find_executor_jvm(start_pid: int | None = None) -> ExecutorProcess:
    """Walk up the process tree from this Python worker to the first `java` process.

    Spark's Python workers are forked by a daemon that the executor JVM started, so every worker of one
    executor shares that JVM ancestor, and workers of different executors do not. The executor id comes from
    the JVM's `--executor-id` argument; in local mode the JVM is the driver. Without /proc (not Linux) the
    parent process stands in for the JVM.
    """
    pid = start_pid or os.getpid()
    for _ in range(64):  # a process tree is never this deep; the bound guards against cycles
        ppid = parent_pid(pid)
        if ppid is None or ppid <= 1:
            break
        pid = ppid
        args = cmdline(pid)
        if args and os.path.basename(args[0]) == "java":
            executor_id = "driver"
            if "--executor-id" in args[:-1]:
                executor_id = args[args.index("--executor-id") + 1]
            return ExecutorProcess(process_id(pid), executor_id)
    return ExecutorProcess(process_id(os.getppid()), "unknown")
