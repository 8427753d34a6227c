"""The sidecar process's shell: one per executor, owns the device, serves every task of that executor.

Threads: the main thread accepts connections and watches for exit conditions (lifecycle.py: executor gone, idle,
SIGTERM); each connection (connection.py) has a reader (requests into a model's work queue; decodes files when
the handshake agreed so) and a writer (replies out, so a slow client never blocks the device); each served model
runs the pipeline threads of its ModelService (service.py), found or started by the ServiceRegistry
(registry.py) with the start-up decisions of startup.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

import torch

from spark_cnn.sidecar import lifecycle
from spark_cnn.sidecar.connection import HANDSHAKE_TIMEOUT_S, Connection
from spark_cnn.sidecar.fault_injection import injected_start_faults
from spark_cnn.sidecar.job_stats import JobStats
from spark_cnn.sidecar.lifecycle import RETIRE_GRACE_S, WATCH_INTERVAL_S
from spark_cnn.sidecar.registry import SERVICE_IDLE_S, ServiceRegistry
from spark_cnn.sidecar.runner import resolve_device
from spark_cnn.sidecar.service import ModelService
from spark_cnn.task import protocol
from spark_cnn.task.launcher import DEFAULT_IDLE_TIMEOUT_S
from spark_cnn.task.procs import ProcessId
from spark_cnn.task.protocol import Kind
from spark_cnn.task.sidecar_env import cpu_threads

log = logging.getLogger("spark_cnn.sidecar")


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
        self.services = ServiceRegistry(self.device, self.stats, threads=settings.threads,
                                        idle_s=settings.service_idle_s, on_sticky=self.retire)
        self._connections: set = set()
        self._retired: str | None = None  # why the device is unusable, once it is
        self._last_activity = time.monotonic()
        self._activity_lock = threading.Lock()
        self._stop = threading.Event()
        # Written to when `_stop` is set, so the main thread's wait ends at once rather than at its next watch:
        # the driver waits for a stopped sidecar's process at the end of every job (launcher.stop_sidecars).
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_writer.setblocking(False)
        self._progress_sent = 0.0  # when PROGRESS last went out (monotonic)
        if settings.lock_fd is not None:
            os.set_inheritable(settings.lock_fd, False)  # held by this process alone, never by its children

    # --- used by connections ---

    def job_started(self, job: str, service: ModelService, decode: str | None = None) -> None:
        self.stats.start(job, service.target_rows, service.runner.precision, decode=decode)
        self.services.record_job(job, service)

    def describe(self, job: str) -> dict:
        snapshot = self.stats.snapshot(job)
        service = self.services.job_service(job)
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
        self.services.release(conn)

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
        self.stop()  # the main thread then waits for the ERRORs still to come (_drain)

    # --- main thread ---

    def stop(self, *_args) -> None:
        """Exit the main loop now (SIGTERM and SIGINT call this, and `retire`)."""
        self._stop.set()
        with contextlib.suppress(OSError):  # a full buffer already holds a wake-up
            self._wake_writer.send(b"\0")

    def serve_forever(self) -> None:
        lifecycle.check_directories(self.settings.socket_path, self.settings.info_path)
        listener = lifecycle.listen(self.settings.socket_path)
        final = True  # no task can ask for this sidecar again: its executor is gone, or the driver stopped it
        try:
            for fault in injected_start_faults():  # a test's fault injection; none in real use
                log.warning("fault injection on (%s)", fault)
            lifecycle.write_info(self.settings.info_path, self._info())
            lifecycle.release_start_lock(self.settings.lock_fd)
            log.info("serving on %s (device %s, pid %d)", self.settings.socket_path, self.device, os.getpid())
            while not self._stop.is_set():
                # Wake for the next PROGRESS too, so its interval holds and clients' slack stays one interval.
                wait_s = min(WATCH_INTERVAL_S, self._send_progress(time.monotonic()))
                readable, _, _ = select.select([listener, self._wake_reader], [], [], wait_s)
                if self._wake_reader in readable:
                    continue  # stopped: the loop's condition ends it
                if not readable:
                    self.services.evict_idle()
                    reason, final = self._exit_reason()
                    if reason:
                        log.info("exiting: %s", reason)
                        return
                    continue
                try:
                    sock, _ = listener.accept()
                except TimeoutError:  # the client gave up between the two calls
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
            for closing in (listener, self._wake_reader, self._wake_writer):
                closing.close()
            lifecycle.remove_files(self.settings.info_path, self.settings.socket_path, final)

    @property
    def retired(self) -> bool:
        return self._retired is not None

    def _drain(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` until every request read so far is answered and its reply sent. The failed
        batch's ERRORs are queued after `retire` has woken this thread (service._fail tells it first), so
        replies already queued are not enough."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._activity_lock:
                connections = list(self._connections)
            if all(conn.drained() and not conn.waiting() for conn in connections):
                return
            time.sleep(0.05)

    def _info(self) -> dict:
        return {"pid": os.getpid(), "socket": self.settings.socket_path, "token": self.token,
                "device": str(self.device), "host": socket.gethostname(), "app_id": self.settings.app_id,
                "executor": self.settings.executor_id}

    def _exit_reason(self) -> tuple[str | None, bool]:
        """(why to exit now or None, whether the exit is final for this sidecar's key)."""
        gone = lifecycle.gone_pid(self.settings.watch)
        with self._activity_lock:
            connections, idle_for_s = len(self._connections), time.monotonic() - self._last_activity
        return lifecycle.exit_reason(gone, connections, idle_for_s, self.settings.idle_timeout_s)


def run(settings: SidecarSettings) -> NoReturn:
    """Serve until a reason to exit, then end the process (lifecycle.exit_process)."""
    server = SidecarServer(settings)
    lifecycle.stop_on_signals(server.stop)
    server.serve_forever()
    lifecycle.exit_process(server.retired)
