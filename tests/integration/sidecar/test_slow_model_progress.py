"""A slow model with many tasks: waits longer than the request timeout behind other tasks' batches do not make
a healthy sidecar look hung, and a model stuck in one forward still does (real sidecar processes, no Spark).

The model (tests/sidecar_doubles.paced_echo) takes PACED_BATCH_S per batch and echoes each image's first pixel,
so every reply row is checked against its request; one compute thread serves batches one at a time.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from spark_cnn.errors import SidecarHung
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import ModelSpec
from spark_cnn.task.client import SidecarClient, map_ordered
from spark_cnn.task.failover import FailoverClient
from spark_cnn.task.launcher import ensure_sidecar
from spark_cnn.task.procs import ProcessId, is_alive
from spark_cnn.task.run_options import RunOptions
from tests.sidecar_doubles import (
    ECHO_PREPROCESSING,
    PACED_BATCH_S,
    PACED_ECHO_FACTORY,
    STALL_MARK,
    pythonpath_with_repo,
)
from tests.sidecar_harness import gone, sidecar_pids, wait_until

# Starts sidecar processes and waits on a slow model.
pytestmark = pytest.mark.slow

CLIENTS = 8  # the tasks of an 8-core executor
REQUESTS_PER_CLIENT = 4  # all in flight at once: 32 one-row batches queued, 16 s of model time
# Far below the 4 s (CLIENTS x PACED_BATCH_S) a client waits between its replies, far above the 1.5 s
# (PACED_BATCH_S + protocol.PROGRESS_INTERVAL_S) between two signs of progress.
REQUEST_TIMEOUT_S = 2.5
ONE_ROW_BATCHES = RunOptions(batch_size=1)
# A model stuck in a forward is found within the timeout; the rest is slack for a loaded 2-core host.
HANG_SLACK_S = 15.0


@pytest.fixture(autouse=True)
def echo_model_importable(monkeypatch):
    """The sidecar imports the echo model by name in its own process, which inherits this environment."""
    monkeypatch.setenv("PYTHONPATH", pythonpath_with_repo())


@pytest.fixture(scope="module")
def paced_endpoint():
    return resolve_endpoint(ModelSpec(PACED_ECHO_FACTORY), logits=True).endpoint


def _connector(app, endpoint, job: str):
    options = app.options(threads=os.cpu_count())  # one compute thread: batches strictly one after another

    def connect() -> SidecarClient:  # as spark/inference.py connects
        info = ensure_sidecar(options, app.executor)
        return SidecarClient(info.socket, info.token, endpoint, job, run_options=ONE_ROW_BATCHES,
                             timeout_s=REQUEST_TIMEOUT_S, pid=info.pid)
    return connect


def _pixels(red: int) -> np.ndarray:
    pixels = np.full((1, *ECHO_PREPROCESSING.pixel_shape), 7, dtype=np.uint8)
    pixels[0, 0, 0, 0] = red
    return pixels


def _echoed_red(reply: pa.RecordBatch) -> int:
    return int(np.rint(reply.column("logits").flatten().to_numpy()[0]))


def test_many_clients_behind_a_slow_model_wait_past_the_timeout_and_every_one_is_served(app, paced_endpoint):
    connect = _connector(app, paced_endpoint, "paced")
    with FailoverClient(connect) as warm:  # the sidecar started and the model loaded before the clock matters
        list(map_ordered(warm, [(0, _pixels(0))]))
        pid = warm.ready["pid"]
    start = threading.Barrier(CLIENTS)
    results: dict[int, tuple] = {}
    failures: dict[int, BaseException] = {}

    def run_client(client: int) -> None:
        try:
            with FailoverClient(connect) as conn:
                start.wait(timeout=60)
                reds, waits, last = [], [], time.monotonic()
                items = [(seq, _pixels(client * REQUESTS_PER_CLIENT + seq)) for seq in range(REQUESTS_PER_CLIENT)]
                for seq, reply in map_ordered(conn, items, max_in_flight=REQUESTS_PER_CLIENT):
                    now = time.monotonic()
                    waits.append(now - last)
                    last = now
                    reds.append((seq, _echoed_red(reply)))
                results[client] = (reds, waits, conn.reconnects, conn.ready["pid"])
        except BaseException as e:  # reported below, with the client that saw it
            failures[client] = e

    threads = [threading.Thread(target=run_client, args=(c,), daemon=True) for c in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not failures, f"clients failed: {failures}"
    assert sorted(results) == list(range(CLIENTS))
    longest = 0.0
    for client, (reds, waits, reconnects, served_by) in results.items():
        assert reds == [(seq, client * REQUESTS_PER_CLIENT + seq) for seq in range(REQUESTS_PER_CLIENT)], reds
        assert reconnects == 0 and served_by == pid
        longest = max(longest, *waits)
    # The case at hand: some client waited longer than the timeout for a reply, and nothing was killed.
    assert longest > REQUEST_TIMEOUT_S, f"the longest wait was {longest:.1f} s; the test no longer waits past it"
    assert is_alive(ProcessId(pid, 0)) and sidecar_pids(app.app_id) == [pid]
    print(f"\n{CLIENTS} clients x {REQUESTS_PER_CLIENT} requests at {PACED_BATCH_S} s per batch: longest wait for a "
          f"reply {longest:.1f} s against a {REQUEST_TIMEOUT_S} s timeout; no sidecar stopped")


def test_a_model_stuck_in_one_forward_is_still_found_hung_while_its_sidecar_sends_progress(app, paced_endpoint):
    connect = _connector(app, paced_endpoint, "stuck")
    with FailoverClient(connect) as client:
        [(_, reply)] = list(map_ordered(client, [(0, _pixels(1))]))
        assert _echoed_red(reply) == 1
        pid = client.ready["pid"]
        started = time.monotonic()
        with pytest.raises(SidecarHung) as raised:  # the process lives; only the forward is stuck
            list(map_ordered(client, [(1, _pixels(STALL_MARK))]))
        waited = time.monotonic() - started

    message = str(raised.value)
    assert f"pid {pid}" in message and f"did not answer within {REQUEST_TIMEOUT_S:g} s" in message, message
    assert "SIGKILL" in message, message
    assert REQUEST_TIMEOUT_S <= waited < REQUEST_TIMEOUT_S + HANG_SLACK_S
    assert wait_until(lambda: gone(pid)) is not None, "the stuck sidecar was not stopped"
