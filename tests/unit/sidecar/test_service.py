"""ModelService in-process: exact per-request results under concurrency, OOM back-off, failures, backpressure.

No sockets and no processes: requests come from plain threads through a recording connection (the service only
needs `send` and `send_json`), and the model is either a fake runner whose outputs are derived from each input
row, so every output row can be traced to the row it came from, or the real demo CNN on the CPU.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
import torch

from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING, DigitsCNN
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import ModelSpec
from spark_cnn.models.tensors import normalise
from spark_cnn.sidecar.job_stats import JobStats
from spark_cnn.sidecar.runner import ModelRunner, Pending, Staged
from spark_cnn.sidecar.service import InferRequest, ModelService
from spark_cnn.task import protocol
from spark_cnn.task.protocol import Kind
from spark_cnn.task.schema import ERROR, reply_schema

# Generous bounds for thread hand-offs: a passing test never waits for them, a hanging one fails after them.
REPLY_WAIT_S = 10.0
JOIN_S = 10.0
JOB = "job-1"
# Fake rows are tiny: the fake model reads only the first ID_BYTES values of each row.
FAKE_SHAPE = (2, 2, 3)
ID_BYTES = 3  # row ids up to 2**24, little-endian in the first three values
POISON = 255  # a row of all 255s makes the fake model raise a RuntimeError for its whole batch
OOM_ROW = 254  # a row of all 254s makes the fake model run out of memory at any batch size
FAKE_REPLY = reply_schema(logits=True)  # the fake model's outputs: label, score, top-2 and logits
# Batches the pipeline stages may hold beyond the queue (assembling, staged, computing, computed, delivering):
# a few each, never a number that grows with the load.
PIPELINE_BATCHES_MAX = 8


# --- helpers ----------------------------------------------------------------------------------------------------

class RecordingConnection:
    """Collects replies as the service sends them: decoded RESULT batches and ERROR dicts, by request id."""

    def __init__(self):
        self.replies: dict[int, list[tuple[Kind, object]]] = defaultdict(list)
        self.count = 0
        self._cond = threading.Condition()

    def send(self, kind: Kind, request_id: int, payload=b"") -> None:
        value = protocol.decode_outputs(payload) if kind == Kind.RESULT else json.loads(bytes(payload))
        self._record(kind, request_id, value)

    def send_json(self, kind: Kind, request_id: int, data: dict) -> None:
        self._record(kind, request_id, data)

    def _record(self, kind: Kind, request_id: int, value) -> None:
        with self._cond:
            self.replies[request_id].append((kind, value))
            self.count += 1
            self._cond.notify_all()

    def wait_for(self, n: int, timeout: float = REPLY_WAIT_S) -> bool:
        """True once at least `n` replies have arrived; False after `timeout` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= n, timeout)

    def only_reply(self, request_id: int) -> tuple[Kind, object]:
        with self._cond:
            replies = list(self.replies[request_id])
        assert len(replies) == 1, f"request {request_id}: expected exactly one reply, got {replies}"
        return replies[0]

    def result(self, request_id: int) -> pa.RecordBatch:
        kind, value = self.only_reply(request_id)
        assert kind == Kind.RESULT, f"request {request_id}: expected a RESULT, got {kind.name} {value}"
        return value

    def error(self, request_id: int) -> str:
        kind, value = self.only_reply(request_id)
        assert kind == Kind.ERROR, f"request {request_id}: expected an ERROR, got {kind.name}"
        return value["message"]


def id_rows(ids) -> np.ndarray:
    """One fake row per id, the id written little-endian into the row's first ID_BYTES values."""
    ids = np.asarray(ids, dtype=np.int64)
    rows = np.zeros((len(ids), int(np.prod(FAKE_SHAPE))), np.uint8)
    for b in range(ID_BYTES):
        rows[:, b] = (ids >> (8 * b)) & 0xFF
    return rows.reshape((len(ids), *FAKE_SHAPE))


def marker_rows(value: int, n: int = 1) -> np.ndarray:
    return np.full((n, *FAKE_SHAPE), value, np.uint8)


def ids_of(batch: pa.RecordBatch) -> np.ndarray:
    """The ids the fake model saw, read back from its `logits` output."""
    logits = batch.column("logits").flatten().to_numpy().reshape(batch.num_rows, ID_BYTES)
    return sum(logits[:, b].astype(np.int64) << (8 * b) for b in range(ID_BYTES))


