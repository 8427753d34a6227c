"""Test doubles for ModelService without sockets or processes: a connection that records replies, a fake runner
whose every output row can be traced to the input row it came from (with injectable faults), and helpers that
make, submit and check such rows. Shared by the sidecar unit tests and the timing tests in tests/integration."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import numpy as np
import pyarrow as pa
import torch

from spark_cnn.sidecar.runner import ModelRunner, Pending, Staged
from spark_cnn.sidecar.service import InferRequest, ModelService
from spark_cnn.task import protocol
from spark_cnn.task.protocol import Kind
from spark_cnn.task.schema import reply_schema

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
