"""ModelService against fake models that take real time: backpressure with a slow model, the time statistics, the
online tuner and the prediction check on measured batch times, parallel compute threads finishing out of order.
They wait on the wall clock (the fakes sleep to stand for a device), so they are not unit tests."""

from __future__ import annotations

import threading
import time

import numpy as np

from spark_cnn.sidecar.job_stats import JobStats
from spark_cnn.sidecar.runner import Pending, Staged
from spark_cnn.sidecar.service import InferRequest, ModelService
from tests.service_doubles import (
    JOB,
    JOIN_S,
    PIPELINE_BATCHES_MAX,
    FakeRunner,
    RecordingConnection,
    check_traceable,
    id_rows,
    mixed_requests,
    run_producers,
    submit_all,
    submit_from_threads_and_check_replies,
)

# --- backpressure ----------------------------------------------------------------------------------------------

def test_backpressure_bounds_queued_and_in_flight_rows_with_a_slow_model():
    target, queued_batches = 4, 2
    bound = target * queued_batches
    in_flight_bound = bound + PIPELINE_BATCHES_MAX * target
    runner = FakeRunner(delay_s=0.05)
    service = ModelService(runner, target, JobStats(), max_queued_batches=queued_batches)
    producers, per_producer = 4, 20
    conn = RecordingConnection()
    submitted = [0]
    counter_lock = threading.Lock()
    queued_samples: list[int] = []
    in_flight_samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with counter_lock:
                sent = submitted[0]
            # Read after `sent`: replies can only have grown, so this never overstates rows in flight.
            in_flight_samples.append(sent - conn.count)
            queued_samples.append(service.queue.queued_rows)
            time.sleep(0.001)

    def produce(p: int) -> None:
        for i in range(per_producer):
            request_id = p * 1000 + i + 1
            service.submit(InferRequest(conn, request_id, JOB, id_rows([request_id])))
            with counter_lock:
                submitted[0] += 1

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        run_producers(produce, producers)
        assert conn.wait_for(producers * per_producer), f"only {conn.count} replies"
    finally:
        stop.set()
        sampler.join(JOIN_S)
    elapsed = time.monotonic() - started

    assert max(queued_samples) <= bound + 1, f"queued rows peaked at {max(queued_samples)} (bound {bound})"
    assert max(queued_samples) >= target, f"the queue never filled (peak {max(queued_samples)}): no pressure"
    assert max(in_flight_samples) <= in_flight_bound, (max(in_flight_samples), in_flight_bound)
    # Rows in batches of <= 4 rows at 50 ms each take this long at least: the producers really waited.
    assert elapsed >= 0.05 * producers * per_producer / target * 0.9
    for p in range(producers):
        for i in range(per_producer):
            request_id = p * 1000 + i + 1
            check_traceable(conn.result(request_id), [request_id])


def test_queue_wait_and_device_time_are_recorded():
    stats = JobStats()
    delay_s, max_delay_s = 0.02, 0.05
    service = ModelService(FakeRunner(delay_s=delay_s), 8, stats, max_delay_s=max_delay_s)
    conn = RecordingConnection()

    # One row alone waits out the batching delay before it goes, then costs one slow forward.
    submit_all(service, conn, {1: id_rows([1])})
    assert conn.wait_for(1)
    submit_all(service, conn, {2: id_rows(range(2, 10)), 3: id_rows(range(10, 13))})
    assert conn.wait_for(3)

    snapshot = stats.snapshot(JOB)
    assert snapshot["mean_queue_wait_ms"] >= 0.0
    assert snapshot["batches"] == 3  # [1], [2..9] full, [10..12] partial
    assert snapshot["histogram"] == {"1": 1, "3": 1, "8": 1}
    assert sum(snapshot["histogram"].values()) == snapshot["batches"]
    assert snapshot["mean_batch_size"] == 4.0
    assert snapshot["device_s"] >= 3 * delay_s * 0.95, snapshot
    # Requests 1 and 3 each waited out max_delay_s as a partial batch; request 2 filled a batch at once.
    assert snapshot["mean_queue_wait_ms"] >= 1000 * max_delay_s * 2 / 3 * 0.99, snapshot


# --- dynamic tuning -----------------------------------------------------------------------------------------------

class ShapedRunner(FakeRunner):
    """A device whose batch time is `fixed_ms` (2) + 1 ms per row: bigger batches pay off less and less."""

    def __init__(self, fixed_ms: float = 2.0):
        super().__init__()
        self.fixed_s = fixed_ms / 1000

    def forward(self, staged: Staged) -> Pending:
        time.sleep(self.fixed_s + 0.001 * len(staged.pixels))
        return super().forward(staged)


