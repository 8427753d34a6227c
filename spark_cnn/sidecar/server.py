"""The sidecar process: one per executor, owns the device, serves every task of that executor.

Threads: the main thread accepts connections and watches for exit conditions (executor gone, idle, SIGTERM);
each connection has a reader (requests into the work queue) and a writer (results out, so a slow client never
blocks the device); each served model has one device thread that takes batches from its queue and runs them.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import signal
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from spark_cnn.errors import SidecarError
from spark_cnn.models.spec import Endpoint
from spark_cnn.sidecar import protocol
from spark_cnn.sidecar.launcher import DEFAULT_IDLE_TIMEOUT_S
from spark_cnn.sidecar.procs import ProcessId, is_alive
from spark_cnn.sidecar.protocol import Kind
from spark_cnn.sidecar.runner import ModelRegistry, ModelRunner, resolve_device
from spark_cnn.sidecar.work_queue import WorkQueue

log = logging.getLogger("spark_cnn.sidecar")

# Until the tuner (perf/) decides, the batch size by device type. On the 2-core CPU host mobilenet_v3_small
# ran fastest at batch 8 (129-188 img/s vs 58-79 at 1 and 86-100 at 64); GPUs want large batches.
AUTO_BATCH_ROWS = {"cpu": 8, "cuda": 64}
# How long a partial batch may wait for more rows: small against a CPU batch (~50 ms), enough to merge tasks.
MAX_BATCH_DELAY_S = 0.01
# Queue bound, in batches: enough to keep the device busy while clients refill, small enough for memory
# (8 x 64 rows x 150 KB = 77 MB at 224 px on a GPU).
MAX_QUEUED_BATCHES = 8
# How often the main thread checks the executor process and the idle timer.
WATCH_INTERVAL_S = 0.5


@dataclass(frozen=True)
class SidecarSettings:
    socket_path: str
    info_path: str
    device: str = "auto"
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    watch: ProcessId | None = None  # exit when this process (the executor JVM) is gone
    app_id: str = ""
    executor_id: str = ""


class JobStats:
    """Counters per job id (a sidecar may outlive a job and serve the next one)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs: dict[str, dict] = defaultdict(self._zero)

    @staticmethod
    def _zero() -> dict:
        return {"batch_size": None, "requests": 0, "images": 0, "batches": 0, "batch_rows": 0, "errors": 0,
                "device_s": 0.0}

    def start(self, job: str, batch_rows: int) -> None:
        with self._lock:
            self._jobs[job]["batch_size"] = batch_rows

    def request(self, job: str, rows: int) -> None:
        with self._lock:
            self._jobs[job]["requests"] += 1
            self._jobs[job]["images"] += rows

    def error(self, job: str) -> None:
        with self._lock:
            self._jobs[job]["errors"] += 1

    def batch(self, jobs: set[str], rows: int, device_s: float) -> None:
        with self._lock:
            for job in jobs:
                counters = self._jobs[job]
                counters["batches"] += 1
                counters["batch_rows"] += rows
                counters["device_s"] += device_s

    def snapshot(self, job: str) -> dict:
        with self._lock:
            counters = dict(self._jobs.get(job) or self._zero())
        batches = counters.pop("batch_rows"), counters["batches"]
        counters["mean_batch_size"] = round(batches[0] / batches[1], 2) if batches[1] else 0.0
        counters["device_s"] = round(counters["device_s"], 3)
        return counters


class InferRequest:
    """One INFER message in flight: its pixels, and the output rows gathered so far from device batches."""

    __slots__ = ("conn", "request_id", "job", "pixels", "rows", "chunks", "done_rows", "failed")

    def __init__(self, conn: Connection, request_id: int, job: str, pixels: np.ndarray):
        self.conn, self.request_id, self.job, self.pixels = conn, request_id, job, pixels
        self.rows = len(pixels)
        self.chunks: list[dict] = []
        self.done_rows = 0
        self.failed = False

    def deliver(self, outputs: dict[str, np.ndarray]) -> None:
        self.chunks.append(outputs)
        self.done_rows += len(next(iter(outputs.values())))
        if self.done_rows == self.rows:
            merged = self.chunks[0] if len(self.chunks) == 1 else {
                key: np.concatenate([chunk[key] for chunk in self.chunks]) for key in self.chunks[0]}
            self.conn.send(Kind.RESULT, self.request_id, protocol.encode_outputs(merged))
            self.chunks = []

    def fail(self, message: str) -> None:
        if not self.failed:
            self.failed = True
            self.conn.send_json(Kind.ERROR, self.request_id, {"message": message})


