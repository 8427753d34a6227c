"""The CPU-per-image sampler's pure core: /proc stat lines, command lines, snapshot windows, per-image division."""

from __future__ import annotations

import os

import pytest

from spark_cnn.bench import cputime
from spark_cnn.bench.cputime import Snapshot, cpu_seconds_by_kind, parse_stat, per_image_ms, process_kind


def _stat(pid: int, comm: bytes, ppid: int, utime: int, stime: int, start: int) -> bytes:
    after = [b"S", ppid, 1, 1, 0, -1, 0, 0, 0, 0, 0, utime, stime, 5, 6, 20, 0, 3, 0, start, 0, 0]
    return b"%d (%s) " % (pid, comm) + b" ".join(x if isinstance(x, bytes) else str(x).encode() for x in after)


def test_a_stat_line_gives_pid_parent_start_and_user_plus_kernel_ticks_whatever_the_command_name():
    # A thread name can hold spaces and ')': fields are counted from the last ')'. cutime/cstime (5, 6: waited-for
    # children) are not this process's own time and are not added.
    line = _stat(4242, b"pyspark ) worker", 17, utime=130, stime=20, start=98765)
    assert parse_stat(line) == cputime.ProcStat(pid=4242, ppid=17, start_ticks=98765, cpu_ticks=150)


def test_this_process_parses_from_the_real_proc():
    with open(f"/proc/{os.getpid()}/stat", "rb") as f:
        stat = parse_stat(f.read())
    assert stat.pid == os.getpid() and stat.ppid == os.getppid() and stat.cpu_ticks >= 0


@pytest.mark.parametrize(("args", "kind"), [
    ([b"/usr/lib/jvm/java-17-openjdk-amd64/bin/java", b"-cp", b"...", b"org.apache.spark.deploy.SparkSubmit"], "jvm"),
    ([b"java", b"org.apache.spark.executor.CoarseGrainedExecutorBackend"], "jvm"),
    ([b"/venv/bin/python", b"-m", b"pyspark.daemon"], "python_worker"),
    ([b"/venv/bin/python", b"-m", b"pyspark.worker"], "python_worker"),
    ([b"/venv/bin/python", b"-m", b"spark_cnn.sidecar", b"--socket", b"/tmp/s"], "sidecar"),
    ([b"/venv/bin/python", b"-m", b"spark_cnn.bench.variants", b"{...}", b"out.json"], "driver"),
    ([b"/bin/bash", b"/venv/bin/spark-submit"], "other"),
    ([], "other"),  # a zombie's command line is empty
])
def test_processes_are_classified_by_command_line(args, kind):
    assert process_kind(args) == kind


JVM, WORKER, SIDECAR = (10, 1), (20, 2), (30, 3)  # (pid, start ticks)


def test_a_window_counts_each_kind_from_the_baseline_before_it_to_the_first_snapshot_after_it():
    snapshots = [
        Snapshot(at=0.0, processes={JVM: ("jvm", 1000), WORKER: ("python_worker", 300)}),  # warm-up's end
        Snapshot(at=10.0, processes={JVM: ("jvm", 1100), WORKER: ("python_worker", 350)}),  # baseline
        Snapshot(at=11.0, processes={JVM: ("jvm", 1300), WORKER: ("python_worker", 500), SIDECAR: ("sidecar", 40)}),
        Snapshot(at=12.0, processes={JVM: ("jvm", 1500), SIDECAR: ("sidecar", 90)}),  # the worker has exited
        Snapshot(at=13.0, processes={JVM: ("jvm", 1600), SIDECAR: ("sidecar", 100)}),  # first at/after the end
        Snapshot(at=20.0, processes={JVM: ("jvm", 9999), SIDECAR: ("sidecar", 9999)}),  # after the run
    ]
    spent = cpu_seconds_by_kind(snapshots, start=10.5, end=12.5, ticks_per_s=100)
    # jvm 1600 - 1100; the exited worker up to its last sample, 500 - 350; the sidecar, new in the window, from 0.
    assert spent == pytest.approx({"jvm": 5.0, "python_worker": 1.5, "sidecar": 1.0})


def test_a_reused_pid_is_another_process_and_a_process_changing_kind_counts_under_its_last_kind():
    snapshots = [
        Snapshot(at=0.0, processes={(7, 1): ("other", 50)}),
        Snapshot(at=1.0, processes={(7, 1): ("python_worker", 80)}),  # the fork became a worker... then exited
        Snapshot(at=2.0, processes={(7, 900): ("sidecar", 20)}),  # same pid, started later: a new process
    ]
    spent = cpu_seconds_by_kind(snapshots, start=0.0, end=2.0, ticks_per_s=10)
    assert spent == pytest.approx({"python_worker": 3.0, "sidecar": 2.0})


def test_kinds_seen_idle_stay_in_the_result_and_no_snapshots_give_nothing():
    idle = [Snapshot(0.0, {SIDECAR: ("sidecar", 5)}), Snapshot(1.0, {SIDECAR: ("sidecar", 5)})]
    assert cpu_seconds_by_kind(idle, 0.0, 1.0) == {"sidecar": 0.0}
    assert cpu_seconds_by_kind([], 0.0, 1.0) == {}


def test_per_image_milliseconds_by_kind_and_in_total():
    ms = per_image_ms({"sidecar": 0.5, "jvm": 2.0, "python_worker": 1.5}, images=1000)
    assert ms == {"jvm": 2.0, "python_worker": 1.5, "sidecar": 0.5, "total": 4.0}
    assert list(ms) == ["jvm", "python_worker", "sidecar", "total"]  # KINDS order, whatever came in
    assert per_image_ms({"jvm": 1.0}, images=0) is None
    assert per_image_ms({}, images=10) is None


def test_exact_edge_snapshots_sent_as_json_bound_the_window_between_periodic_samples():
    # The variant snapshots the tree at its measured run's start (1.3) and end (1.7), between samples 1 s apart:
    # only what was spent between the marks counts, not the warm-up before or the summary after.
    periodic = [Snapshot(1.0, {JVM: ("jvm", 100)}), Snapshot(2.0, {JVM: ("jvm", 400)})]
    marks = [cputime.snapshot_from_json(cputime.snapshot_to_json(Snapshot(at, {JVM: ("jvm", ticks)})))
             for at, ticks in ((1.3, 150), (1.7, 350))]
    assert marks[0] == Snapshot(1.3, {JVM: ("jvm", 150)})
    snapshots = sorted(periodic + marks, key=lambda s: s.at)
    assert cpu_seconds_by_kind(snapshots, 1.3, 1.7, ticks_per_s=100) == pytest.approx({"jvm": 2.0})
    assert cpu_seconds_by_kind(periodic, 1.3, 1.7, ticks_per_s=100) == pytest.approx({"jvm": 3.0})  # coarser


