"""Faults of a real sidecar process, without Spark: killed mid-stream, hung, leftover files, injected OOM.

Each test starts `python -m spark_cnn.sidecar` through the launcher (helpers shared with test_sidecar_process),
does the damage with real signals, and checks that every request gets exactly one reply equal to what the
model computes directly. The figures they assert are the ones docs/RELIABILITY.md states.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import numpy as np
import pytest

from spark_cnn.errors import SidecarHung
from spark_cnn.sidecar.fault_injection import INJECT_OOM_ENV
from spark_cnn.task.client import SidecarClient, map_ordered
from spark_cnn.task.failover import FailoverClient
from spark_cnn.task.launcher import ensure_sidecar
from spark_cnn.task.procs import ProcessId, is_alive
from spark_cnn.task.run_options import RunOptions
from tests.sidecar_harness import (
    check_against_reference,
    fake_app,
    gone,
    random_pixels,
    sidecar_pids,
    wait_until,
)

# Kills, stops and restarts sidecar processes.
pytestmark = pytest.mark.slow

# conftest.py gives the sidecar fixtures: a private runtime directory, the demo model's weights, endpoint and
# reference, a fresh fake application.

# A new sidecar (import torch, load the demo model) on a loaded 2-core host: ~3-10 s; the bound leaves room.
RECOVERY_BOUND_S = 60.0
# A short request timeout, so the hang test ends quickly; the default is client.REPLY_TIMEOUT_S.
HANG_TIMEOUT_S = 2.0
REQUESTS = 40
KILL_AFTER = 10  # requests sent before the kill: several are in flight when it lands


def _connector(app, endpoint, job: str, **client_options):
    def connect() -> SidecarClient:  # as spark/inference.py connects
        info = ensure_sidecar(app.options(), app.executor)
        return SidecarClient(info.socket, info.token, endpoint, job, pid=info.pid, **client_options)
    return connect


def test_sigkill_mid_stream_resends_in_flight_requests_to_a_new_sidecar(app, endpoint, reference):
    rng = np.random.default_rng(10)
    requests = [(i, random_pixels(rng, int(rng.integers(1, 6)))) for i in range(REQUESTS)]
    first = ensure_sidecar(app.options(), app.executor)
    killed_at = {}

    def items():
        for i, item in enumerate(requests):
            if i == KILL_AFTER:
                os.kill(first.pid, signal.SIGKILL)
                killed_at["t"] = time.monotonic()
            yield item

    with FailoverClient(_connector(app, endpoint, f"kill-{uuid.uuid4().hex[:6]}")) as client:
        replies = list(map_ordered(client, items()))
        reconnects, recovery_s = client.reconnects, client.recovery_s

    assert [key for key, _ in replies] == list(range(REQUESTS)), "a request lost, duplicated or out of order"
    for (_, pixels), (_, reply) in zip(requests, replies, strict=True):
        check_against_reference(reference, pixels, reply)
    assert reconnects == 1 and len(recovery_s) == 1
    assert recovery_s[0] < RECOVERY_BOUND_S
    assert gone(first.pid)
    [now] = sidecar_pids(app.app_id)
    assert now != first.pid
    print(f"\nsigkill mid-stream: {REQUESTS} requests, {len(replies)} replies, new sidecar and requests resent "
          f"{recovery_s[0]:.1f} s after the failure was seen")


def test_hung_sidecar_times_out_with_a_message_naming_it_and_is_replaced(app, endpoint, reference):
    first = ensure_sidecar(app.options(), app.executor)
    pixels = random_pixels(np.random.default_rng(11), 3)
    connect = _connector(app, endpoint, "hang", timeout_s=HANG_TIMEOUT_S)

    with FailoverClient(connect) as client:
        os.kill(first.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(SidecarHung) as raised:
            list(map_ordered(client, [("stuck", pixels)]))
        waited = time.monotonic() - started

    message = str(raised.value)
    assert f"pid {first.pid}" in message and first.socket in message, message
    assert f"did not answer within {HANG_TIMEOUT_S:.0f} s" in message and "SIGKILL" in message, message
    assert HANG_TIMEOUT_S <= waited < HANG_TIMEOUT_S + 15
    print(f"\nhung sidecar: failed after {waited:.1f} s (timeout {HANG_TIMEOUT_S} s): {message}")
    assert wait_until(lambda: gone(first.pid)) is not None, "the hung sidecar was not stopped"
    with open(os.path.splitext(first.socket)[0] + ".log") as f:
        assert "retired by task process" in f.read()

    # A sidecar that hangs before the handshake ends is named (its pid from the info file) and stopped too.
    second = ensure_sidecar(app.options(), app.executor)
    assert second.pid != first.pid
    os.kill(second.pid, signal.SIGSTOP)
    with pytest.raises(SidecarHung, match=f"pid {second.pid} at .* did not answer.*SIGKILL"):
        FailoverClient(connect)
    assert wait_until(lambda: gone(second.pid)) is not None, "the sidecar hung in the handshake was not stopped"

    # The retry: a new sidecar, never a hung one.
    with FailoverClient(connect) as client:
        [(_, reply)] = list(map_ordered(client, [("retry", pixels)]))
        assert client.ready["pid"] not in (first.pid, second.pid)
    check_against_reference(reference, pixels, reply)


def test_a_dead_sidecars_leftover_files_do_not_stop_a_new_start(app, endpoint):
    first = ensure_sidecar(app.options(), app.executor)
    os.kill(first.pid, signal.SIGKILL)
    assert wait_until(lambda: gone(first.pid)) is not None
    base = os.path.splitext(first.socket)[0]
    assert all(os.path.exists(base + ext) for ext in (".json", ".sock", ".lock")), "SIGKILL should leave files"
    # Worse: the dead sidecar's pid now belongs to another live process (pid reuse).
    with open(base + ".json", "w") as f:
        json.dump({**first.__dict__, "pid": app.child.pid}, f)

    second = ensure_sidecar(app.options(), app.executor)

    assert second.pid not in (first.pid, app.child.pid) and is_alive(ProcessId(second.pid, 0))
    with SidecarClient(second.socket, second.token, endpoint, job="after-leftovers") as client:
        assert client.ready["pid"] == second.pid


def test_injected_out_of_memory_halves_the_batch_and_results_stay_exact(runtime, endpoint, reference, monkeypatch):
    monkeypatch.setenv(INJECT_OOM_ENV, "4")  # the sidecar inherits it: batches of more than 4 rows fail
    rng = np.random.default_rng(12)
    requests = [(i, random_pixels(rng, 16)) for i in range(6)]
    job = f"oom-{uuid.uuid4().hex[:6]}"
    with fake_app("oom") as fresh:
        info = ensure_sidecar(fresh.options(), fresh.executor)
        with SidecarClient(info.socket, info.token, endpoint, job, run_options=RunOptions(batch_size=16)) as client:
            replies = list(map_ordered(client, requests))
            stats = client.stats(job)
        with open(fresh.base() + ".log") as f:
            log_text = f.read()

    for (_, pixels), (_, reply) in zip(requests, replies, strict=True):
        check_against_reference(reference, pixels, reply)
    assert stats["oom_backoffs"] >= 1 and stats["batch_size"] == 4 and stats["errors"] == 0, stats
    assert stats["images"] == 6 * 16
    assert "fault injection on" in log_text and "halving to 8" in log_text and "halving to 4" in log_text