def check_traceable(batch: pa.RecordBatch, ids) -> None:
    """Every output column of the fake model matches the input rows, row for row, in order."""
    ids = np.asarray(ids, dtype=np.int64)
    assert batch.num_rows == len(ids)
    np.testing.assert_array_equal(ids_of(batch), ids)
    np.testing.assert_array_equal(batch.column("label").to_numpy(), ids & 0xFF)
    second = ((ids >> 8) & 0xFF).astype(np.float32)
    np.testing.assert_array_equal(batch.column("score").to_numpy(), second / np.float32(255.0))
    topk = batch.column("topk").flatten().field("label").to_numpy().reshape(len(ids), 2)
    np.testing.assert_array_equal(topk, np.stack([ids & 0xFF, (ids >> 8) & 0xFF], axis=1))


class FakeRunner:
    """ModelRunner's surface as ModelService uses it, with outputs derived from the input pixels.

    Faults to inject: `oom_above` rows raise torch.OutOfMemoryError (as CUDA would), `delay_s` per batch (a slow
    model), a row of all POISON values fails its batch with a RuntimeError, a row of all OOM_ROW values runs out
    of memory whatever the batch size, and a row of all `bad_output_row` values makes one output three-dimensional.
    """

    cuda = False
    precision = "fp32"
    endpoint = None
    reply_schema = FAKE_REPLY

    def __init__(self, *, oom_above: int | None = None, delay_s: float = 0.0, bad_output_row: int | None = None):
        self.oom_above = oom_above
        self.delay_s = delay_s
        self.bad_output_row = bad_output_row
        self.forwards: list[tuple[int, str]] = []  # (rows, "ok" | "oom" | "error") per forward call, in order

    def upload(self, pixels) -> Staged:
        return Staged(torch.from_numpy(np.ascontiguousarray(pixels)))

    def forward(self, staged: Staged) -> Pending:
        pixels = staged.pixels
        rows = len(pixels)
        flat = pixels.reshape(rows, -1)
        if self.delay_s:
            time.sleep(self.delay_s)
        if bool((flat == POISON).all(dim=1).any()):
            self.forwards.append((rows, "error"))
            raise RuntimeError("poisoned input row")
        if bool((flat == OOM_ROW).all(dim=1).any()) or (self.oom_above is not None and rows > self.oom_above):
            self.forwards.append((rows, "oom"))
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected at {rows} rows)")
        self.forwards.append((rows, "ok"))
        ids = flat[:, :ID_BYTES].to(torch.int64)
        label = ids[:, 0].to(torch.int32)
        logits = ids.to(torch.float32)
        if self.bad_output_row is not None and bool((flat == self.bad_output_row).all(dim=1).any()):
            logits = logits[:, :, None]  # like a model that returns a map instead of one vector per image
        return Pending({"label": label, "score": ids[:, 1].to(torch.float32) / 255.0,
                        "topk_label": ids[:, :2].to(torch.int32), "topk_score": ids[:, :2].to(torch.float32),
                        "logits": logits})

    download = staticmethod(ModelRunner.download)

    def ok_sizes(self) -> list[int]:
        return [rows for rows, outcome in self.forwards if outcome == "ok"]


def submit_all(service: ModelService, conn: RecordingConnection, requests: dict[int, np.ndarray],
               job: str = JOB) -> None:
    for request_id, pixels in requests.items():
        service.submit(InferRequest(conn, request_id, job, pixels))


