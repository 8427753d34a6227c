"""FailoverClient's bookkeeping with in-process fake connections (no sockets, no sleeps): resent requests keep
their ids and order, each gets one reply, reconnections are bounded, a hang is not retried."""

from __future__ import annotations

import pytest

from spark_cnn.errors import SidecarError, SidecarHung, SidecarLost
from spark_cnn.task import protocol
from spark_cnn.task.client import SidecarFault, map_ordered
from spark_cnn.task.failover import FailoverClient
from spark_cnn.task.launcher import SidecarKilledStarting
from spark_cnn.task.protocol import ErrorKind


class FakeConnection:
    """Answers requests in order with their payload; dies (SidecarLost) after `die_after` replies, or hangs."""

    def __init__(self, log: list, die_after: int | None = None, hang: bool = False):
        self.log, self.die_after, self.hang = log, die_after, hang
        self.pid, self.socket_path = None, "/nowhere.sock"
        self.max_in_flight = protocol.MAX_REQUESTS_IN_FLIGHT
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

    def describe(self) -> str:
        return f"sidecar at {self.socket_path}"

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


class RepeatingConnection(FakeConnection):
    """Answers its first request twice, as a sidecar that sent two replies for one request would."""

    def receive(self):
        if self.replied == 1:
            self.replied += 1
            return 11, "a second reply"  # the first request's id again
        return super().receive()


def test_a_second_reply_for_one_request_fails_the_task_naming_it():
    client = FailoverClient(connector([RepeatingConnection([])]))

    with pytest.raises(SidecarError, match="replied to request 11, which has no request waiting"):
        list(map_ordered(client, [(0, "r0"), (1, "r1")], max_in_flight=1))


class FaultingConnection(FakeConnection):
    """Fails its first request with a model or device fault, as SidecarClient.receive raises it."""

    def __init__(self, log: list, kind: ErrorKind):
        super().__init__(log)
        self.kind = kind

    def receive(self):
        error = SidecarFault(f"{self.kind.value} failure in the sidecar at /nowhere.sock: RuntimeError: boom")
        error.kind, error.pid, error.socket_path = self.kind, None, self.socket_path
        raise error


@pytest.mark.parametrize("kind", [ErrorKind.MODEL, ErrorKind.DEVICE, ErrorKind.STICKY])
def test_a_model_or_device_fault_fails_the_task_without_reconnecting(kind):
    log: list = []
    client = FailoverClient(connector([FaultingConnection(log, kind), FakeConnection(log)]))

    with pytest.raises(SidecarFault, match=f"{kind.value} failure in the sidecar") as raised:
        list(map_ordered(client, [(0, "r0")]))
    assert client.reconnects == 0
    assert ("stopped so that the task's retry starts a new one" in str(raised.value)) == (kind == ErrorKind.STICKY)


def test_a_sidecar_killed_while_starting_is_started_again_within_the_bound():
    attempts: list[str] = []

    def connect():
        attempts.append("start")
        if len(attempts) <= 2:
            raise SidecarKilledStarting("the sidecar was killed by signal 9 while starting (out of memory?)")
        return FakeConnection([])

    client = FailoverClient(connect, max_reconnects=3)
    assert list(map_ordered(client, [(0, "r0")])) == [(0, "reply to r0")]
    assert len(attempts) == 3

    with pytest.raises(SidecarError, match="gave up after 2 attempts.*killed by signal 9 while starting"):
        FailoverClient(lambda: (_ for _ in ()).throw(SidecarKilledStarting(
            "the sidecar was killed by signal 9 while starting (out of memory?)")), max_reconnects=1)
