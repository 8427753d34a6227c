"""One client connection of the sidecar: the handshake (token, model, decode place), then a reader thread that
checks each request and queues it on its model's service, and a writer thread that sends the replies in order.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from spark_cnn.errors import ConfigError, SidecarError
from spark_cnn.imaging.limits import DecodeOptions
from spark_cnn.sidecar.batch_decode import decode_on_gpu, decode_on_host
from spark_cnn.sidecar.lifecycle import WATCH_INTERVAL_S
from spark_cnn.sidecar.service import InferRequest, ModelService
from spark_cnn.task import protocol
from spark_cnn.task.protocol import ErrorKind, Kind
from spark_cnn.task.run_options import DECODE_PLACES

if TYPE_CHECKING:
    from spark_cnn.sidecar.server import SidecarServer

log = logging.getLogger("spark_cnn.sidecar")

# Requests one connection may have unanswered; its reader stops reading beyond that, so a client that sends
# without reading replies (or faster than the device) is held back by its socket instead of filling the
# sidecar's memory. Tasks keep 4 in flight (client.DEFAULT_MAX_IN_FLIGHT); the bound never slows them. READY
# tells clients the bound: one that kept more in flight would wait on this reader while it waits on them.
MAX_REQUESTS_PER_CONNECTION = protocol.MAX_REQUESTS_IN_FLIGHT
# A client has this long to send its HELLO after connecting; one that sends nothing is dropped, so idle
# connections cannot pile up threads. A real client sends it at once (the model loads after the HELLO).
HANDSHAKE_TIMEOUT_S = 10.0
# The agreed decode places at which requests carry image files, for this process to decode.
SIDECAR_DECODES = tuple(place for place in DECODE_PLACES if place != "task")


class Connection:
    """One client socket: a reader thread handles requests, a writer thread sends replies in order."""

    def __init__(self, sock: socket.socket, server: SidecarServer):
        self.sock = sock
        self.server = server
        self._outbox: queue.Queue = queue.Queue()
        self._unanswered = threading.BoundedSemaphore(MAX_REQUESTS_PER_CONNECTION)
        self._waiting = 0  # INFERs read and not yet answered: while any, the client hears PROGRESS
        self._waiting_lock = threading.Lock()
        self.progress = False  # the client asked for PROGRESS in its HELLO
        self._writer_failed = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="writer", daemon=True)
        self.decode_options = DecodeOptions()  # the client's guard rails, from its HELLO
        self.service: ModelService | None = None  # from the HELLO on; released when the connection ends

    def send(self, kind: Kind, request_id: int, payload=b"") -> None:
        self._outbox.put((kind, request_id, payload))

    def send_json(self, kind: Kind, request_id: int, data: dict) -> None:
        self.send(kind, request_id, json.dumps(data).encode("utf-8"))

    def _write_loop(self) -> None:
        """Send replies in order; never dies on a reply. A payload that cannot be sent becomes an ERROR for its
        request (nothing of it went out); a failure mid-frame breaks the stream, so the socket is shut down and
        the client, seeing it close, sends its requests in flight again (task/failover.py). Either way each
        request gets one reply on this connection at most."""
        while (item := self._outbox.get()) is not None:
            try:
                self._write(*item)
            finally:
                self._outbox.task_done()
        self._outbox.task_done()

    def _write(self, kind: Kind, request_id: int, payload) -> None:
        if self._writer_failed.is_set():
            return  # the stream is broken: what is left is dropped, and the client reconnects
        try:
            view = memoryview(payload)
        except Exception as e:
            log.error("reply to request %d cannot be sent: %s: %s", request_id, type(e).__name__, e)
            kind = Kind.ERROR
            view = memoryview(json.dumps(protocol.error_reply(
                f"the sidecar could not send its reply: {type(e).__name__}: {e}", ErrorKind.SIDECAR)).encode())
        try:
            protocol.send_frame(self.sock, kind, request_id, view)
        except Exception as e:
            log.warning("connection broken while sending request %d's reply: %s", request_id, e)
            self._writer_failed.set()  # the reader sees the shut socket too and ends the connection
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if kind in (Kind.RESULT, Kind.ERROR) and request_id != protocol.CONNECTION_REQUEST_ID:
            with self._waiting_lock:
                self._waiting -= 1
            self._unanswered.release()  # an INFER answered

    def waiting(self) -> bool:
        """The client waits for a reply: some INFER of this connection is unanswered."""
        with self._waiting_lock:
            return self._waiting > 0

    def drained(self) -> bool:
        """Every reply queued so far has been sent (or dropped with a broken socket)."""
        return self._outbox.unfinished_tasks == 0

    def serve(self) -> None:
        self._writer.start()
        try:
            service, job, decode = self._handshake()
            while True:
                frame = protocol.recv_frame(self.sock)
                self.server.touch()
                if frame.request_id == protocol.CONNECTION_REQUEST_ID:
                    raise SidecarError(f"request id {protocol.CONNECTION_REQUEST_ID} is reserved for the connection")
                if frame.kind == Kind.INFER:
                    self._wait_for_reply_slot()
                    self._infer(service, job, decode, frame)
                elif frame.kind == Kind.STATS:
                    self.send_json(Kind.STATS_REPLY, frame.request_id, self.server.describe(frame.json()["job"]))
                else:
                    raise SidecarError(f"unexpected {frame.kind.name} message after the handshake")
        except protocol.ConnectionClosed:
            pass
        except Exception as e:
            log.warning("connection ended: %s", e)
            self.send_json(Kind.ERROR, protocol.CONNECTION_REQUEST_ID, protocol.error_reply(str(e), ErrorKind.REQUEST))
        finally:
            self._outbox.put(None)
            self._writer.join(timeout=5)
            self.sock.close()
            self.server.connection_closed(self)

    def _wait_for_reply_slot(self) -> None:
        """Backpressure: at most MAX_REQUESTS_PER_CONNECTION requests of this connection are unanswered."""
        while not self._unanswered.acquire(timeout=WATCH_INTERVAL_S):
            if self._writer_failed.is_set():
                raise protocol.ConnectionClosed("the client stopped taking replies")
        with self._waiting_lock:
            self._waiting += 1

    def _handshake(self) -> tuple[ModelService, str, str]:
        deadline = self.server.settings.handshake_timeout_s
        self.sock.settimeout(deadline)
        try:
            frame = protocol.recv_frame(self.sock, max_bytes=protocol.MAX_HANDSHAKE_BYTES)
        except TimeoutError:
            raise SidecarError(f"no HELLO within {deadline:g} s of connecting; dropped the connection") from None
        self.sock.settimeout(None)
        if frame.kind != Kind.HELLO:
            raise SidecarError(f"expected HELLO first, got {frame.kind.name}")
        data = frame.json()
        token = str(data.get("token", "")) if isinstance(data, dict) else ""
        if not secrets.compare_digest(token.encode(), self.server.token.encode()):  # before anything else is read
            log.warning("refused a client with a wrong token (%s); neither token is logged", _peer(self.sock))
            raise SidecarError("refused: wrong sidecar token")
        hello = protocol.Hello.from_json(data)
        job, decode = hello.job, hello.decode
        if decode == "gpu" and self.server.device.type != "cuda":
            raise ConfigError(f"--decode gpu needs a CUDA device; this sidecar runs on {self.server.device}")
        self.decode_options = hello.decode_options
        self.progress = hello.progress
        service = self.service = self.server.services.service_for(hello.endpoint, hello.run_options,
                                                                   user=self)
        if decode == "auto":
            decode = self.server.services.decode_place(service)
        self.server.job_started(job, service, decode)
        self.send_json(Kind.READY, frame.request_id, {"pid": os.getpid(), "device": str(self.server.device),
                                                      "batch_size": service.target_rows, "decode": decode,
                                                      "precision": service.runner.precision,
                                                      "max_in_flight": MAX_REQUESTS_PER_CONNECTION,
                                                      "batches": self.server.stats.completed_batches})
        return service, job, decode

    def _infer(self, service: ModelService, job: str, decode: str, frame: protocol.Frame) -> None:
        """Queue one INFER: pixels where the tasks decode, files decoded here where the sidecar was agreed to
        decode (`decode`, from the handshake); any other request gets an ERROR."""
        prep = service.runner.endpoint.preprocessing
        row_errors = None
        try:
            images, task_cpu_s = protocol.decode_priced_request(frame.payload)
            if not len(images):
                raise SidecarError("an INFER request with no images")
            sized = isinstance(images, protocol.SizedImages)
            if sized != service.runner.endpoint.sized:
                raise SidecarError(f"{'images of their own sizes' if sized else 'fixed-size images'} for a model "
                                   f"that takes {'fixed-size crops' if sized else 'images at their own sizes'}")
            files = not sized and not isinstance(images, np.ndarray)
            if files != (decode in SIDECAR_DECODES):
                raise SidecarError(f"{'image files' if files else 'decoded pixels'} on a connection that agreed "
                                   f"to decode in {decode!r}; send {'pixels' if files else 'files'}")
            if sized:
                pixels = images
            elif not files:
                if images.shape[1:] != prep.pixel_shape:
                    raise SidecarError(f"images of shape {images.shape[1:]}, the model expects {prep.pixel_shape}")
                pixels = images
            else:
                decode_started = time.thread_time()
                if decode == "gpu":
                    pixels, row_errors = decode_on_gpu(images, prep, self.server.device, self.decode_options)
                else:
                    pixels, row_errors = decode_on_host(images, prep, self.decode_options)
                self.server.stats.decoded(job, time.thread_time() - decode_started)
        except Exception as e:
            self.server.stats.error(job)
            self.send_json(Kind.ERROR, frame.request_id, protocol.error_reply(f"bad request: {e}", ErrorKind.REQUEST))
            return
        self.server.stats.request(job, len(row_errors) if row_errors is not None else len(pixels), task_cpu_s)
        service.submit(InferRequest(self, frame.request_id, job, pixels, row_errors))


def _peer(sock: socket.socket) -> str:
    """'pid P, uid U' of the process at the other end of a Unix socket (Linux), for the log."""
    try:
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return f"pid {pid}, uid {uid}"
    except (AttributeError, OSError):  # no SO_PEERCRED on this platform
        return "peer unknown"
