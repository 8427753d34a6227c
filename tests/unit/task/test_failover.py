"""FailoverClient's bookkeeping with in-process fake connections (no sockets, no sleeps): resent requests keep
their ids and order, each gets one reply, reconnections are bounded, a hang is not retried."""

from __future__ import annotations

import pytest

from spark_cnn.errors import SidecarError, SidecarHung, SidecarLost
from spark_cnn.task.client import map_ordered
from spark_cnn.task.failover import FailoverClient


class FakeConnection:
    """Answers requests in order with their payload; dies (SidecarLost) after `die_after` replies, or hangs."""

    def __init__(self, log: list, die_after: int | None = None, hang: bool = False):
        self.log, self.die_after, self.hang = log, die_after, hang
        self.pid, self.socket_path = None, "/nowhere.sock"
        self.pending: list[tuple[int, object]] = []
        self.next_id = 10
        self.replied = 0

    def submit(self, images) -> int:
        self.next_id += 1
        self.pending.append((self.next_id, images))
        self.log.append(("sent", images))
        return self.next_id

    def receive(self):
        if self.hang:
            raise SidecarHung("the sidecar at /nowhere.sock did not answer within 1 s")
        if self.die_after is not None and self.replied >= self.die_after:
            raise SidecarLost("the sidecar at /nowhere.sock closed the connection")
        self.replied += 1
        wire_id, images = self.pending.pop(0)
        return wire_id, f"reply to {images}"

    def stats(self, job: str) -> dict:
        return {"job": job}

    def close(self) -> None:
        pass


def connector(connections: list[FakeConnection]):
    queue = list(connections)
    return lambda: queue.pop(0)


def test_requests_in_flight_are_resent_in_order_and_each_replied_once():
    log: list = []
    client = FailoverClient(connector([FakeConnection(log, die_after=2), FakeConnection(log)]))

    replies = list(map_ordered(client, [(i, f"r{i}") for i in range(8)], max_in_flight=4))

    assert replies == [(i, f"reply to r{i}") for i in range(8)]
    assert client.reconnects == 1 and len(client.recovery_s) == 1
    sent = [images for kind, images in log if kind == "sent"]
    # r0 and r1 were answered before the death (r4 and r5 took their places); r2-r5 were in flight and went
    # again, first, in order; then the rest.
    assert sent == ["r0", "r1", "r2", "r3", "r4", "r5", "r2", "r3", "r4", "r5", "r6", "r7"]


def test_a_sidecar_that_keeps_dying_fails_the_task_after_the_bound():
    log: list = []
    client = FailoverClient(connector([FakeConnection(log, die_after=0) for _ in range(5)]), max_reconnects=3)

    with pytest.raises(SidecarError, match="gave up after 3 reconnections"):
        list(map_ordered(client, [(0, "r0")]))


def test_a_hang_is_not_retried_in_the_task():
    log: list = []
    client = FailoverClient(connector([FakeConnection(log, hang=True), FakeConnection(log)]))

    with pytest.raises(SidecarHung, match="did not answer within 1 s; it is gone already"):
        list(map_ordered(client, [(0, "r0")]))
    assert client.reconnects == 0
