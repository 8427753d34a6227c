"""ModelService in-process: exact per-request results under concurrency, OOM back-off, failures. The tests whose
fake models take real time (backpressure, timings, tuning) are tests/integration/sidecar/test_service_timing.py.

No sockets and no processes: requests come from plain threads through a recording connection (the service only
needs `send` and `send_json`), and the model is either a fake runner whose outputs are derived from each input
row, so every output row can be traced to the row it came from, or the real demo CNN on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING, DigitsCNN
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import ModelSpec
from spark_cnn.models.tensors import normalise
from spark_cnn.sidecar.batcher import BatchPlanner
from spark_cnn.sidecar.job_stats import JobStats
from spark_cnn.sidecar.runner import ModelRunner, Pending, Staged
from spark_cnn.sidecar.service import (
    CPU_BATCH_DELAY_S,
    MAX_BATCH_DELAY_S,
    InferRequest,
    ModelService,
    batch_delay_s,
)
from spark_cnn.task.protocol import Kind
from spark_cnn.task.schema import ERROR
from tests.service_doubles import (
    FAKE_SHAPE,
    JOB,
    JOIN_S,
    OOM_ROW,
    POISON,
    FakeRunner,
    RecordingConnection,
    check_traceable,
    id_rows,
    marker_rows,
    mixed_requests,
    row_ids,
    run_producers,
    submit_all,
    submit_from_threads_and_check_replies,
)

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


def test_a_batchs_compute_cpu_is_shared_among_its_jobs_by_rows():
    stats = JobStats()
    for job in ("job-a", "job-b"):
        stats.start(job, 4, "fp32")
    stats.batch({"job-a": 3, "job-b": 1}, 4, device_s=0.2, compute_cpu_s=0.4)
    stats.batch({"job-a": 2}, 2, device_s=0.1, compute_cpu_s=0.1)

    a, b = stats.snapshot("job-a"), stats.snapshot("job-b")
    assert (a["compute_cpu_s"], b["compute_cpu_s"]) == (0.4, 0.1)  # 0.3 + 0.1, and 0.1: the jobs sum to 0.5
    assert (a["device_s"], b["device_s"]) == (0.3, 0.2)  # each job's batches' whole time


def test_the_tasks_decoding_cpu_is_summed_per_job():
    stats = JobStats()
    stats.request("job-a", 4, task_cpu_s=0.25)
    stats.request("job-a", 2, task_cpu_s=0.125)
    stats.request("job-b", 3)  # a client that does not say
    assert stats.snapshot("job-a")["task_decode_cpu_s"] == 0.375 and stats.snapshot("job-a")["images"] == 6
    assert stats.snapshot("job-b")["task_decode_cpu_s"] == 0.0


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


# --- how long a partial batch waits ------------------------------------------------------------------------------

def test_a_cpu_model_waits_longer_for_a_full_batch_than_a_simulated_accelerator(tmp_path):
    """On the CPU the wait leaves the cores to the tasks decoding the rows it waits for; an accelerator (here the
    simulated one, itself on the CPU) would idle."""
    weights = str(tmp_path / "digits.pt")
    torch.save(DigitsCNN().state_dict(), weights)
    cpu_model = ModelRunner(resolve_endpoint(ModelSpec(DIGITS_FACTORY, weights=weights)).endpoint, torch.device("cpu"))
    accelerator = ModelRunner(resolve_endpoint(ModelSpec("sim:resnet50-h200")).endpoint, torch.device("cpu"))
    assert batch_delay_s(accelerator) == MAX_BATCH_DELAY_S < CPU_BATCH_DELAY_S == batch_delay_s(cpu_model)

    # Two tasks' requests of 16 rows, 50 ms apart, towards a batch of 64: one batch of 32 on the CPU, two of 16 where
    # the device would idle.
    batches = {}
    for name, runner in (("cpu", cpu_model), ("accelerator", accelerator)):
        planner = BatchPlanner(64, batch_delay_s(runner))
        planner.add("a", rows=16, now=0.0)
        sizes = []
        for now in (0.02, 0.05, 0.08, 0.12):
            if now == 0.05:
                planner.add("b", rows=16, now=now)
            if planner.ready(now):
                sizes.append(sum(s.rows for s in planner.take()))
        batches[name] = sizes
    assert batches == {"cpu": [32], "accelerator": [16, 16]}