class ModelService:
    """One served model: its runner, its work queue and the device thread between them."""

    def __init__(self, runner: ModelRunner, target_rows: int, stats: JobStats):
        self.runner = runner
        self.stats = stats
        self.queue = WorkQueue(target_rows, MAX_BATCH_DELAY_S, MAX_QUEUED_BATCHES * target_rows)
        self._thread = threading.Thread(target=self._device_loop, name="device", daemon=True)
        self._thread.start()

    def _device_loop(self) -> None:
        while True:
            batch = self.queue.get_batch(timeout=WATCH_INTERVAL_S)
            if not batch:
                continue
            parts = [s.request.pixels[s.start:s.stop] for s in batch]
            pixels = parts[0] if len(parts) == 1 else np.concatenate(parts)
            started = time.perf_counter()
            try:
                outputs = self.runner.run(pixels)
            except Exception as e:  # a failed batch fails its requests, never the sidecar
                log.exception("batch of %d rows failed", len(pixels))
                for s in batch:
                    self.stats.error(s.request.job)
                    s.request.fail(f"model failed on a batch of {len(pixels)}: {type(e).__name__}: {e}")
                continue
            self.stats.batch({s.request.job for s in batch}, len(pixels), time.perf_counter() - started)
            offset = 0
            for s in batch:
                if not s.request.failed:
                    s.request.deliver({k: v[offset:offset + s.rows] for k, v in outputs.items()})
                offset += s.rows


class Connection:
    """One client socket: a reader thread handles requests, a writer thread sends replies in order."""

    def __init__(self, sock: socket.socket, server: SidecarServer):
        self.sock = sock
        self.server = server
        self._outbox: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="writer", daemon=True)

    def send(self, kind: Kind, request_id: int, payload=b"") -> None:
        self._outbox.put((kind, request_id, payload))

    def send_json(self, kind: Kind, request_id: int, data: dict) -> None:
        self.send(kind, request_id, json.dumps(data).encode("utf-8"))

    def _write_loop(self) -> None:
        while (item := self._outbox.get()) is not None:
            try:
                protocol.send_frame(self.sock, *item)
            except OSError:
                return  # the reader sees the broken socket too and ends the connection

    def serve(self) -> None:
        self._writer.start()
        try:
            service, job = self._handshake()
            while True:
                frame = protocol.recv_frame(self.sock)
                self.server.touch()
                if frame.kind == Kind.INFER:
                    self._infer(service, job, frame)
                elif frame.kind == Kind.STATS:
                    self.send_json(Kind.STATS_REPLY, frame.request_id, self.server.describe(frame.json()["job"]))
                else:
                    raise SidecarError(f"unexpected {frame.kind.name} message after the handshake")
        except protocol.ConnectionClosed:
            pass
        except Exception as e:
            log.warning("connection ended: %s", e)
            self.send_json(Kind.ERROR, protocol.CONNECTION_REQUEST_ID, {"message": str(e)})
        finally:
            self._outbox.put(None)
            self._writer.join(timeout=5)
            self.sock.close()
            self.server.connection_closed()

    def _handshake(self) -> tuple[ModelService, str]:
        frame = protocol.recv_frame(self.sock, max_bytes=protocol.MAX_HANDSHAKE_BYTES)
        if frame.kind != Kind.HELLO:
            raise SidecarError(f"expected HELLO first, got {frame.kind.name}")
        hello = frame.json()
        if not secrets.compare_digest(str(hello.get("token", "")), self.server.token):
            log.warning("refused a client with a wrong token")
            raise SidecarError("refused: wrong sidecar token")
        job = str(hello.get("job", ""))
        service = self.server.service_for(Endpoint.from_json(hello["endpoint"]), hello.get("batch_size"))
        self.server.stats.start(job, service.queue.target_rows)
        self.send_json(Kind.READY, frame.request_id, {"pid": os.getpid(), "device": str(self.server.device),
                                                      "batch_size": service.queue.target_rows})
        return service, job

    def _infer(self, service: ModelService, job: str, frame: protocol.Frame) -> None:
        try:
            pixels = protocol.decode_pixels(frame.payload)
            expected = service.runner.endpoint.preprocessing.pixel_shape
            if pixels.shape[1:] != expected:
                raise SidecarError(f"images of shape {pixels.shape[1:]}, the model expects {expected}")
            if not len(pixels):
                raise SidecarError("an INFER request with no images")
        except Exception as e:
            self.server.stats.error(job)
            self.send_json(Kind.ERROR, frame.request_id, {"message": f"bad request: {e}"})
            return
        self.server.stats.request(job, len(pixels))
        service.queue.put(InferRequest(self, frame.request_id, job, pixels), len(pixels))


