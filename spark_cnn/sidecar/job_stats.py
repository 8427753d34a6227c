"""Per-job counters of a sidecar: what reaches the job summary. Pure bookkeeping behind one lock."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict


class JobStats:
    """Counters per job id (a sidecar may outlive a job and serve the next one).

    >>> stats = JobStats()
    >>> stats.request("j", rows=3); stats.batch({"j": 3}, rows=8, device_s=0.01)
    >>> stats.snapshot("j")["mean_batch_size"]
    8.0
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs: dict[str, dict] = defaultdict(self._zero)
        self._completed = 0  # device batches of every job: the progress clients are told of (protocol.PROGRESS)

    @staticmethod
    def _zero() -> dict:
        return {"batch_size": None, "precision": None, "decode": None, "requests": 0, "images": 0, "batches": 0,
                "batch_rows": 0, "errors": 0, "oom_backoffs": 0, "device_s": 0.0, "queue_wait_s": 0.0, "waits": 0,
                "decode_cpu_s": 0.0, "task_decode_cpu_s": 0.0, "compute_cpu_s": 0.0, "histogram": Counter()}

    def start(self, job: str, batch_rows: int, precision: str, decode: str | None = None) -> None:
        with self._lock:
            self._jobs[job]["batch_size"] = batch_rows
            self._jobs[job]["precision"] = precision
            self._jobs[job]["decode"] = decode or self._jobs[job]["decode"]

    def request(self, job: str, rows: int, task_cpu_s: float = 0.0) -> None:
        """One request of `rows` images, which took its task `task_cpu_s` CPU seconds to make (reading and
        decoding them; 0 from a client that does not say): the job's decoding done in tasks."""
        with self._lock:
            self._jobs[job]["requests"] += 1
            self._jobs[job]["images"] += rows
            self._jobs[job]["task_decode_cpu_s"] += task_cpu_s

    def decoded(self, job: str, cpu_s: float) -> None:
        """CPU time the sidecar's own decoding of one request took (the decoding thread's, the GIL released or
        not), kept apart from the serving around it: on the host, the decoding a GPU's nvJPEG would take over;
        with `gpu`, the host CPU spent driving nvJPEG."""
        with self._lock:
            self._jobs[job]["decode_cpu_s"] += cpu_s

    def error(self, job: str) -> None:
        with self._lock:
            self._jobs[job]["errors"] += 1

    def oom_backoff(self, jobs, new_target: int) -> None:
        with self._lock:
            for job in jobs:
                self._jobs[job]["oom_backoffs"] += 1
                self._jobs[job]["batch_size"] = new_target

    def queue_wait(self, job: str, seconds: float) -> None:
        """Time from a request's arrival to its first rows entering a device batch."""
        with self._lock:
            self._jobs[job]["queue_wait_s"] += seconds
            self._jobs[job]["waits"] += 1

    def batch(self, job_rows: dict[str, int], rows: int, device_s: float, compute_cpu_s: float = 0.0) -> None:
        """One device batch of `rows` rows, holding `job_rows[job]` rows of each job. `compute_cpu_s`, the computing
        thread's CPU time for its forward, is shared among the jobs by rows (so that jobs sum to the sidecar's);
        `device_s`, the batch's time, is each job's whole."""
        with self._lock:
            self._completed += 1
            for job, job_share in job_rows.items():
                counters = self._jobs[job]
                counters["compute_cpu_s"] += compute_cpu_s * job_share / rows if rows else 0.0
                counters["batches"] += 1
                counters["batch_rows"] += rows
                counters["device_s"] += device_s
                counters["histogram"][rows] += 1

    @property
    def completed_batches(self) -> int:
        """Device batches completed so far, all jobs together."""
        with self._lock:
            return self._completed

    def snapshot(self, job: str) -> dict:
        with self._lock:
            c = dict(self._jobs.get(job) or self._zero())
            c["histogram"] = {str(size): n for size, n in sorted(c["histogram"].items())}
        batch_rows, waits, wait_s = c.pop("batch_rows"), c.pop("waits"), c.pop("queue_wait_s")
        c["mean_batch_size"] = round(batch_rows / c["batches"], 2) if c["batches"] else 0.0
        c["mean_queue_wait_ms"] = round(1000 * wait_s / waits, 3) if waits else 0.0
        c["device_s"] = round(c["device_s"], 3)
        c["decode_cpu_s"] = round(c["decode_cpu_s"], 3)
        c["task_decode_cpu_s"] = round(c["task_decode_cpu_s"], 3)
        c["compute_cpu_s"] = round(c["compute_cpu_s"], 3)
        return c
