"""What a sidecar serves: models loaded once per (fingerprint, model options), a service (queue + pipeline) per
model, options and batch size, and the eviction of services no connection has used for a while.

A connection's HELLO asks `ServiceRegistry.service_for` and is a user of that service until it ends (`release`);
the main thread calls `evict_idle` as it watches.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

import torch

from spark_cnn.models.spec import Endpoint
from spark_cnn.sidecar.fault_injection import with_injected_faults
from spark_cnn.sidecar.job_stats import JobStats
from spark_cnn.sidecar.runner import ModelRunner, cpu_compute_workers
from spark_cnn.sidecar.service import ModelService, batch_delay_s
from spark_cnn.sidecar.startup import (
    BatchStart,
    act_on_verdict,
    auto_start,
    choose_decode,
    queued_batches,
    service_rows,
)
from spark_cnn.task.run_options import RunOptions

log = logging.getLogger("spark_cnn.sidecar")

# A model service (queue, threads, loaded model) no connection has used for this long is dropped; a later
# HELLO loads it again (seconds). As long as an idle sidecar waits before it exits: a notebook that moved on
# to other models stops holding the old ones, one that comes back within minutes finds them warm.
SERVICE_IDLE_S = 300.0


def load_runner(endpoint: Endpoint, device: torch.device, options: RunOptions | None = None) -> ModelRunner:
    """A model on `device`, ready to run; its forward fails as a test's injection variables say, when set."""
    return with_injected_faults(ModelRunner(endpoint, device, options))


class ModelRegistry:
    """Runners by (endpoint fingerprint, model-changing options); each is loaded once, by the first asker."""

    def __init__(self, device: torch.device):
        self.device = device
        self._runners: dict[tuple, ModelRunner] = {}
        self._lock = threading.Lock()

    def get(self, endpoint: Endpoint, options: RunOptions | None = None) -> tuple[ModelRunner, bool]:
        """The runner for `endpoint` with `options`, and whether this call loaded it."""
        options = options or RunOptions()
        key = (endpoint.fingerprint, *options.model_key())
        with self._lock:
            runner = self._runners.get(key)
            if runner is not None:
                return runner, False
            runner = load_runner(endpoint, self.device, options)
            self._runners[key] = runner
            return runner, True

    def drop(self, runners: list[ModelRunner]) -> None:
        """Forget these runners (no service runs them any more): their models are freed, and loaded again if
        asked for later."""
        gone = {id(runner) for runner in runners}
        with self._lock:
            for key in [key for key, runner in self._runners.items() if id(runner) in gone]:
                del self._runners[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._runners)


class ServiceRegistry:
    """The services of one sidecar, by (fingerprint, model options, batch size), with their users (connections),
    the job each serves, and the decode place `--decode auto` chose for each."""

    def __init__(self, device: torch.device, stats: JobStats, *, threads: int | None = None,
                 idle_s: float = SERVICE_IDLE_S, on_sticky=None):
        self.device = device
        self.stats = stats
        self.threads = threads
        self.idle_s = idle_s
        self.on_sticky = on_sticky  # told when a batch leaves the device unusable (the server retires)
        self._models = ModelRegistry(device)
        self._services: dict[tuple, ModelService] = {}
        self._users: dict[tuple, set] = {}  # service key -> the connections using it
        self._unused_since: dict[tuple, float] = {}  # service key -> when its last user left
        self._job_services: dict[str, ModelService] = {}  # job -> its service: precision and tuning decide late
        self._decode_choices: dict[int, object] = {}  # id(service) -> placement.DecodeChoice, for --decode auto
        self._lock = threading.Lock()

    def service_for(self, endpoint: Endpoint, options: RunOptions | None = None, user=None) -> ModelService:
        """The queue and pipeline for this model with these options (the model is loaded once per options);
        `user` (a connection) keeps it from eviction until it is released (`release`)."""
        options = options or RunOptions()
        rows = service_rows(options, self.device.type)
        key = (endpoint.fingerprint, *options.model_key(), rows)
        with self._lock:
            if user is not None:
                self._users.setdefault(key, set()).add(user)
            self._unused_since.pop(key, None)
            service = self._services.get(key)
            if service is None:
                service = self._services[key] = self._start(endpoint, options, rows)
            return service

    def _start(self, endpoint: Endpoint, options: RunOptions, rows: int) -> ModelService:
        started = time.perf_counter()
        runner, loaded = self._models.get(endpoint, options)
        start = BatchStart(rows) if options.batch_size else auto_start(runner, self.device, self.threads)
        service = ModelService(runner, start.rows, self.stats, tuner=start.tuner, on_sticky=self.on_sticky,
                               max_delay_s=batch_delay_s(runner),
                               compute_workers=cpu_compute_workers(self.device, self.threads),
                               max_queued_batches=queued_batches(endpoint.sized), prediction=start.check,
                               on_verdict=functools.partial(act_on_verdict, str(self.device), self.threads,
                                                            start.source))
        log.info("%s %s (%s) on %s in %.1f s: batch size %d, precision %s, channels_last %s",
                 "loaded" if loaded else "serving", endpoint.source, endpoint.fingerprint, self.device,
                 time.perf_counter() - started, start.rows, runner.precision, runner.channels_last)
        return service

    def record_job(self, job: str, service: ModelService) -> None:
        with self._lock:
            self._job_services[job] = service

    def job_service(self, job: str) -> ModelService | None:
        with self._lock:
            return self._job_services.get(job)

    def decode_place(self, service: ModelService) -> str:
        """Where `--decode auto` decodes for this service, decided once (startup.choose_decode)."""
        with self._lock:
            choice = self._decode_choices.get(id(service))
            if choice is None:
                choice = self._decode_choices[id(service)] = choose_decode(service, self.device, self.threads)
                log.info("decode in %s: %s", choice.place, choice.why)
        return choice.place

    def release(self, user) -> None:
        """`user` (a connection) ended: its services may be evicted once idle."""
        with self._lock:
            for key, users in self._users.items():
                if user in users:
                    users.discard(user)
                    if not users:
                        self._unused_since[key] = time.monotonic()

    def loaded_models(self) -> int:
        return len(self._models)

    def evict_idle(self, now: float | None = None) -> int:
        """Drop the services no connection has used for `idle_s`: their threads end, and a model no remaining
        service runs is released. Returns how many were dropped."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [key for key, since in self._unused_since.items()
                    if not self._users.get(key) and now - since >= self.idle_s]
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
            self._models.drop(dropped)
        for service in evicted:
            service.close()
            log.info("dropped %s (batch size %d): no connection used it for %.0f s", service.runner.endpoint.source,
                     service.target_rows, self.idle_s)
        if dropped and self.device.type == "cuda":
            torch.cuda.empty_cache()
        return len(evicted)
