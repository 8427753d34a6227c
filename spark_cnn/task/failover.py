"""Survive a sidecar that dies mid-job, and retire one that hangs. Runs inside Spark tasks: no torch here.

A lost connection (EOF, reset, broken pipe: the sidecar was killed or crashed) is not the task's fault: the
`FailoverClient` connects again through its `connect` callable, which finds the dead sidecar's leftover files
and starts a new one (`launcher.ensure_sidecar`), and sends every request still in flight again, in order.
A request is in flight from its send until its reply is taken, so each gets exactly one reply: nothing is
lost and nothing is answered twice. A hung sidecar (no reply and no batch completed within the request
timeout, task/progress.py) is different: the task cannot tell a stuck model from a stuck sidecar, so it stops
that sidecar (so no attempt reuses it) and fails with a message that names it; Spark's task retry then starts on
a new sidecar. A sidecar killed while it
starts (the OOM killer, while it imports torch) is started again, within the same bound. A model or device
failure (SidecarFault) fails the task as it is; after a sticky device error the task also stops that sidecar,
so the retry runs on a fresh device context.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from spark_cnn.errors import SidecarError, SidecarHung, SidecarLost
from spark_cnn.task.client import Closing, SidecarClient, SidecarFault
from spark_cnn.task.launcher import retire_sidecar
from spark_cnn.task.procs import process_id
from spark_cnn.task.protocol import ErrorKind

log = logging.getLogger("spark_cnn.failover")

# Reconnections one task may make before it fails (and Spark retries it): a sidecar killed once is an
# incident; one that dies again at once (a model that crashes the process) must not loop forever.
DEFAULT_MAX_RECONNECTS = 3


class FailoverClient(Closing):
    """A SidecarClient (submit / receive / stats) that reconnects and resends when its sidecar dies.

    `connect()` returns a new, handshaken SidecarClient (starting a sidecar when none lives). Request ids are
    this object's own: they stay valid across reconnections. `reconnects` and `recovery_s` (seconds from the
    failure to the requests being sent again, per reconnection) say what happened.
    """

    def __init__(self, connect: Callable[[], SidecarClient], *, max_reconnects: int = DEFAULT_MAX_RECONNECTS):
        self._connect = connect
        self.max_reconnects = max_reconnects
        self.reconnects = 0
        self.recovery_s: list[float] = []
        self._ids = itertools.count(1)
        self._in_flight: dict[int, np.ndarray | list[bytes]] = {}  # our id -> images, in submission order
        self._ours: dict[int, int] = {}  # the current connection's request id -> our id
        self._client = self._first_connection()

    @property
    def ready(self) -> dict:
        return self._client.ready

    @property
    def max_in_flight(self) -> int:
        """Requests the current connection may have unanswered (its sidecar's READY)."""
        return self._client.max_in_flight

    @property
    def decode(self) -> str:
        """Where this connection's images are decoded: as asked, or the sidecar's pick for `auto`."""
        return self._client.decode

    @property
    def socket_path(self) -> str:
        return self._client.socket_path

    def submit(self, images: np.ndarray | list[bytes]) -> int:
        request_id = next(self._ids)
        self._in_flight[request_id] = images
        try:
            self._ours[self._client.submit(images)] = request_id
        except SidecarLost as e:
            self._recover(e)  # sends everything in flight again, this request included
        except SidecarHung as e:
            raise _retired(e) from e
        return request_id

    def receive(self) -> tuple[int, pa.RecordBatch | SidecarError]:
        while True:
            try:
                wire_id, reply = self._client.receive()
            except SidecarLost as e:
                self._recover(e)
                continue
            except SidecarHung as e:
                raise _retired(e) from e
            except SidecarFault as e:
                if e.kind == ErrorKind.STICKY:
                    raise _retired_after_fault(e) from e
                raise
            request_id = self._ours.pop(wire_id, None)
            if request_id is None:  # a second reply, or one for a request never sent: the stream cannot be trusted
                raise SidecarError(f"the {self._client.describe()} replied to request {wire_id}, which has no "
                                   "request waiting; the task fails so that Spark retries it")
            del self._in_flight[request_id]
            return request_id, reply

    def stats(self, job: str) -> dict:
        while True:
            try:
                return self._client.stats(job)
            except SidecarLost as e:
                self._recover(e)
            except SidecarHung as e:
                raise _retired(e) from e

    def _first_connection(self) -> SidecarClient:
        error = None
        for _ in range(self.max_reconnects + 1):
            try:
                return self._connect()
            except SidecarLost as e:  # it died between being found and being reached: find or start again
                error = e
            except SidecarHung as e:  # it hangs in the handshake
                raise _retired(e) from e
        raise SidecarError(f"gave up after {self.max_reconnects + 1} attempts to reach a sidecar: {error}") from error

    def _recover(self, error: SidecarLost) -> None:
        started = time.monotonic()
        while True:
            if self.reconnects >= self.max_reconnects:
                raise SidecarError(f"{error}; gave up after {self.reconnects} reconnections in this task") from error
            self.reconnects += 1
            log.warning("%s; reconnecting (%d/%d) and sending %d request(s) again", error, self.reconnects,
                        self.max_reconnects, len(self._in_flight))
            self._client.close()
            try:
                self._client = self._connect()
                self._ours = {self._client.submit(images): request_id
                              for request_id, images in self._in_flight.items()}
            except SidecarLost as e:
                error = e
                continue
            except SidecarHung as e:
                raise _retired(e) from e
            self.recovery_s.append(time.monotonic() - started)
            return

    def close(self) -> None:
        self._client.close()


def _retired_after_fault(error: SidecarFault) -> SidecarFault:
    """Stop a sidecar whose device is unusable (it retires itself too); the error to raise, naming the cause."""
    pid, socket_path = getattr(error, "pid", None), getattr(error, "socket_path", None)
    if pid and socket_path:
        retire_sidecar(process_id(pid), socket_path, str(error))
    fault = SidecarFault(f"{error}; the sidecar is stopped so that the task's retry starts a new one")
    fault.kind, fault.pid, fault.socket_path = error.kind, pid, socket_path
    return fault


def _retired(error: SidecarHung) -> SidecarHung:
    """Stop the hung sidecar, so that no task (this one's retry included) talks to it again; the error to raise."""
    pid, socket_path = getattr(error, "pid", None), getattr(error, "socket_path", None)
    stopped = bool(pid and socket_path) and retire_sidecar(process_id(pid), socket_path, str(error))
    what = "stopped it (SIGKILL)" if stopped else "it is gone already"
    return SidecarHung(f"{error}; {what} so that the task's retry starts a new sidecar")