class SidecarServer:
    def __init__(self, settings: SidecarSettings):
        self.settings = settings
        self.device = resolve_device(settings.device)
        self.token = secrets.token_hex(16)
        self.stats = JobStats()
        self._registry = ModelRegistry(self.device)
        self._services: dict[tuple[str, int], ModelService] = {}
        self._services_lock = threading.Lock()
        self._connections = 0
        self._last_activity = time.monotonic()
        self._activity_lock = threading.Lock()
        self._stop = threading.Event()
        self.auto_batch_rows = AUTO_BATCH_ROWS.get(self.device.type, AUTO_BATCH_ROWS["cpu"])

    # --- used by connections ---

    def service_for(self, endpoint: Endpoint, batch_size: int | None = None) -> ModelService:
        """The queue and device thread for this model at this batch size (the model itself is loaded once)."""
        rows = int(batch_size) if batch_size else self.auto_batch_rows
        if rows < 1:
            raise SidecarError(f"batch size must be positive, got {rows}")
        with self._services_lock:
            service = self._services.get((endpoint.fingerprint, rows))
            if service is None:
                started = time.perf_counter()
                runner, loaded = self._registry.get(endpoint)
                service = ModelService(runner, rows, self.stats)
                self._services[(endpoint.fingerprint, rows)] = service
                log.info("%s %s (%s) on %s in %.1f s, batch size %d", "loaded" if loaded else "serving",
                         endpoint.source, endpoint.fingerprint, self.device, time.perf_counter() - started, rows)
            return service

    def describe(self, job: str) -> dict:
        return {"host": socket.gethostname(), "executor": self.settings.executor_id, "pid": os.getpid(),
                "device": str(self.device), "socket": self.settings.socket_path, **self.stats.snapshot(job)}

    def touch(self) -> None:
        with self._activity_lock:
            self._last_activity = time.monotonic()

    def connection_closed(self) -> None:
        with self._activity_lock:
            self._connections -= 1
            self._last_activity = time.monotonic()

    # --- main thread ---

    def stop(self, *_args) -> None:
        self._stop.set()

    def serve_forever(self) -> None:
        listener = self._listen()
        final = True  # no task can ask for this sidecar again: its executor is gone, or the driver stopped it
        try:
            self._write_info()
            log.info("serving on %s (device %s, pid %d)", self.settings.socket_path, self.device, os.getpid())
            while not self._stop.is_set():
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    reason, final = self._exit_reason()
                    if reason:
                        log.info("exiting: %s", reason)
                        return
                    continue
                with self._activity_lock:
                    self._connections += 1
                    self._last_activity = time.monotonic()
                sock.settimeout(None)
                threading.Thread(target=Connection(sock, self).serve, name="connection", daemon=True).start()
            log.info("exiting: asked to stop")
            final = True
        finally:
            listener.close()
            self._remove_files(final)

    def _remove_files(self, final: bool) -> None:
        """Socket and info always; the start lock and the log too when no task can come back for this key
        (an idle sidecar's lock stays, so a task starting its successor never races a vanishing lock file).
        A sidecar that crashes never gets here, so its log stays for the post-mortem."""
        paths = [self.settings.info_path, self.settings.socket_path]
        base, ext = os.path.splitext(self.settings.socket_path)
        if final and ext == ".sock":
            paths += [base + ".lock", base + ".log"]
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def _listen(self) -> socket.socket:
        if os.path.exists(self.settings.socket_path):
            os.unlink(self.settings.socket_path)  # stale: the launcher holds the lock, no live sidecar owns it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket file is created 0600: only this user may connect
        try:
            listener.bind(self.settings.socket_path)
        finally:
            os.umask(old_umask)
        listener.listen(128)
        listener.settimeout(WATCH_INTERVAL_S)
        return listener

    def _write_info(self) -> None:
        info = {"pid": os.getpid(), "socket": self.settings.socket_path, "token": self.token,
                "device": str(self.device), "host": socket.gethostname(), "app_id": self.settings.app_id,
                "executor": self.settings.executor_id}
        tmp = f"{self.settings.info_path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        os.replace(tmp, self.settings.info_path)  # readers never see a half-written file

    def _exit_reason(self) -> tuple[str | None, bool]:
        """(why to exit now or None, whether the exit is final for this sidecar's key)."""
        watch = self.settings.watch
        if watch is not None and not is_alive(watch):
            return f"executor process {watch.pid} is gone", True
        with self._activity_lock:
            idle = self._connections == 0 and time.monotonic() - self._last_activity > self.settings.idle_timeout_s
        return (f"idle for {self.settings.idle_timeout_s:.0f} s" if idle else None), False


def run(settings: SidecarSettings) -> None:
    server = SidecarServer(settings)
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    server.serve_forever()
