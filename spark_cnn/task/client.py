"""Talk to a sidecar from a Spark task: handshake, then keep several requests in flight, results in order."""

from __future__ import annotations

import contextlib
import itertools
import json
import select
import socket
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from spark_cnn.errors import SidecarError, SidecarFault, SidecarHung, SidecarLost
from spark_cnn.imaging.limits import DEFAULT_DECODE, DecodeOptions
from spark_cnn.models.spec import Endpoint
from spark_cnn.task import protocol
from spark_cnn.task.progress import ProgressDeadline
from spark_cnn.task.protocol import ErrorKind, Kind
from spark_cnn.task.run_options import DEFAULT_RUN, PIXELS_DECODE_PLACE, RunOptions

# This long with no reply and no batch completed anywhere in the sidecar means it hangs; the task fails and
# Spark retries it. A wait behind other tasks' requests does not count while their batches complete
# (task/progress.py), so the bound is one device batch, not a queue: well under a second on a GPU, tens of
# seconds for a detector's batch on a slow CPU; the handshake loads the model (seconds; torch.compile happens
# later, at the first batch). Five minutes leaves room and still ends a stuck task.
REPLY_TIMEOUT_S = 300.0
# Rows per request a task sends: large enough to amortise a message (~0.1 ms), small enough that the
# batcher can fill device batches from several tasks at once.
DEFAULT_REQUEST_ROWS = 16
# Requests a client keeps in flight: enough to hide a round trip and the client's own decoding, and on a CPU
# sidecar, which waits up to 100 ms for a full batch and computes two at once, enough rows (8 x 16) to cover a
# batch filling while two compute. On the 2-core host 4 left the cores 1.91 busy, 8 1.93-1.96 (mobilenet_v3_small,
# six jobs alternating, docs/benchmarks.md).
DEFAULT_MAX_IN_FLIGHT = 8
# How often a send held back re-checks its deadline while another thread reads the connection: that thread takes
# the PROGRESS messages, which move the deadline the sender waits on.
SEND_POLL_S = 0.1


class RequestFailed(SidecarError):
    """The sidecar refused one request for its own input (ErrorKind.REQUEST): its rows carry the message."""


