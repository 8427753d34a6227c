"""Load: 16 clients x 1,000 requests against one real sidecar serving a slow model.

Each client sends as fast as its socket takes requests (a sender thread) while a receiver thread takes the
replies, so nothing but the sidecar's own backpressure limits what is in flight. Every request carries its
(client, sequence number, row) in its first pixel and the echo model returns that pixel: every reply row is
checked against its request. The sidecar's resident memory is sampled throughout. Without backpressure the
sidecar would hold up to all 786 MB of requests; with it, a bounded number per connection and in its queue.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from spark_cnn.errors import SidecarHung
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import ModelSpec
from spark_cnn.task import protocol
from spark_cnn.task.client import SidecarClient, map_ordered
from spark_cnn.task.launcher import ensure_sidecar
from spark_cnn.task.run_options import RunOptions
from tests.sidecar_doubles import ECHO_PREPROCESSING, SLOW_ECHO_FACTORY, WIDE_ECHO_FACTORY, pythonpath_with_repo
from tests.sidecar_harness import fake_app

pytestmark = pytest.mark.e2e

CLIENTS = 16
# 31 times the per-connection bound (protocol.MAX_REQUESTS_IN_FLIGHT = 32) per client, and all requests together
# 2.6 times RSS_GROWTH_BOUND_MB: a sidecar that buffered without bound would cross it, one that deadlocks under a
# full queue stalls long before the end. More requests only repeat the same waits (2,000 took twice as long).
REQUESTS_PER_CLIENT = 1_000
MAX_ROWS_PER_REQUEST = 3
BATCH_SIZE = 64
FIXED_BATCH = RunOptions(batch_size=BATCH_SIZE)  # the batch size each client asks for in its HELLO
# The bound for the whole test, sidecar start included.
LOAD_BOUND_S = 120.0
# Growth of the sidecar's resident memory over the load, above its size after the first request. The design
# bound (connection.MAX_REQUESTS_PER_CONNECTION x 16 connections x 3 rows x 12 KB = 19 MB, plus the queue's
# 8 batches x 64 rows x 12 KB = 6 MB, plus batches being computed and Python's allocator slack) is ~40 MB;
# all requests are 16 x 1,000 x 2 rows x 12 KB = 393 MB.
RSS_GROWTH_BOUND_MB = 150.0
SAMPLE_INTERVAL_S = 0.05


@pytest.fixture(autouse=True)
def echo_model_importable(monkeypatch):
    """The sidecar imports the echo model by name in its own process, which inherits this environment."""
    monkeypatch.setenv("PYTHONPATH", pythonpath_with_repo())


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError(f"no VmRSS for pid {pid}")


def request_pixels(client: int, seq: int) -> np.ndarray:
    rows = 1 + seq % MAX_ROWS_PER_REQUEST
    pixels = np.full((rows, *ECHO_PREPROCESSING.pixel_shape), 7, dtype=np.uint8)
    pixels[:, 0, 0, 0] = client + CLIENTS * np.arange(rows)  # client and row
    pixels[:, 0, 0, 1] = seq >> 8
    pixels[:, 0, 0, 2] = seq & 0xFF
    return pixels


def echoed(reply: pa.RecordBatch) -> np.ndarray:
    logits = reply.column("logits").flatten().to_numpy().reshape(reply.num_rows, 3)
    return np.rint(logits).astype(np.int64)


def run_client(info, endpoint, job: str, client: int, results: dict, start: threading.Barrier) -> None:
    sent: dict[int, int] = {}  # seq -> request id
    replies: dict[int, object] = {}
    with SidecarClient(info.socket, info.token, endpoint, job, run_options=FIXED_BATCH) as conn:
        start.wait(timeout=60)

        def send_all() -> None:
            for seq in range(REQUESTS_PER_CLIENT):
                sent[seq] = conn.submit(request_pixels(client, seq))

        sender = threading.Thread(target=send_all, name=f"sender-{client}")
        sender.start()
        for _ in range(REQUESTS_PER_CLIENT):
            request_id, reply = conn.receive()
            assert request_id not in replies, f"client {client}: two replies for request {request_id}"
            replies[request_id] = reply
        sender.join(timeout=LOAD_BOUND_S)
    results[client] = (sent, replies)


def test_16_clients_x_1000_requests_every_result_matches_memory_bounded_no_deadlock(tmp_path):
    started = time.monotonic()
    endpoint = resolve_endpoint(ModelSpec(SLOW_ECHO_FACTORY), logits=True).endpoint
    job = "load"
    with fake_app("load") as app:
        info = ensure_sidecar(app.options(), app.executor)
        with SidecarClient(info.socket, info.token, endpoint, job, run_options=FIXED_BATCH) as warm:
            list(map_ordered(warm, [(0, request_pixels(0, 0))]))  # model loaded, service threads running
        baseline = rss_mb(info.pid)
        peak = [baseline]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_mb(info.pid))
                time.sleep(SAMPLE_INTERVAL_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        results: dict[int, tuple] = {}
        start = threading.Barrier(CLIENTS)
        threads = [threading.Thread(target=run_client, args=(info, endpoint, job, c, results, start), daemon=True)
                   for c in range(CLIENTS)]
        load_started = time.monotonic()
        for thread in threads:
            thread.start()
        deadline = started + LOAD_BOUND_S
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        load_s = time.monotonic() - load_started
        done.set()
        stuck = [t.name for t in threads if t.is_alive()]
        assert not stuck, f"{len(stuck)} clients still waiting after {LOAD_BOUND_S} s: deadlock or far too slow"
        with SidecarClient(info.socket, info.token, endpoint, job) as conn:
            stats = conn.stats(job)

    assert len(results) == CLIENTS, f"{CLIENTS - len(results)} clients failed"
    rows = 0
    for client, (sent, replies) in results.items():
        assert sorted(sent) == list(range(REQUESTS_PER_CLIENT))
        assert set(replies) == set(sent.values()), f"client {client}: replies do not match requests one to one"
        for seq, request_id in sent.items():
            reply = replies[request_id]
            assert isinstance(reply, pa.RecordBatch), f"client {client} request {seq}: {reply}"
            expected = request_pixels(client, seq)[:, 0, 0, :].astype(np.int64)
            np.testing.assert_array_equal(echoed(reply), expected, err_msg=f"client {client} request {seq}")
            rows += reply.num_rows
    assert stats["requests"] == CLIENTS * REQUESTS_PER_CLIENT + 1 and stats["errors"] == 0
    assert stats["images"] == rows + 1
    growth = peak[0] - baseline
    assert growth < RSS_GROWTH_BOUND_MB, f"sidecar RSS grew {growth:.0f} MB (from {baseline:.0f} MB)"
    assert time.monotonic() - started < LOAD_BOUND_S
    print(f"\nload: {CLIENTS} clients x {REQUESTS_PER_CLIENT} requests ({rows} rows) in {load_s:.1f} s, "
          f"{CLIENTS * REQUESTS_PER_CLIENT / load_s:.0f} requests/s, mean batch {stats['mean_batch_size']}, "
          f"sidecar RSS {baseline:.0f} MB -> peak {peak[0]:.0f} MB (+{growth:.0f} MB)")


def test_a_client_that_never_reads_replies_is_held_back_and_others_are_still_served():
    """Backpressure per connection: the sidecar stops reading from a client whose replies pile up, so that
    client's sends block (here: time out) after a bounded number of requests, and other clients go on. A client
    that asks for twice the bound in flight, with replies far larger than a socket's buffer, is kept within the
    bound the sidecar states (READY) and finishes: past it, its sends would wait on a sidecar waiting on it."""
    endpoint = resolve_endpoint(ModelSpec(SLOW_ECHO_FACTORY), logits=True).endpoint
    wide = resolve_endpoint(ModelSpec(WIDE_ECHO_FACTORY), logits=True).endpoint
    with fake_app("flood") as app:
        info = ensure_sidecar(app.options(), app.executor)
        flooder = SidecarClient(info.socket, info.token, endpoint, "flood", run_options=FIXED_BATCH, timeout_s=5.0)
        sent = 0
        try:
            with pytest.raises(SidecarHung):  # sendall blocked for 5 s: the sidecar stopped reading
                for seq in range(REQUESTS_PER_CLIENT):
                    flooder.submit(request_pixels(0, seq))
                    sent += 1
            with SidecarClient(info.socket, info.token, endpoint, "polite", run_options=FIXED_BATCH) as polite:
                [(_, reply)] = list(map_ordered(polite, [(1, request_pixels(1, 5))]))
            with SidecarClient(info.socket, info.token, wide, "greedy", run_options=FIXED_BATCH,
                               timeout_s=20.0) as greedy:
                bound = greedy.max_in_flight
                wide_requests = [(seq, request_pixels(2, seq)[:1]) for seq in range(3 * bound)]
                wide_replies = list(map_ordered(greedy, wide_requests, max_in_flight=2 * bound))
            rss = rss_mb(info.pid)
        finally:
            flooder.close()

    np.testing.assert_array_equal(echoed(reply), request_pixels(1, 5)[:, 0, 0, :].astype(np.int64))
    assert sent < REQUESTS_PER_CLIENT, "the sidecar read every request of a client that took no reply"
    assert bound == protocol.MAX_REQUESTS_IN_FLIGHT
    assert [seq for seq, _ in wide_replies] == list(range(3 * bound))
    for (seq, pixels), (_, wide_reply) in zip(wide_requests, wide_replies, strict=True):
        echoed_pixels = wide_reply.column("logits").flatten().to_numpy().reshape(1, 3, *pixels.shape[1:3])
        np.testing.assert_array_equal(np.rint(echoed_pixels).transpose(0, 2, 3, 1), pixels,
                                      err_msg=f"wide request {seq}")
    print(f"\nflood: a client that never reads got {sent} requests in before its sends blocked; "
          f"sidecar RSS {rss:.0f} MB")
