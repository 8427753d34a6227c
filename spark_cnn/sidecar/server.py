"""The sidecar process: one per executor, owns the device, serves every task of that executor.

Threads: the main thread accepts connections and watches for exit conditions (executor gone, idle, SIGTERM);
each connection has a reader (requests into a model's work queue; decodes files when the handshake agreed so)
and a writer (replies out, so a slow client never blocks the device); each served model runs the pipeline
threads of its ModelService (service.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import queue
import secrets
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from spark_cnn.errors import ConfigError, SidecarError
from spark_cnn.imaging.limits import DecodeOptions
from spark_cnn.models.spec import Endpoint
from spark_cnn.sidecar.batch_decode import decode_on_gpu, decode_on_host, gpu_decode_works
from spark_cnn.sidecar.fault_injection import injected_start_faults
from spark_cnn.sidecar.job_stats import JobStats
from spark_cnn.sidecar.online_tuner import OnlineTuner
from spark_cnn.sidecar.prediction_check import FASTER, PredictionCheck
from spark_cnn.sidecar.runner import ModelRegistry, cpu_compute_workers, resolve_device
from spark_cnn.sidecar.service import MAX_QUEUED_BATCHES, InferRequest, ModelService
from spark_cnn.task import protocol
from spark_cnn.task.launcher import DEFAULT_IDLE_TIMEOUT_S, check_private_dir
from spark_cnn.task.procs import ProcessId, is_alive
from spark_cnn.task.protocol import ErrorKind, Kind
from spark_cnn.task.run_options import DECODE_PLACES, RunOptions
from spark_cnn.task.sidecar_env import cpu_threads

log = logging.getLogger("spark_cnn.sidecar")

# Where the batch size starts without a cached device profile (perf/startpoint.py), by device type: small CNNs
# ran fastest near batch 8 on the 2-core CPU (docs/benchmarks.md); GPUs want large batches.
AUTO_BATCH_ROWS = {"cpu": 8, "cuda": 64}
# The online tuner explores up to these sizes: a CPU gains nothing past a few dozen images per batch, and
# 512 images of 224 px are ~300 MB of float32 input, still small beside a data-centre GPU's memory.
MAX_AUTO_BATCH_ROWS = {"cpu": 64, "cuda": 512}
# Queue bound, in batches, for images at their own sizes (detectors, segmenters): one such image is up to ~20x a
# 224 px crop (800 x 1333 x 3 = 3.2 MB), so the queue holds fewer batches than a classifier's (service.py).
SIZED_QUEUED_BATCHES = 2
# How often the main thread checks the executor process and the idle timer, and whether PROGRESS is due.
WATCH_INTERVAL_S = 0.5
# Requests one connection may have unanswered; its reader stops reading beyond that, so a client that sends
# without reading replies (or faster than the device) is held back by its socket instead of filling the
# sidecar's memory. Tasks keep 4 in flight (client.DEFAULT_MAX_IN_FLIGHT); the bound never slows them. READY
# tells clients the bound: one that kept more in flight would wait on this reader while it waits on them.
MAX_REQUESTS_PER_CONNECTION = protocol.MAX_REQUESTS_IN_FLIGHT
# A client has this long to send its HELLO after connecting; one that sends nothing is dropped, so idle
# connections cannot pile up threads. A real client sends it at once (the model loads after the HELLO).
HANDSHAKE_TIMEOUT_S = 10.0
# A model service (queue, threads, loaded model) no connection has used for this long is dropped; a later
# HELLO loads it again (seconds). As long as an idle sidecar waits before it exits: a notebook that moved on
# to other models stops holding the old ones, one that comes back within minutes finds them warm.
SERVICE_IDLE_S = 300.0
# After a sticky device error, how long the sidecar lets its writers send the ERRORs already queued before it
# exits (its clients then see the connection close and reconnect to a new sidecar).
RETIRE_GRACE_S = 2.0
# The exit status of a sidecar that retired after a sticky device error.
EXIT_RETIRED = 3
# The agreed decode places at which requests carry image files, for this process to decode.
SIDECAR_DECODES = tuple(place for place in DECODE_PLACES if place != "task")


@dataclass(frozen=True)
class SidecarSettings:
    socket_path: str
    info_path: str
    device: str = "auto"
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    watch: ProcessId | None = None  # exit when this process (the executor JVM) is gone
    app_id: str = ""
    executor_id: str = ""
    threads: int | None = None  # torch intra-op threads on the CPU; None: sidecar_env.cpu_threads' default
    lock_fd: int | None = None  # the starter's start lock, held until the info file is written (launcher.py)
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    service_idle_s: float = SERVICE_IDLE_S


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
        service = self.service = self.server.service_for(hello.endpoint, hello.run_options, user=self)
        if decode == "auto":
            decode = self.server.auto_decode(service)
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
            images = protocol.decode_request(frame.payload)
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
            elif decode == "gpu":
                pixels, row_errors = decode_on_gpu(images, prep, self.server.device, self.decode_options)
            else:
                pixels, row_errors = decode_on_host(images, prep, self.decode_options)
        except Exception as e:
            self.server.stats.error(job)
            self.send_json(Kind.ERROR, frame.request_id, protocol.error_reply(f"bad request: {e}", ErrorKind.REQUEST))
            return
        self.server.stats.request(job, len(row_errors) if row_errors is not None else len(pixels))
        service.submit(InferRequest(self, frame.request_id, job, pixels, row_errors))


def _peer(sock: socket.socket) -> str:
    """'pid P, uid U' of the process at the other end of a Unix socket (Linux), for the log."""
    try:
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return f"pid {pid}, uid {uid}"
    except (AttributeError, OSError):  # no SO_PEERCRED on this platform
        return "peer unknown"


class SidecarServer:
    def __init__(self, settings: SidecarSettings):
        self.settings = settings
        self.device = resolve_device(settings.device)
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads(settings.threads))
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # batches have one shape (the target size) almost always
        self.token = secrets.token_hex(16)
        self.stats = JobStats()
        self._registry = ModelRegistry(self.device)
        self._services: dict[tuple, ModelService] = {}
        self._users: dict[tuple, set] = {}  # service key -> the connections using it
        self._unused_since: dict[tuple, float] = {}  # service key -> when its last user left
        self._job_services: dict[str, ModelService] = {}  # job -> its service: precision and tuning decide late
        self._decode_choices: dict[int, object] = {}  # id(service) -> placement.DecodeChoice, for --decode auto
        self._services_lock = threading.Lock()
        self._connections: set = set()
        self._retired: str | None = None  # why the device is unusable, once it is
        self._last_activity = time.monotonic()
        self._activity_lock = threading.Lock()
        self._stop = threading.Event()
        self._progress_sent = 0.0  # when PROGRESS last went out (monotonic)
        self.auto_batch_rows = AUTO_BATCH_ROWS.get(self.device.type, AUTO_BATCH_ROWS["cpu"])
        if settings.lock_fd is not None:
            os.set_inheritable(settings.lock_fd, False)  # held by this process alone, never by its children

    # --- used by connections ---

    def service_for(self, endpoint: Endpoint, options: RunOptions | None = None, user=None) -> ModelService:
        """The queue and pipeline for this model with these options (the model is loaded once per options);
        `user` (a connection) keeps it from eviction until it is released (`connection_closed`)."""
        options = options or RunOptions()
        rows = int(options.batch_size) if options.batch_size else self.auto_batch_rows
        key = (endpoint.fingerprint, *options.model_key(), rows)
        with self._services_lock:
            if user is not None:
                self._users.setdefault(key, set()).add(user)
            self._unused_since.pop(key, None)
            service = self._services.get(key)
            if service is None:
                started = time.perf_counter()
                runner, loaded = self._registry.get(endpoint, options)
                tuner, check, source = None, None, None
                if not options.batch_size:
                    rows, tuner, source = self._auto_start(runner, options.device_profile)
                    if tuner.predicted:
                        check = PredictionCheck({b: 1000.0 * b / r for b, r in tuner.predicted.items() if r > 0})
                queued = SIZED_QUEUED_BATCHES if endpoint.sized else MAX_QUEUED_BATCHES
                service = ModelService(runner, rows, self.stats, tuner=tuner, on_sticky=self.retire,
                                       compute_workers=cpu_compute_workers(self.device, self.settings.threads),
                                       max_queued_batches=queued, prediction=check,
                                       on_verdict=functools.partial(self._prediction_verdict, source))
                self._services[key] = service
                log.info("%s %s (%s) on %s in %.1f s: batch size %d, precision %s, channels_last %s",
                         "loaded" if loaded else "serving", endpoint.source, endpoint.fingerprint, self.device,
                         time.perf_counter() - started, rows, runner.precision, runner.channels_last)
            return service

    def job_started(self, job: str, service: ModelService, decode: str | None = None) -> None:
        self.stats.start(job, service.target_rows, service.runner.precision, decode=decode)
        with self._services_lock:
            self._job_services[job] = service

    def _auto_start(self, runner, profile_json: str | None = None) -> tuple[int, OnlineTuner, str | None]:
        """The analytical model's batch size when this device has a profile (the job's `--device-profile`,
        else a cached one that is not stale), else the device default; the tuner corrects either from measured
        batches. The third value says which profile predicted ("job", "cached") or None."""
        max_size = MAX_AUTO_BATCH_ROWS.get(self.device.type, self.auto_batch_rows)
        start, predicted, source = self.auto_batch_rows, None, None
        # Tracing a compiled module would compile it again; the time model covers fixed-size classifiers only
        # (a detector's cost depends on its boxes): the online tuner sizes the others' batches alone.
        if not runner.options.compile and not runner.endpoint.sized:
            try:
                from spark_cnn.perf.startpoint import predicted_start

                found = predicted_start(runner.predictor.module, (3, *runner.endpoint.preprocessing.pixel_shape[:2]),
                                        str(self.device), threads=self.settings.threads, max_size=max_size,
                                        profile_json=profile_json)
                if found is not None:
                    start, predicted, source = found
            except Exception as e:  # the model is an aid here, never a reason not to serve
                log.warning("no predicted batch size (%s: %s); starting from %d", type(e).__name__, e, start)
        return start, OnlineTuner(start, max_size=max(start, max_size), predicted=predicted), source

    def _prediction_verdict(self, source: str | None, verdict: str) -> str:
        """A service's batches disagreed with the profile for long enough: a cached profile that predicted too
        slow was calibrated under load, so it is marked stale (the next calibration measures again; sidecars
        stop starting from it). Returns what was done, for the summary."""
        if verdict != FASTER:
            return ("reported only: slower batches can be this job's own load (tasks decoding on the same cores); "
                    "calibrate on a quiet host to check (spark-cnn profile --recalibrate)")
        if source != "cached":
            return "reported only: the job's --device-profile is not this host's cache; export a fresh one"
        from spark_cnn.perf.startpoint import mark_profile_stale

        reason = f"a job's batches ran faster than it predicted (sidecar pid {os.getpid()})"
        if mark_profile_stale(str(self.device), self.settings.threads, reason):
            log.warning("marked the cached device profile stale: the next calibration measures this device again")
            return "marked the cached device profile stale: the next calibration measures the device again"
        return "the cached profile could not be marked stale (gone, or its folder is read-only)"

    def auto_decode(self, service: ModelService) -> str:
        """Where `--decode auto` decodes for this service, decided once (perf/placement.py)."""
        with self._services_lock:
            choice = self._decode_choices.get(id(service))
            if choice is None:
                choice = self._choose_decode(service)
                self._decode_choices[id(service)] = choice
                log.info("decode in %s: %s", choice.place, choice.why)
        return choice.place

    def _choose_decode(self, service: ModelService):
        from spark_cnn.perf.startpoint import choose_decode_place, start_profile

        cuda = self.device.type == "cuda"
        profile = start_profile(str(self.device), self.settings.threads, service.runner.options.device_profile) \
            if cuda else None
        predicted = service.tuner.predicted.get(service.target_rows) if service.tuner is not None else None
        return choose_decode_place(self.device.type, gpu_decode_works=cuda and gpu_decode_works(self.device),
                                   cores=os.cpu_count() or 1, decode_ms=profile.decode_ms if profile else None,
                                   device_images_per_s=predicted)

    def describe(self, job: str) -> dict:
        snapshot = self.stats.snapshot(job)
        with self._services_lock:
            service = self._job_services.get(job)
        if service is not None:
            snapshot["precision"] = service.runner.precision
            snapshot["batch_size"] = service.target_rows
            if service.tuner is not None:
                snapshot["tuning"] = service.tuner.summary()
            if service.prediction is not None:
                snapshot["prediction"] = {**service.prediction.summary(),
                                          **({"action": service.prediction_action} if service.prediction_action
                                             else {})}
        return {"host": socket.gethostname(), "executor": self.settings.executor_id, "pid": os.getpid(),
                "device": str(self.device), "socket": self.settings.socket_path, **snapshot}

    def touch(self) -> None:
        with self._activity_lock:
            self._last_activity = time.monotonic()

    def connection_closed(self, conn) -> None:
        """`conn` ended: it no longer counts as activity, nor as a user of its service."""
        with self._activity_lock:
            self._connections.discard(conn)
            self._last_activity = time.monotonic()
        with self._services_lock:
            for key, users in self._users.items():
                if conn in users:
                    users.discard(conn)
                    if not users:
                        self._unused_since[key] = time.monotonic()

    def evict_idle(self, now: float | None = None) -> int:
        """Drop the services no connection has used for `service_idle_s`: their threads end, and a model no
        remaining service runs is released. Returns how many were dropped."""
        now = time.monotonic() if now is None else now
        with self._services_lock:
            idle = [key for key, since in self._unused_since.items()
                    if not self._users.get(key) and now - since >= self.settings.service_idle_s]
            evicted = [self._services.pop(key) for key in idle if key in self._services]
            for key in idle:
                self._unused_since.pop(key, None)
                self._users.pop(key, None)
            for service in evicted:
                self._decode_choices.pop(id(service), None)
                for job in [job for job, used in self._job_services.items() if used is service]:
                    del self._job_services[job]
            running = {id(service.runner) for service in self._services.values()}
            dropped = [service.runner for service in evicted if id(service.runner) not in running]
            self._registry.drop(dropped)
        for service in evicted:
            service.close()
            log.info("dropped %s (batch size %d): no connection used it for %.0f s", service.runner.endpoint.source,
                     service.target_rows, self.settings.service_idle_s)
        if dropped and self.device.type == "cuda":
            torch.cuda.empty_cache()
        return len(evicted)

    def _send_progress(self, now: float) -> float:
        """Every PROGRESS_INTERVAL_S, tell each client that waits for a reply (and asked) how many batches this
        sidecar has completed: a task queued behind other tasks' work then sees a healthy sidecar as one
        (task/progress.py), while a count that stops rising still reads as a hang. Sent from the main thread,
        so a model stuck in a forward does not stop it, and the unchanged count gives the stuck model away.
        Returns the seconds until the next is due."""
        if now - self._progress_sent < protocol.PROGRESS_INTERVAL_S:
            return self._progress_sent + protocol.PROGRESS_INTERVAL_S - now
        self._progress_sent = now
        batches = self.stats.completed_batches
        with self._activity_lock:
            connections = list(self._connections)
        for conn in connections:
            if conn.progress and conn.waiting():
                conn.send_json(Kind.PROGRESS, protocol.CONNECTION_REQUEST_ID, {"batches": batches})
        return protocol.PROGRESS_INTERVAL_S

    def retire(self, reason: str) -> None:
        """The device is unusable (a sticky error): stop taking connections and exit once the queued replies
        are out, leaving the log, so that the next task starts a new sidecar on a fresh device context."""
        with self._activity_lock:
            if self._retired is None:
                self._retired = reason
                log.error("retiring: the device is unusable: %s", reason)
        self._stop.set()

    # --- main thread ---

    def stop(self, *_args) -> None:
        self._stop.set()

    def serve_forever(self) -> None:
        self._check_directories()
        listener = self._listen()
        final = True  # no task can ask for this sidecar again: its executor is gone, or the driver stopped it
        try:
            for fault in injected_start_faults():  # a test's fault injection; none in real use
                log.warning("fault injection on (%s)", fault)
            self._write_info()
            self._release_start_lock()
            log.info("serving on %s (device %s, pid %d)", self.settings.socket_path, self.device, os.getpid())
            while not self._stop.is_set():
                # Wake for the next PROGRESS too, so its interval holds and clients' slack stays one interval.
                listener.settimeout(min(WATCH_INTERVAL_S, self._send_progress(time.monotonic())))
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    self.evict_idle()
                    reason, final = self._exit_reason()
                    if reason:
                        log.info("exiting: %s", reason)
                        return
                    continue
                conn = Connection(sock, self)
                with self._activity_lock:
                    self._connections.add(conn)
                    self._last_activity = time.monotonic()
                sock.settimeout(None)
                threading.Thread(target=conn.serve, name="connection", daemon=True).start()
            if self._retired is not None:
                final = False  # tasks come back for this key: keep the lock, and the log for the post-mortem
                self._drain(RETIRE_GRACE_S)
                log.info("exiting: the device is unusable")
            else:
                log.info("exiting: asked to stop")
                final = True
        finally:
            listener.close()
            self._remove_files(final)

    @property
    def retired(self) -> bool:
        return self._retired is not None

    def _drain(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for every connection's queued replies to go out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._activity_lock:
                connections = list(self._connections)
            if all(conn.drained() for conn in connections):
                return
            time.sleep(0.05)

    def _release_start_lock(self) -> None:
        """The info file is out: the starter's lock, held for us since the start (launcher.py), may go."""
        if self.settings.lock_fd is not None:
            try:
                os.close(self.settings.lock_fd)
            except OSError:
                pass

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

    def _check_directories(self) -> None:
        """Create nothing in a directory that is not private to this user (the launcher checks too; this
        process may be started by hand): SidecarError, saying what to do, before any file is made."""
        for path in {self.settings.socket_path, self.settings.info_path}:
            check_private_dir(os.path.dirname(os.path.abspath(path)))

    def _listen(self) -> socket.socket:
        if os.path.lexists(self.settings.socket_path):
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
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a leftover of a crashed sidecar with this pid; never written through (a symlink)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        os.replace(tmp, self.settings.info_path)  # readers never see a half-written file

    def _exit_reason(self) -> tuple[str | None, bool]:
        """(why to exit now or None, whether the exit is final for this sidecar's key)."""
        watch = self.settings.watch
        if watch is not None and not is_alive(watch):
            return f"executor process {watch.pid} is gone", True
        with self._activity_lock:
            idle = not self._connections and time.monotonic() - self._last_activity > self.settings.idle_timeout_s
        return (f"idle for {self.settings.idle_timeout_s:.0f} s" if idle else None), False


def run(settings: SidecarSettings) -> None:
    server = SidecarServer(settings)
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    server.serve_forever()
    if server.retired:
        # No exit handlers: with the device unusable, torch's own could hang on it.
        logging.shutdown()
        os._exit(EXIT_RETIRED)