def run_producers(target, count: int) -> None:
    """Run `target(i)` in `count` threads at once; every thread must finish within JOIN_S."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as e:  # surfaced below: an assertion in a thread must fail the test
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(thread.is_alive() for thread in threads), "a producer is still blocked: deadlock?"
    assert not errors, errors


def submit_from_threads_and_check_replies(service: ModelService, batches: list[dict[int, np.ndarray]]) -> None:
    """One thread and connection per dict of requests; every request gets one RESULT with exactly its rows."""
    conns = [RecordingConnection() for _ in batches]
    run_producers(lambda t: submit_all(service, conns[t], batches[t]), len(batches))
    for conn, requests in zip(conns, batches, strict=True):
        assert conn.wait_for(len(requests)), f"only {conn.count} of {len(requests)} replies arrived"
        assert set(conn.replies) == set(requests)
        for request_id, pixels in requests.items():
            check_traceable(conn.result(request_id), row_ids(pixels))  # one RESULT each, exact rows


def mixed_requests(seed: int, count: int, first_id: int, max_rows: int = 20) -> dict[int, np.ndarray]:
    """`count` requests of 1..max_rows rows; request ids and row ids are unique across seeds/first_ids."""
    rng = np.random.default_rng(seed)
    requests, next_id = {}, first_id * 1000
    for i in range(count):
        rows = int(rng.integers(1, max_rows + 1))
        requests[first_id + i] = id_rows(range(next_id, next_id + rows))
        next_id += rows
    return requests


def row_ids(pixels: np.ndarray) -> np.ndarray:
    flat = pixels.reshape(len(pixels), -1).astype(np.int64)
    return sum(flat[:, b] << (8 * b) for b in range(ID_BYTES))


# --- exact results under concurrency ----------------------------------------------------------------------------

def test_concurrent_requests_of_mixed_sizes_each_get_exactly_their_own_rows_in_order():
    stats = JobStats()
    runner = FakeRunner()
    service = ModelService(runner, 8, stats)
    threads, per_thread = 6, 30
    conns = [RecordingConnection() for _ in range(threads)]
    batches = [mixed_requests(seed=t, count=per_thread, first_id=(t + 1) * 100) for t in range(threads)]

    run_producers(lambda t: submit_all(service, conns[t], batches[t]), threads)

    for conn, requests in zip(conns, batches, strict=True):
        assert conn.wait_for(len(requests)), f"only {conn.count} of {len(requests)} replies arrived"
        assert set(conn.replies) == set(requests)
        for request_id, pixels in requests.items():
            check_traceable(conn.result(request_id), row_ids(pixels))
    total_rows = sum(len(p) for requests in batches for p in requests.values())
    snapshot = stats.snapshot(JOB)
    assert all(int(size) <= 8 for size in snapshot["histogram"]), snapshot["histogram"]
    assert sum(snapshot["histogram"].values()) == snapshot["batches"]
    assert sum(int(size) * n for size, n in snapshot["histogram"].items()) == total_rows
    assert max(runner.ok_sizes()) <= 8
    assert snapshot["errors"] == 0 and snapshot["oom_backoffs"] == 0


def test_service_with_the_real_demo_model_matches_a_direct_forward(tmp_path):
    torch.manual_seed(0)
    weights = str(tmp_path / "digits.pt")
    torch.save(DigitsCNN().state_dict(), weights)
    endpoint = resolve_endpoint(ModelSpec(DIGITS_FACTORY, weights=weights), logits=True).endpoint
    service = ModelService(ModelRunner(endpoint, torch.device("cpu")), 8, JobStats())
    model = DigitsCNN()
    model.load_state_dict(torch.load(weights, weights_only=True))
    model.eval()
    rng = np.random.default_rng(3)
    requests = {i + 1: rng.integers(0, 256, (rows, *DIGITS_PREPROCESSING.pixel_shape), dtype=np.uint8)
                for i, rows in enumerate([1, 5, 17, 3, 9, 2])}
    conn = RecordingConnection()

    submit_all(service, conn, requests)

    assert conn.wait_for(len(requests))
    for request_id, pixels in requests.items():
        batch = conn.result(request_id)
        with torch.inference_mode():
            expected = model(normalise(torch.from_numpy(pixels), DIGITS_PREPROCESSING)).numpy()
        logits = batch.column("logits").flatten().to_numpy().reshape(batch.num_rows, -1)
        np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(batch.column("label").to_numpy(), expected.argmax(axis=1))


# --- out-of-memory back-off --------------------------------------------------------------------------------------

def test_out_of_memory_halves_the_batch_and_the_target_and_loses_nothing():
    stats = JobStats()
    stats.start(JOB, 16, "fp32")
    runner = FakeRunner(oom_above=4)
    service = ModelService(runner, 16, stats, max_delay_s=30.0)  # only full batches: the first one is 16 rows
    conn = RecordingConnection()

    submit_all(service, conn, {1: id_rows(range(16))})

    assert conn.wait_for(1)
    check_traceable(conn.result(1), range(16))
    # 16 -> halves of 8 (out of memory too) -> quarters of 4; the target follows each halving once.
    assert runner.forwards == [(16, "oom"), (8, "oom"), (4, "ok"), (4, "ok"), (8, "oom"), (4, "ok"), (4, "ok")]
    assert service.target_rows == 4
    snapshot = stats.snapshot(JOB)
    assert (snapshot["oom_backoffs"], snapshot["batch_size"], snapshot["errors"]) == (2, 4, 0)


def test_out_of_memory_under_concurrent_load_completes_every_request_exactly_once():
    stats = JobStats()
    stats.start(JOB, 16, "fp32")
    runner = FakeRunner(oom_above=4)
    service = ModelService(runner, 16, stats)
    batches = [mixed_requests(seed=10 + t, count=20, first_id=(t + 1) * 100, max_rows=12) for t in range(4)]

    submit_from_threads_and_check_replies(service, batches)
    assert 1 <= service.target_rows <= 4
    assert max(runner.ok_sizes()) <= 4
    snapshot = stats.snapshot(JOB)
    assert snapshot["oom_backoffs"] >= 1
    assert snapshot["batch_size"] <= 4
    assert snapshot["errors"] == 0

    # A single row that still runs out of memory fails its own request only; the service keeps serving.
    before = service.target_rows
    after = RecordingConnection()
    submit_all(service, after, {1: marker_rows(OOM_ROW)})
    assert after.wait_for(1)
    message = after.error(1)
    assert "OutOfMemoryError" in message and "batch of 1" in message, message
    submit_all(service, after, {2: id_rows([7, 8, 9])})
    assert after.wait_for(2)
    check_traceable(after.result(2), [7, 8, 9])
    assert service.target_rows == before  # a batch of one cannot be halved: the target stays
    assert stats.snapshot(JOB)["errors"] == 1


# --- failures ------------------------------------------------------------------------------------------------------

def test_a_failed_batch_fails_exactly_its_requests_and_later_requests_succeed():
    stats = JobStats()
    runner = FakeRunner()
    service = ModelService(runner, 8, stats, max_delay_s=30.0)  # only full batches: their contents are fixed
    conn = RecordingConnection()
    # Batch 1 = a[0:3] + poisoned[0:2] + split[0:3]; batch 2 = split[3:5] + after[0:6].
    requests = {1: id_rows([10, 11, 12]), 2: marker_rows(POISON, 2), 3: id_rows([30, 31, 32, 33, 34]),
                4: id_rows([40, 41, 42, 43, 44, 45])}

    submit_all(service, conn, requests)

    assert conn.wait_for(4)
    for request_id in (1, 2, 3):
        message = conn.error(request_id)
        assert "RuntimeError" in message and "poisoned input row" in message, message
        assert "batch of 8" in message, message
    check_traceable(conn.result(4), [40, 41, 42, 43, 44, 45])

    submit_all(service, conn, {5: id_rows(range(50, 58))})
    assert conn.wait_for(5)
    check_traceable(conn.result(5), range(50, 58))
    # The tail of request 3 ran in batch 2 and succeeded, yet request 3 must keep its single ERROR.
    conn.error(3)
    assert runner.forwards == [(8, "error"), (8, "ok"), (8, "ok")]
    assert stats.snapshot(JOB)["errors"] == 3


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_output_that_cannot_be_encoded_fails_its_request_and_the_service_keeps_serving():
    bad = 253
    service = ModelService(FakeRunner(bad_output_row=bad), 4, JobStats(), max_delay_s=30.0)
    conn = RecordingConnection()

    submit_all(service, conn, {1: marker_rows(bad, 4)})
    submit_all(service, conn, {2: id_rows([1, 2, 3, 4])})

    # An instant fake model answers in milliseconds; a dead pipeline never does.
    assert conn.wait_for(2, timeout=1.0), f"{conn.count} of 2 replies: the service stopped answering"
    assert "shape" in conn.error(1)
    check_traceable(conn.result(2), [1, 2, 3, 4])


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


# --- replies without the model ----------------------------------------------------------------------------------

def test_a_request_whose_every_image_failed_to_decode_replies_at_once_with_null_outputs_and_its_errors():
    runner = FakeRunner()
    service = ModelService(runner, 8, JobStats())
    conn = RecordingConnection()
    errors = ["cannot decode image: truncated", "empty file (0 bytes)"]

    service.submit(InferRequest(conn, 9, JOB, np.zeros((0, *FAKE_SHAPE), np.uint8), row_errors=errors))

    assert conn.count == 1  # sent from submit itself, before it returned
    batch = conn.result(9)
    assert batch.schema.equals(runner.reply_schema)
    assert batch.column(ERROR).to_pylist() == errors
    assert all(batch.column(name).null_count == len(errors) for name in batch.schema.names if name != ERROR)
    assert runner.forwards == []
    assert service.queue.queued_rows == 0


def test_a_partly_decoded_request_puts_its_failed_rows_back_in_place():
    service = ModelService(FakeRunner(), 8, JobStats())
    conn = RecordingConnection()
    row_errors = ["bad first", None, None, "bad fourth", None]

    service.submit(InferRequest(conn, 3, JOB, id_rows([21, 22, 23]), row_errors=row_errors))

    assert conn.wait_for(1)
    batch = conn.result(3)
    assert batch.num_rows == 5
    assert batch.column(ERROR).to_pylist() == row_errors
    assert batch.column("label").to_pylist() == [None, 21, 22, None, 23]
    logits = batch.column("logits").to_pylist()
    assert [row[0] if row else None for row in logits] == [None, 21.0, 22.0, None, 23.0]


# --- statistics ----------------------------------------------------------------------------------------------------

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


def test_a_batch_shared_by_two_jobs_counts_for_each_with_its_full_size():
    stats = JobStats()
    service = ModelService(FakeRunner(), 4, stats, max_delay_s=30.0)
    conn = RecordingConnection()

    service.submit(InferRequest(conn, 1, "job-a", id_rows([1, 2])))
    service.submit(InferRequest(conn, 2, "job-b", id_rows([3, 4])))

    assert conn.wait_for(2)
    check_traceable(conn.result(1), [1, 2])
    check_traceable(conn.result(2), [3, 4])
    for job in ("job-a", "job-b"):
        snapshot = stats.snapshot(job)
        assert (snapshot["batches"], snapshot["histogram"], snapshot["mean_batch_size"]) == (1, {"4": 1}, 4.0)


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


# --- who a failure blames, and one reply per request ---------------------------------------------------------------

STICKY_ROW = 252  # a row of all 252s makes the fake model raise a CUDA error that leaves the device unusable


class StickyRunner(FakeRunner):
    def forward(self, staged: Staged) -> Pending:
        if bool((staged.pixels.reshape(len(staged.pixels), -1) == STICKY_ROW).all(dim=1).any()):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().forward(staged)


def test_errors_name_what_failed_model_device_or_a_sticky_device():
    retired: list[str] = []
    service = ModelService(StickyRunner(), 4, JobStats(), max_delay_s=0.0, on_sticky=retired.append)
    conn = RecordingConnection()

    submit_all(service, conn, {1: marker_rows(POISON)})
    assert conn.wait_for(1)
    submit_all(service, conn, {2: marker_rows(OOM_ROW)})  # out of memory at one image: nothing left to halve
    assert conn.wait_for(2)
    assert not retired
    submit_all(service, conn, {3: marker_rows(STICKY_ROW)})
    assert conn.wait_for(3)

    kinds = {request_id: conn.only_reply(request_id)[1]["kind"] for request_id in (1, 2, 3)}
    assert kinds == {1: "model", 2: "device", 3: "sticky"}
    assert len(retired) == 1 and "illegal memory access" in retired[0], retired


class RefusingConnection(RecordingConnection):
    """Delivery of request `refuse`'s RESULT fails (as sending to a broken client would); ERRORs still go out."""

    def __init__(self, refuse: int):
        super().__init__()
        self.refuse = refuse

    def send(self, kind: Kind, request_id: int, payload=b"") -> None:
        if kind == Kind.RESULT and request_id == self.refuse:
            raise BrokenPipeError("the client went away")
        super().send(kind, request_id, payload)


def test_a_delivery_failure_after_another_requests_reply_gives_each_request_one_reply():
    service = ModelService(FakeRunner(), 8, JobStats(), max_delay_s=30.0)  # one full batch of both requests
    conn = RefusingConnection(refuse=2)

    submit_all(service, conn, {1: id_rows([1, 2, 3, 4]), 2: id_rows([5, 6, 7, 8])})
    assert conn.wait_for(2)
    submit_all(service, conn, {3: id_rows(range(10, 18))})  # the pipeline lives on
    assert conn.wait_for(3)

    check_traceable(conn.result(1), [1, 2, 3, 4])  # its RESULT went out first; no ERROR after it
    assert "BrokenPipeError" in conn.error(2)
    check_traceable(conn.result(3), range(10, 18))
    assert conn.count == 3


def test_close_ends_the_pipeline_threads():
    service = ModelService(FakeRunner(), 4, JobStats(), max_delay_s=0.0, compute_workers=2)
    conn = RecordingConnection()
    submit_all(service, conn, {1: id_rows([1, 2, 3])})
    assert conn.wait_for(1)

    assert service.close(timeout_s=JOIN_S)
    assert not any(thread.is_alive() for thread in service._threads)


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