def test_the_online_tuner_moves_the_target_to_the_measured_best():
    from spark_cnn.sidecar.online_tuner import OnlineTuner

    # device img/s by size: 8 -> 571, 16 -> 727, 32 -> 842, 64 -> 914 (the service adds its own per-batch cost):
    # steps up gain 27%, 16% and 8.5%, the first two far beyond a loaded host's noise
    tuner = OnlineTuner(8, block=2, rounds=(2, 4), max_size=64)
    service = ModelService(ShapedRunner(fixed_ms=6), 8, JobStats(), tuner=tuner, max_delay_s=0.2,
                           max_queued_batches=4)
    conn = RecordingConnection()
    requests = {i: id_rows(range(i * 100, i * 100 + 4)) for i in range(1, 801)}  # 3,200 rows, always a queue

    def produce(i: int) -> None:
        submit_all(service, conn, {k: v for k, v in requests.items() if k % 4 == i})

    run_producers(produce, 4)
    assert conn.wait_for(len(requests))
    for request_id in requests:
        check_traceable(conn.result(request_id), range(request_id * 100, request_id * 100 + 4))
    observed = {int(size): rate for size, rate in tuner.summary()["observed_images_per_s"].items()}
    assert tuner.settled and service.target_rows == tuner.target, tuner.summary()
    assert tuner.target >= 32, observed  # the per-batch cost makes bigger batches pay, up to a point
    assert observed[tuner.target] >= 0.9 * max(observed.values()), observed


class StallingRunner(FakeRunner):
    """A CPU forward that stalls `stall_ms` a batch off the CPU (as on a core shared with decoding tasks) and spends
    `cpu_ms_per_row` of its own CPU a row, by spinning on this thread's own clock, so the CPU it spends holds
    however loaded the host is."""

    def __init__(self, stall_ms: float = 10.0, cpu_ms_per_row: float = 0.5):
        super().__init__()
        self.stall_s, self.cpu_s_per_row = stall_ms / 1000, cpu_ms_per_row / 1000
        self.cpu_spent_s = 0.0

    def forward(self, staged: Staged) -> Pending:
        spend = self.cpu_s_per_row * len(staged.pixels)
        time.sleep(self.stall_s)
        until = time.thread_time() + spend
        while time.thread_time() < until:
            pass
        self.cpu_spent_s += spend
        return super().forward(staged)


def test_a_jobs_compute_cpu_counts_the_forwards_own_cpu_and_not_their_stalls():
    runner, stats = StallingRunner(), JobStats()
    service = ModelService(runner, 8, stats, max_delay_s=0.05, compute_workers=2)
    conn = RecordingConnection()
    requests = {i: id_rows(range(i * 100, i * 100 + 4)) for i in range(1, 101)}  # 400 rows: 50 batches of 8

    def produce(i: int) -> None:
        submit_all(service, conn, {k: v for k, v in requests.items() if k % 4 == i})

    run_producers(produce, 4)
    assert conn.wait_for(len(requests))
    service.close()
    snapshot = stats.snapshot(JOB)
    # At least what the forwards spun (the rest: the fake's own tensors), far below the batches' wall time,
    # which holds every stall (10 ms a batch, so >= 0.5 s over 50 batches against 0.2 s of CPU).
    assert runner.cpu_spent_s <= snapshot["compute_cpu_s"] <= runner.cpu_spent_s + 0.15, snapshot
    assert snapshot["device_s"] >= runner.cpu_spent_s + snapshot["batches"] * runner.stall_s * 0.95, snapshot


# --- parallel compute threads (CPU sidecars) ----------------------------------------------------------------------

class JitteryRunner(FakeRunner):
    """A fake whose batches take uneven time, so parallel compute threads finish them out of order."""

    def __init__(self):
        super().__init__()
        self._rng = np.random.default_rng(5)
        self._rng_lock = threading.Lock()
        self.concurrent = self.max_concurrent = 0

    def forward(self, staged: Staged) -> Pending:
        with self._rng_lock:
            delay = float(self._rng.uniform(0.0, 0.01))
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        time.sleep(delay)
        try:
            return super().forward(staged)
        finally:
            with self._rng_lock:
                self.concurrent -= 1


def test_parallel_compute_threads_deliver_split_requests_exactly_and_in_order():
    stats = JobStats()
    runner = JitteryRunner()
    service = ModelService(runner, 4, stats, compute_workers=3)
    # Requests of up to 11 rows against batches of 4: most are split across batches computed side by side.
    batches = [mixed_requests(seed=20 + t, count=25, first_id=(t + 1) * 100, max_rows=11) for t in range(4)]

    submit_from_threads_and_check_replies(service, batches)
    assert runner.max_concurrent >= 2  # batches really were computed side by side
    assert stats.snapshot(JOB)["errors"] == 0


def test_batches_far_faster_than_predicted_are_reported_once_and_acted_on():
    from spark_cnn.sidecar.prediction_check import FASTER, PredictionCheck

    # ShapedRunner takes ~10 ms per batch of 8; a profile said 80 ms (as one calibrated on a busy host might)
    heard = []
    check = PredictionCheck({8: 80.0}, window=4, sustained=2)
    service = ModelService(ShapedRunner(), 8, JobStats(), prediction=check, max_delay_s=0.2, max_queued_batches=4,
                           on_verdict=lambda verdict: heard.append(verdict) or "marked")
    conn = RecordingConnection()
    requests = {i: id_rows(range(i * 100, i * 100 + 4)) for i in range(1, 81)}  # 320 rows: 40 full batches

    def produce(i: int) -> None:
        submit_all(service, conn, {k: v for k, v in requests.items() if k % 4 == i})

    run_producers(produce, 4)
    assert conn.wait_for(len(requests))
    service.close()
    assert heard == [FASTER] and service.prediction_action == "marked"
    assert check.summary()["verdict"] == FASTER and check.summary()["windows"] >= 2
