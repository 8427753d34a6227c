"""A sidecar connection's faults in-process (socket pairs, no sidecar process): a reply that cannot be sent,
a client that never says HELLO, and services nobody uses any more."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import pytest

from spark_cnn.sidecar.connection import Connection
from spark_cnn.sidecar.server import SidecarServer, SidecarSettings
from spark_cnn.task import protocol
from spark_cnn.task.protocol import ErrorKind, Kind
from spark_cnn.task.run_options import RunOptions

# Thread hand-offs take milliseconds; a broken connection never answers.
WAIT_S = 10.0
HANDSHAKE_TIMEOUT_S = 0.5


@dataclass
class StubServer:
    """What a Connection asks its server before and after the handshake."""

    settings: SidecarSettings
    closed: int = 0

    def connection_closed(self, conn) -> None:
        self.closed += 1

    def touch(self) -> None:
        pass


def _pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.settimeout(WAIT_S)
    return ours, theirs


def _settings(tmp_path, **overrides) -> SidecarSettings:
    return SidecarSettings(str(tmp_path / "s.sock"), str(tmp_path / "s.json"), device="cpu", **overrides)


def test_a_reply_that_cannot_be_sent_becomes_that_requests_error_and_the_writer_lives_on(tmp_path):
    ours, client = _pair()
    conn = Connection(ours, StubServer(_settings(tmp_path)))
    conn._writer.start()
    for _ in range(2):
        conn._wait_for_reply_slot()  # as the reader does for each INFER

    conn.send(Kind.RESULT, 5, object())  # not a buffer: nothing of it can go out
    conn.send(Kind.RESULT, 6, b"payload")
    first, second = protocol.recv_frame(client), protocol.recv_frame(client)

    assert (first.kind, first.request_id) == (Kind.ERROR, 5)
    assert first.json()["kind"] == ErrorKind.SIDECAR.value and "could not send" in first.json()["message"]
    assert (second.kind, second.request_id, bytes(second.payload)) == (Kind.RESULT, 6, b"payload")
    assert conn._writer.is_alive()
    conn._outbox.put(None)
    conn._writer.join(WAIT_S)
    assert conn.drained()
    ours.close()
    client.close()


def test_a_client_that_never_says_hello_is_dropped_after_the_deadline(tmp_path):
    ours, client = _pair()
    server = StubServer(_settings(tmp_path, handshake_timeout_s=HANDSHAKE_TIMEOUT_S))
    serving = threading.Thread(target=Connection(ours, server).serve, daemon=True)
    started = time.monotonic()
    serving.start()

    frame = protocol.recv_frame(client)  # the connection's farewell, then EOF
    serving.join(WAIT_S)

    assert not serving.is_alive(), "the connection still waits for a HELLO"
    assert (frame.kind, frame.request_id) == (Kind.ERROR, protocol.CONNECTION_REQUEST_ID)
    assert "no HELLO within 0.5 s" in frame.json()["message"]
    assert HANDSHAKE_TIMEOUT_S <= time.monotonic() - started < WAIT_S
    assert server.closed == 1
    with pytest.raises(protocol.ConnectionClosed):
        protocol.recv_frame(client)
    client.close()


def test_services_no_connection_uses_are_evicted_with_their_threads_and_model(tmp_path, endpoint):
    idle_s = 60.0
    server = SidecarServer(_settings(tmp_path, service_idle_s=idle_s))
    gone_user, staying_user = object(), object()
    services = server.services
    evicted = services.service_for(endpoint, user=gone_user)
    kept = services.service_for(endpoint, RunOptions(batch_size=3), user=staying_user)
    server.job_started("job-1", evicted)
    assert services.loaded_models() and evicted is not kept

    server.connection_closed(gone_user)
    assert services.evict_idle(now=time.monotonic() + idle_s / 2) == 0  # not idle for long enough yet
    assert services.evict_idle(now=time.monotonic() + idle_s) == 1

    assert not any(thread.is_alive() for thread in evicted._threads)
    assert all(thread.is_alive() for thread in kept._threads)
    assert services.job_service("job-1") is None  # the job no longer pins the dropped service
    assert services.loaded_models() == 1  # the model stays: the batch-size-3 service runs it too
    server.connection_closed(staying_user)
    assert services.evict_idle(now=time.monotonic() + idle_s) == 1
    assert services.loaded_models() == 0
    assert services.service_for(endpoint) is not evicted  # asked again: loaded again