class Closing(contextlib.AbstractContextManager):
    """A client used as `with client:` is closed on the way out, however the block ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __exit__(self, *exc) -> None:
        self.close()


class SidecarClient(Closing):
    """One connection to a sidecar, bound to one endpoint (model + heads), one job id, how the model runs
    (`run_options`; `batch_size` None is the sidecar's choice) and where images are decoded (`task`: requests
    carry pixels; `sidecar` or `gpu`: requests carry files, decoded under `decode_options`, the guard rails;
    `auto`: the sidecar picks). All of it goes in the HELLO (protocol.Hello)."""

    def __init__(self, socket_path: str, token: str, endpoint: Endpoint, job: str, *,
                 run_options: RunOptions = DEFAULT_RUN, decode: str = PIXELS_DECODE_PLACE,
                 decode_options: DecodeOptions = DEFAULT_DECODE, timeout_s: float = REPLY_TIMEOUT_S,
                 pid: int | None = None):
        hello = protocol.Hello(token, endpoint, job, decode=decode, run_options=run_options,
                               decode_options=decode_options, progress=True)
        self.socket_path = socket_path
        self.pid = pid  # the sidecar's: from its info file if given, else from its READY; errors name it
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)
        self._early: deque[protocol.Frame] = deque()  # frames read while a send was held back, for _recv
        # One thread reads frames at a time: a client may send from one thread while another takes its replies.
        self._reader = threading.Lock()
        self._deadline = ProgressDeadline(timeout_s)  # no PROGRESS before READY: the handshake is timed as a whole
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(socket_path)
            protocol.send_json(self._sock, Kind.HELLO, next(self._ids), hello.to_json())
            reply = self._recv()
        except (OSError, SidecarError) as e:
            self._sock.close()
            if isinstance(e, SidecarError):
                raise
            # No listener behind the socket file (or no file): the sidecar is gone; a new one can be started.
            raise SidecarLost(f"cannot reach the sidecar at {socket_path}: {e}") from e
        if reply.kind != Kind.READY:
            self._sock.close()
            raise SidecarError(f"sidecar at {socket_path} refused the connection: {_message(reply)}")
        self.ready = reply.json()
        self.pid = self.ready.get("pid", pid)
        batches = self.ready.get("batches")  # the baseline for PROGRESS; None from a sidecar that sends none
        self._deadline = ProgressDeadline(timeout_s, batches=batches if isinstance(batches, int) else None)
        # Where this connection's images are decoded: as asked, or the sidecar's pick when asked for `auto`.
        self.decode = self.ready.get("decode") or decode
        # Requests this connection may have unanswered: map_ordered keeps within it (protocol.py says why).
        self.max_in_flight = int(self.ready.get("max_in_flight", protocol.MAX_REQUESTS_IN_FLIGHT))

    def submit(self, images: protocol.PricedImages | np.ndarray | list[bytes] | protocol.SizedImages) -> int:
        """Send one INFER request: (N, H, W, 3) uint8 pixels, N image files or SizedImages, priced with the task's
        CPU for them or not; returns its request id."""
        request_id = next(self._ids)
        self._send(Kind.INFER, request_id, protocol.encode_request(images))
        return request_id

    def receive(self) -> tuple[int, pa.RecordBatch | RequestFailed]:
        """The next reply: (request id, outputs) or (request id, RequestFailed) when the sidecar refused that
        request's input. Raises SidecarFault when the model, the device or the sidecar failed it."""
        frame = self._recv()
        if frame.kind == Kind.RESULT:
            return frame.request_id, protocol.decode_outputs(frame.payload)
        if frame.kind == Kind.ERROR:
            if frame.request_id == protocol.CONNECTION_REQUEST_ID:
                raise SidecarError(f"sidecar at {self.socket_path}: {_message(frame)}")
            kind = _error_kind(frame)
            if kind == ErrorKind.REQUEST:
                return frame.request_id, RequestFailed(f"sidecar at {self.socket_path}: {_message(frame)}")
            raise self._fault(kind, _message(frame))
        raise SidecarError(f"unexpected {frame.kind.name} reply from the sidecar at {self.socket_path}")

    def _fault(self, kind: ErrorKind, message: str) -> SidecarFault:
        error = SidecarFault(f"{kind.value} failure in the {self.describe()}: {message}")
        error.kind, error.pid, error.socket_path = kind, self.pid, self.socket_path
        return error

    def stats(self, job: str) -> dict:
        """Counters of this sidecar for `job`. Call with no request in flight."""
        request_id = next(self._ids)
        self._send(Kind.STATS, request_id, json.dumps({"job": job}).encode("utf-8"))
        frame = self._recv()
        if frame.kind != Kind.STATS_REPLY:
            raise SidecarError(f"expected STATS_REPLY, got {frame.kind.name}: {_message(frame)}")
        return frame.json()

    def _send(self, kind: Kind, request_id: int, payload) -> None:
        view = memoryview(payload).cast("B")
        self._deadline.restart()
        try:
            self._send_all(memoryview(protocol.HEADER.pack(int(kind), request_id, view.nbytes)))
            self._send_all(view)
        except TimeoutError as e:  # the sidecar stopped reading and completed no batch meanwhile
            raise self._hung() from e
        except (protocol.ConnectionClosed, OSError) as e:  # BrokenPipeError and friends: the sidecar is gone
            raise SidecarLost(f"cannot send to the {self.describe()} ({e}); did it exit? see its "
                              f".log beside the socket") from e

    def _send_all(self, data: memoryview) -> None:
        """Send `data`, reading what arrives while the sidecar holds the send back (its queue is full, behind
        other tasks' work): PROGRESS extends the deadline, replies wait in `_early` for `_recv`. Replies are read
        ahead only up to the connection's bound: a client that keeps more unread (one that never takes its
        replies) is held back by its socket, as the sidecar's backpressure intends, and times out. While another
        thread is reading the connection (a receiver thread), the send only waits: that thread reads."""
        poll = select.poll()
        poll.register(self._sock, select.POLLOUT)
        while data:
            remaining = self._deadline.remaining()
            if remaining <= 0:
                raise TimeoutError("no progress while sending")
            reading = len(self._early) < self.max_in_flight and self._reader.acquire(blocking=False)
            try:
                poll.modify(self._sock, select.POLLOUT | (select.POLLIN if reading else 0))
                events = poll.poll((remaining if reading else min(remaining, SEND_POLL_S)) * 1000)
                if reading and any(event & (select.POLLIN | select.POLLHUP | select.POLLERR) for _, event in events):
                    self._take(self._read_frame())  # EOF or a reset raises here, as in _recv
            finally:
                if reading:
                    self._reader.release()
            if any(event & select.POLLOUT for _, event in events):
                try:  # never blocks, and leaves the socket's timeout to the reading thread
                    data = data[self._sock.send(data, socket.MSG_DONTWAIT):]
                except (BlockingIOError, InterruptedError):
                    pass

    def _take(self, frame: protocol.Frame) -> None:
        if frame.kind == Kind.PROGRESS:
            self._deadline.progress(_batches(frame))
        else:
            self._early.append(frame)

    def _recv(self) -> protocol.Frame:
        """The next frame that is not a PROGRESS; waits while replies or progress keep coming (progress.py)."""
        self._deadline.restart()
        try:
            while True:
                with self._reader:
                    frame = self._early.popleft() if self._early else self._read_frame()
                if frame.kind != Kind.PROGRESS:
                    return frame
                self._deadline.progress(_batches(frame))
        except TimeoutError as e:
            raise self._hung() from e
        except (protocol.ConnectionClosed, OSError) as e:  # EOF, or ECONNRESET when it died mid-message
            raise SidecarLost(f"the {self.describe()} closed the connection (did it exit? see its "
                              f".log beside the socket)") from e

    def _read_frame(self) -> protocol.Frame:
        remaining = self._deadline.remaining()
        if remaining <= 0:
            raise TimeoutError("no progress")
        self._sock.settimeout(remaining)
        return protocol.recv_frame(self._sock)

    def _hung(self) -> SidecarHung:
        error = SidecarHung(f"the {self.describe()} did not answer within {self.timeout_s:g} s and completed "
                            "no batch of any task in that time")
        error.pid, error.socket_path = self.pid, self.socket_path  # for whoever stops it (failover.py)
        return error

    def describe(self) -> str:
        """'sidecar pid N at SOCKET': how errors name the sidecar."""
        return f"sidecar{f' pid {self.pid}' if self.pid else ''} at {self.socket_path}"

    def close(self) -> None:
        self._sock.close()


