"""One served model in the sidecar: its work queue and the three pipeline threads behind it.

    connections --put--> WorkQueue --assemble--> [staged] --compute--> [computed] --deliver--> replies
                          (batcher)   concat +     1 ahead  forward,     <= 2      wait for copies,
                                      upload                OOM back-off           split per request

Each stage runs in its own thread, so assembling and uploading batch n+1 and delivering batch n-1 overlap
with computing batch n (torch releases the GIL while it computes). The assembler takes a batch from the
queue only when the staged slot is free: while the device is busy, requests keep gathering in the queue and
the next batch leaves fuller (taking it early would release partial batches at the 10 ms deadline).
On a CPU several compute threads may run batches side by side (`compute_workers`, each with its own share of
the cores): independent single-threaded forwards keep every core busy even when a Spark task takes one for a
while, where one multi-threaded forward stalls at each OpenMP barrier. Batches are numbered as they are
assembled and delivered in that order, so a request split across batches gets its rows back in order.
Connections are any object with `send(kind, request_id, payload)` and
`send_json(kind, request_id, dict)`, so the service runs in-process in tests without sockets.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import torch

from spark_cnn.sidecar.batcher import Slice
from spark_cnn.sidecar.job_stats import JobStats
from spark_cnn.sidecar.online_tuner import OnlineTuner
from spark_cnn.sidecar.prediction_check import PredictionCheck
from spark_cnn.sidecar.reply import reply_batch
from spark_cnn.sidecar.runner import ModelRunner, Pending, Staged, failure_kind, is_out_of_memory
from spark_cnn.sidecar.work_queue import WorkQueue
from spark_cnn.task import protocol
from spark_cnn.task.protocol import ErrorKind, Kind, SizedImages

log = logging.getLogger("spark_cnn.sidecar")

# How long a partial batch may wait for more rows on an accelerator: small against its idle time, enough to
# merge tasks.
MAX_BATCH_DELAY_S = 0.01
# On a CPU the wait costs nothing, as the cores it leaves are decoding the rows it waits for, and a partial batch
# costs more CPU per image. 100 ms is about one CPU batch (mobilenet_v3_small, 32 images at one thread) and a
# tenth of what a task's requests in flight cover (8 of 16 rows: about a second of one task's output at 130 img/s),
# so tasks do not wait for replies. On the 2-core host (spark-cnn bench, mobilenet_v3_small, one round each) mean
# batches went from 24 to 45 rows and the sidecar's CPU from 4.27 to 4.12 ms an image (docs/benchmarks.md).
CPU_BATCH_DELAY_S = 0.1
# Queue bound, in batches: enough to keep the device busy while clients refill, small enough for memory
# (8 x 64 rows x 150 KB = 77 MB at 224 px on a GPU).
MAX_QUEUED_BATCHES = 8
# Batches assembled and uploaded ahead of the one computing: one hides the upload; more would only take
# batches from the queue before they are full.
STAGED_AHEAD = 1
# Computed batches waiting for their results to be copied back and sent.
COMPUTED_AHEAD = 2
POLL_S = 0.5


class InferRequest:
    """One INFER message in flight: its pixels, and the output rows gathered so far from device batches.

    `row_errors` holds, when the sidecar decoded the images itself, an error (or None) per request row;
    `pixels` then holds only the rows that decoded, and the reply puts the failed rows in their places.
    A request is answered exactly once: the first of `reply` and `fail` to claim it sends; later ones do nothing.
    """

    __slots__ = ("conn", "request_id", "job", "pixels", "rows", "row_errors", "arrived", "chunks", "done_rows",
                 "answered", "_claim_lock")

    def __init__(self, conn, request_id: int, job: str, pixels, row_errors: list | None = None):
        self.conn, self.request_id, self.job, self.pixels = conn, request_id, job, pixels
        self.rows = len(pixels)
        self.row_errors = row_errors
        self.arrived = time.monotonic()
        self.chunks: list[dict] = []
        self.done_rows = 0
        self.answered = False
        self._claim_lock = threading.Lock()  # two stages may fail two batches of one split request at once

    def gather(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Outputs for the next rows of this request; all its outputs once every row has them, else None."""
        self.chunks.append(outputs)
        self.done_rows += len(next(iter(outputs.values())))
        if self.done_rows < self.rows:
            return None
        merged = self.chunks[0] if len(self.chunks) == 1 else {
            key: np.concatenate([chunk[key] for chunk in self.chunks]) for key in self.chunks[0]}
        self.chunks = []
        return merged

    def reply(self, outputs: dict[str, np.ndarray], schema: pa.Schema) -> None:
        """RESULT: one `schema` row per request row (reply.py), `outputs` being those of the decoded rows. Built
        before the request is claimed, so a reply that cannot be built leaves the request to `fail`."""
        payload = protocol.encode_outputs(reply_batch(outputs, self.row_errors, schema))
        if not self._claim():
            return
        try:
            self.conn.send(Kind.RESULT, self.request_id, payload)
        except Exception:
            with self._claim_lock:  # it did not go out: the request is still to be answered, by `fail`
                self.answered = False
            raise

    def fail(self, message: str, kind: ErrorKind) -> bool:
        """ERROR of `kind` for this request, unless it was answered already; whether this call answered it."""
        if not self._claim():
            return False
        self.conn.send_json(Kind.ERROR, self.request_id, protocol.error_reply(message, kind))
        return True

    def _claim(self) -> bool:
        with self._claim_lock:
            if self.answered:
                return False
            self.answered = True
            return True


