"""The client's wait counts progress, against a scripted peer on a real Unix socket (no sidecar process): a send
held back past the timeout while batches complete goes through, the replies read meanwhile come out in order, and
PROGRESS with no completed batch still ends the wait as a hang."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from contextlib import contextmanager

import numpy as np
import pytest

from spark_cnn.errors import SidecarHung
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.spec import Endpoint
from spark_cnn.task import protocol
from spark_cnn.task.client import RequestFailed, SidecarClient
from spark_cnn.task.protocol import ErrorKind, Kind
from tests.scripted_peer import WAIT_S, scripted_peer

# Waits on the wall clock: a few multiples of a short timeout.
pytestmark = pytest.mark.slow

TIMEOUT_S = 0.5
HOLD_S = 3 * TIMEOUT_S  # how long the peer holds a send back, or keeps reporting no progress
BEAT_S = 0.1  # the peer's PROGRESS interval, short against TIMEOUT_S
# Far beyond a Unix socket's buffer (~200 KB): the client's send blocks until the peer reads it.
LARGE = np.zeros((400, 64, 64, 3), np.uint8)
ENDPOINT = Endpoint("peer:model", None, Preprocessing(resize=4, crop=4), top_k=1, fingerprint="f" * 16)


def beat(sock: socket.socket, seconds: float, batches) -> None:
    """PROGRESS every BEAT_S for `seconds`, counting `batches(i)` completed batches at beat i."""
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        try:
            protocol.send_json(sock, Kind.PROGRESS, protocol.CONNECTION_REQUEST_ID, {"batches": batches(i)})
        except OSError:  # the client gave up and closed: nobody to tell
            return
        time.sleep(BEAT_S)
        i += 1


def refuse(sock: socket.socket, request_id: int) -> None:
    protocol.send_json(sock, Kind.ERROR, request_id, protocol.error_reply(f"request {request_id}", ErrorKind.REQUEST))


@contextmanager
def peer(script):
    """A scripted peer whose one connection gets READY (0 batches completed), then `script(sock)`."""
    def checked(sock, hello) -> None:
        assert hello.json()["progress"] is True
        script(sock)

    with tempfile.TemporaryDirectory(prefix="scn") as directory:
        path = os.path.join(directory, "peer.sock")
        thread = scripted_peer(path, checked, ready={"pid": 4242, "decode": "task", "batches": 0})
        try:
            yield path
        finally:
            thread.join(WAIT_S)


def test_a_send_held_back_past_the_timeout_while_batches_complete_goes_through_and_replies_keep_order():
    def script(sock: socket.socket) -> None:
        first = protocol.recv_frame(sock)
        refuse(sock, first.request_id)  # answered while the client's next send is held back
        beat(sock, HOLD_S, batches=lambda i: i + 1)  # other tasks' batches complete; this one's queue is full
        second = protocol.recv_frame(sock)
        refuse(sock, second.request_id)

    with peer(script) as path, SidecarClient(path, "token", ENDPOINT, "job", timeout_s=TIMEOUT_S) as client:
        first = client.submit(np.zeros((1, 4, 4, 3), np.uint8))
        started = time.monotonic()
        second = client.submit(LARGE)
        held = time.monotonic() - started
        replies = [client.receive(), client.receive()]

    assert held >= HOLD_S - BEAT_S > TIMEOUT_S  # the send waited past the timeout, and did not give up
    assert [request_id for request_id, _ in replies] == [first, second]
    assert all(isinstance(reply, RequestFailed) for _, reply in replies)
    assert [str(reply).endswith(f"request {request_id}") for request_id, reply in replies] == [True, True]


def test_progress_that_reports_no_completed_batch_ends_the_wait_as_a_hang():
    def script(sock: socket.socket) -> None:
        protocol.recv_frame(sock)
        beat(sock, HOLD_S, batches=lambda i: 0)  # alive, but nothing completes: a model stuck in a forward

    with peer(script) as path, SidecarClient(path, "token", ENDPOINT, "job", timeout_s=TIMEOUT_S) as client:
        client.submit(np.zeros((1, 4, 4, 3), np.uint8))
        started = time.monotonic()
        with pytest.raises(SidecarHung, match="did not answer within 0.5 s and completed no batch"):
            client.receive()
        waited = time.monotonic() - started

    assert TIMEOUT_S <= waited < HOLD_S