def map_ordered(client: SidecarClient, items: Iterable[tuple[Any, np.ndarray | list[bytes]]],
                max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> Iterator[tuple[Any, Any]]:
    """Send each item's images with up to `max_in_flight` requests outstanding; yield (key, reply) in order.

    The reply is a RecordBatch of outputs or a RequestFailed for that request. `items` is pulled lazily, so
    producing the next item (decoding) overlaps with the sidecar's work on earlier ones. `max_in_flight` is
    capped at the connection's own bound (`client.max_in_flight`, from the sidecar's READY).
    """
    max_in_flight = max(1, min(max_in_flight, client.max_in_flight))
    pending: deque[tuple[Any, int]] = deque()  # (key, request id) in send order, until yielded
    replies: dict[int, Any] = {}
    in_flight = 0

    def drain_ready_head() -> Iterator[tuple[Any, Any]]:
        while pending and pending[0][1] in replies:
            key, request_id = pending.popleft()
            yield key, replies.pop(request_id)

    for key, images in items:
        while in_flight >= max_in_flight:
            request_id, reply = client.receive()
            replies[request_id] = reply
            in_flight -= 1
        pending.append((key, client.submit(images)))
        in_flight += 1
        yield from drain_ready_head()
    while in_flight:
        request_id, reply = client.receive()
        replies[request_id] = reply
        in_flight -= 1
        yield from drain_ready_head()


def _batches(frame: protocol.Frame) -> int:
    """The completed-batch count of a PROGRESS message."""
    try:
        batches = frame.json()["batches"]
    except (ValueError, TypeError, KeyError):
        batches = None
    if not isinstance(batches, int):
        raise SidecarError(f"a PROGRESS message without a batch count: {bytes(frame.payload)[:100]!r}")
    return batches


def _error_kind(frame: protocol.Frame) -> ErrorKind:
    try:
        return protocol.error_kind(frame.json())
    except ValueError:
        return ErrorKind.SIDECAR


def _message(frame: protocol.Frame) -> str:
    try:
        return str(frame.json().get("message", frame.json()))
    except ValueError:
        return f"<{frame.kind.name} message>"


def sidecar_key(snapshot: dict) -> str:
    """Which sidecar a stats snapshot came from: host and pid name it for the life of a job."""
    return f"{snapshot['host']}:{snapshot['pid']}"