def batch_delay_s(runner: ModelRunner) -> float:
    """How long a partial batch waits for more rows before `runner` computes it: CPU_BATCH_DELAY_S where its
    forwards take the host's cores (a simulated device, though on the CPU, stands for an accelerator)."""
    return CPU_BATCH_DELAY_S if runner.device.type == "cpu" and runner.normalises else MAX_BATCH_DELAY_S


def _concat(parts: list):
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], SizedImages):
        return SizedImages.concat(parts)
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return np.concatenate(parts)


def _joined(parts: list):
    """Outputs of consecutive rows as one: tensors concatenated, ragged rows (lists) chained."""
    if isinstance(parts[0], list):
        return [row for part in parts for row in part]
    return torch.cat(parts)


class ModelService:
    """Queue + pipeline for one runner at one target batch size.

    With a `tuner` (batch size auto), the target follows the tuner as it measures full batches (dynamic tuning);
    an out-of-memory back-off ends tuning, since the memory bound then decides.
    """

    def __init__(self, runner: ModelRunner, target_rows: int, stats: JobStats, *,
                 max_delay_s: float = MAX_BATCH_DELAY_S, max_queued_batches: int = MAX_QUEUED_BATCHES,
                 tuner: OnlineTuner | None = None, compute_workers: int = 1,
                 on_sticky: Callable[[str], None] | None = None, prediction: PredictionCheck | None = None,
                 on_verdict: Callable[[str], str | None] | None = None):
        self.runner = runner
        # Measured against predicted batch times; `on_verdict` hears a sustained disagreement once and returns
        # what was done about it (prediction_action, for the summary).
        self.prediction = prediction
        self.on_verdict = on_verdict
        self.prediction_action: str | None = None
        self.on_sticky = on_sticky  # told, once per failed batch, when the device became unusable
        self.stats = stats
        self.tuner = tuner
        self.compute_workers = max(1, compute_workers)
        self.queue = WorkQueue(target_rows, max_delay_s, max_queued_batches * target_rows)
        self._staged: queue.Queue = queue.Queue()
        # One staged batch ahead per compute thread: each finds its next batch uploaded when it is done.
        self._staged_slots = threading.Semaphore(STAGED_AHEAD + self.compute_workers - 1)
        self._computed: queue.Queue = queue.Queue(COMPUTED_AHEAD + self.compute_workers - 1)
        self._sequence = itertools.count()  # batch numbers, in assembly order (only the assembler draws them)
        self._closing = threading.Event()
        loops = [self._assemble_loop, *[self._compute_loop] * self.compute_workers, self._deliver_loop]
        self._threads = [threading.Thread(target=loop, name=f"{loop.__name__.strip('_')}", daemon=True)
                         for loop in loops]
        for thread in self._threads:
            thread.start()

    @property
    def target_rows(self) -> int:
        return self.queue.target_rows

    def submit(self, request: InferRequest) -> None:
        """Queue a request; blocks while the queue is full (backpressure). An all-failed request replies now."""
        if request.rows == 0:
            request.reply({}, self.runner.reply_schema)
            return
        self.queue.put(request, request.rows)

    def close(self, timeout_s: float = POLL_S * 4) -> bool:
        """Stop the pipeline threads once the queue is drained (an evicted, idle service); whether they ended."""
        self._closing.set()
        self.queue.close()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _assemble_loop(self) -> None:
        while True:
            self._staged_slots.acquire()
            batch = self.queue.get_batch(timeout=POLL_S)
            if not batch:
                self._staged_slots.release()
                if self._closing.is_set():
                    break
                continue
            now = time.monotonic()
            for s in batch:
                if s.start == 0:
                    self.stats.queue_wait(s.request.job, now - s.request.arrived)
            number = next(self._sequence)
            try:
                staged = self.runner.upload(_concat([s.request.pixels[s.start:s.stop] for s in batch]))
            except Exception as e:
                self._staged_slots.release()
                self._fail(batch, e)
                self._computed.put((number, None, None, None, 0.0))  # the deliverer must not wait for this number
                continue
            self._staged.put((number, batch, staged))
        for _ in range(self.compute_workers):
            self._staged.put(None)  # one end mark per compute thread

    def _compute_loop(self) -> None:
        while True:
            item = self._staged.get()
            if item is None:
                self._computed.put(None)
                return
            number, batch, staged = item
            self._staged_slots.release()
            started, cpu_started = time.perf_counter(), time.thread_time()
            try:
                pending = self._forward_with_backoff(batch, staged)
            except Exception as e:
                self._fail(batch, e)
                pending = None
            # This thread's CPU time for the forward (on a CPU, the model's work; on CUDA, launching it): the
            # summary's compute_cpu_s, which separates the sidecar's computing from its serving.
            self._computed.put((number, batch, pending, started, time.thread_time() - cpu_started))

    def _forward_with_backoff(self, batch: list[Slice], staged: Staged) -> Pending:
        """Forward the batch; on out-of-memory, run it in halves and lower the target for what follows."""
        try:
            return self.runner.forward(staged)
        except Exception as e:
            rows = len(staged.pixels)
            if not is_out_of_memory(e) or rows == 1:
                raise
        half = rows // 2
        self.tuner = None
        if self.queue.target_rows > half:
            self.queue.set_target(half)
            self.stats.oom_backoff({s.request.job for s in batch}, half)
            log.warning("out of memory at batch %d: halving to %d for the rest of the job", rows, half)
        if self.runner.cuda:
            torch.cuda.empty_cache()
        parts = [self._forward_with_backoff(batch, Staged(staged.pixels[i:i + half], staged.ready))
                 for i in range(0, rows, half)]
        if len(parts) == 1:
            return parts[0]
        for part in parts:
            if part.done is not None:
                part.done.synchronize()
        return Pending({k: _joined([p.outputs[k] for p in parts]) for k in parts[0].outputs})

    def _in_order(self):
        """Computed batches in assembly order (compute threads may finish them out of order); None once every
        compute thread has ended."""
        waiting: list = []
        expected = 0
        ended = 0
        while True:
            item = self._computed.get()
            if item is None:
                ended += 1
                if ended == self.compute_workers:
                    yield None
                    return
                continue
            heapq.heappush(waiting, (item[0], id(item), item))
            while waiting and waiting[0][0] == expected:
                yield heapq.heappop(waiting)[2]
                expected += 1

    def _deliver_loop(self) -> None:
        for item in self._in_order():
            if item is None:
                return  # closed (evicted)
            _, batch, pending, started, compute_cpu_s = item
            if pending is None:
                continue  # failed upstream; its requests have their errors already
            try:
                outputs = self.runner.download(pending)
            except Exception as e:
                self._fail(batch, e)
                continue
            job_rows: Counter = Counter()
            for s in batch:
                job_rows[s.request.job] += s.rows
            rows, elapsed = sum(job_rows.values()), time.perf_counter() - started
            self.stats.batch(job_rows, rows, elapsed, compute_cpu_s)
            offset = 0
            for s in batch:
                if not s.request.answered:
                    # One request's reply failing (outputs that do not fit, a connection that refuses it)
                    # fails that request only: the others of the batch keep their one reply each.
                    try:
                        done = s.request.gather({k: v[offset:offset + s.rows] for k, v in outputs.items()})
                        if done is not None:
                            s.request.reply(done, self.runner.reply_schema)
                    except Exception as e:
                        self._fail([s], e, rows=rows)
                offset += s.rows
            self._tune(rows, elapsed)
            self._check_prediction(rows, elapsed)

    def _check_prediction(self, rows: int, elapsed_s: float) -> None:
        check = self.prediction
        if check is None or check.verdict is not None or rows != self.queue.target_rows:
            return  # partial batches measure the clients' pace
        verdict = check.observe(rows, 1000 * elapsed_s)
        if verdict is not None:
            log.warning("measured batches disagree with the device profile: %s", check.summary()["message"])
            if self.on_verdict is not None:
                try:
                    self.prediction_action = self.on_verdict(verdict)
                except Exception as e:  # a report, never a reason to fail the batch
                    log.warning("could not act on the disagreement (%s: %s)", type(e).__name__, e)

    def _tune(self, rows: int, elapsed_s: float) -> None:
        tuner = self.tuner
        if tuner is None or tuner.settled or rows != self.queue.target_rows:
            return  # partial batches measure the clients' pace, not the device's
        tuner.observe(rows, 1000 * elapsed_s)
        if tuner.target != self.queue.target_rows:
            log.info("tuning: batch %d -> %d (measured img/s by size: %s)", rows, tuner.target,
                     tuner.summary()["observed_images_per_s"])
            self.queue.set_target(tuner.target)

    def _fail(self, batch: list[Slice], error: Exception, rows: int | None = None) -> None:
        """A failed batch fails its requests that have no reply yet, never the sidecar; the ERROR names who
        failed (runner.failure_kind). A sticky device error first tells `on_sticky`, which retires the sidecar."""
        rows = sum(s.rows for s in batch) if rows is None else rows
        kind = failure_kind(error)
        log.error("batch of %d rows failed (%s): %s: %s", rows, kind.value, type(error).__name__, error)
        message = f"failed on a batch of {rows}: {type(error).__name__}: {error}"
        if kind == ErrorKind.STICKY and self.on_sticky is not None:
            self.on_sticky(message)  # before the replies: a task that reads one may SIGKILL this sidecar at once
        for s in batch:
            if s.request.fail(message, kind):
                self.stats.error(s.request.job)
