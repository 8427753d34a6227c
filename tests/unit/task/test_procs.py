"""Process identity from /proc: (pid, start time), liveness, and the walk up to the executor JVM."""

from __future__ import annotations

import os

import pytest

from spark_cnn.task import procs
from spark_cnn.task.procs import ExecutorProcess, ProcessId, cmdline, find_executor_jvm, is_alive, process_id

linux_only = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")


def _java_ancestor() -> bool:
    pid = os.getpid()
    while (ppid := procs.parent_pid(pid)) and ppid > 1:
        pid = ppid
        args = cmdline(pid)
        if args and os.path.basename(args[0]) == "java":
            return True
    return False


@linux_only
def test_current_process_has_a_start_time_and_is_alive():
    me = process_id(os.getpid())
    assert me.pid == os.getpid()
    assert me.start_time > 0
    assert process_id(os.getpid()) == me  # stable
    assert is_alive(me)


@linux_only
def test_same_pid_with_another_start_time_is_not_alive():
    me = process_id(os.getpid())
    assert not is_alive(ProcessId(me.pid, me.start_time + 1))


@linux_only
def test_unknown_start_time_falls_back_to_the_pid():
    assert is_alive(ProcessId(os.getpid(), 0))


@linux_only
def test_pid_that_cannot_exist_is_not_alive():
    with open("/proc/sys/kernel/pid_max") as f:
        impossible = int(f.read()) + 1  # the kernel never hands out a pid above pid_max
    assert not is_alive(ProcessId(impossible, 12345))
    assert process_id(impossible) == ProcessId(impossible, 0)
    assert cmdline(impossible) == []


@linux_only
def test_parent_pid_of_the_current_process():
    assert procs.parent_pid(os.getpid()) == os.getppid()


@linux_only
def test_cmdline_of_the_current_process():
    args = cmdline(os.getpid())
    assert args
    assert any("python" in a or "pytest" in a for a in args)


@linux_only
def test_find_executor_jvm_without_a_java_ancestor():
    if _java_ancestor():
        pytest.skip("this test run has a java ancestor")
    found = find_executor_jvm()
    assert isinstance(found, ExecutorProcess)
    assert found.executor_id == "unknown"
    assert found.process == process_id(os.getppid())


def _fake_tree(monkeypatch, tree: dict[int, tuple[int, list[str]]]) -> None:
    """Replace /proc with `tree`: pid -> (parent pid, command line)."""
    monkeypatch.setattr(procs, "parent_pid", lambda pid: tree[pid][0] if pid in tree else None)
    monkeypatch.setattr(procs, "cmdline", lambda pid: tree[pid][1] if pid in tree else [])
    monkeypatch.setattr(procs, "process_id", lambda pid: ProcessId(pid, 1000 + pid))


def test_find_executor_jvm_reads_the_executor_id(monkeypatch):
    _fake_tree(monkeypatch, {
        300: (200, ["python3", "-m", "pyspark.worker"]),
        200: (100, ["python3", "-m", "pyspark.daemon"]),
        100: (1, ["/usr/lib/jvm/bin/java", "-cp", "x", "org.apache.spark.executor.CoarseGrainedExecutorBackend",
                  "--driver-url", "spark://d", "--executor-id", "7", "--hostname", "h"]),
    })
    assert find_executor_jvm(300) == ExecutorProcess(ProcessId(100, 1100), "7")


def test_find_executor_jvm_in_local_mode_is_the_driver(monkeypatch):
    _fake_tree(monkeypatch, {
        30: (20, ["python3", "-m", "pyspark.daemon"]),
        20: (10, ["java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "pyspark-shell"]),
        10: (1, ["java", "--executor-id", "9"]),  # a farther java ancestor is never reached
    })
    assert find_executor_jvm(30) == ExecutorProcess(ProcessId(20, 1020), "driver")


def test_find_executor_jvm_ignores_a_process_merely_named_like_java(monkeypatch):
    _fake_tree(monkeypatch, {
        30: (20, ["python3"]),
        20: (1, ["/opt/javascript-runner", "java"]),
    })
    found = find_executor_jvm(30)
    assert found.executor_id == "unknown"
