"""The task side's stages, one at a time and chained in-process (no sidecar, no Spark): decode_row, request,
receive, gathered and assemble, and a partition through all of them with a fake client."""

from __future__ import annotations

import re
from collections import deque

import numpy as np
import pyarrow as pa
import pytest

from spark_cnn.errors import ImageError, SidecarError
from spark_cnn.imaging.limits import DecodeOptions
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.spec import Endpoint
from spark_cnn.task.client import RequestFailed, map_ordered
from spark_cnn.task.launcher import LaunchOptions
from spark_cnn.task.protocol import PricedImages
from spark_cnn.task.schema import output_schema, reply_schema
from spark_cnn.task.stream import (
    INPUT_COLUMNS,
    NULL_IMAGE,
    InferencePlan,
    PendingBatch,
    Request,
    assemble,
    decode_row,
    gathered,
    pending_batch,
    receive,
    request,
)

ENDPOINT = Endpoint(source="m", weights=None, preprocessing=Preprocessing(), top_k=1)


def _plan(**options) -> InferencePlan:
    return InferencePlan(endpoint=ENDPOINT, launch=LaunchOptions(app_id="app"), job_id="job", **options)


def _labels(labels: list[int]) -> pa.RecordBatch:
    """Reply rows as the sidecar sends them for classify: the label, a score, one top-k pair, no error."""
    return pa.RecordBatch.from_pydict(
        {"label": labels, "score": [0.5] * len(labels), "topk": [[{"label": x, "score": 0.5}] for x in labels],
         "error": [None] * len(labels)}, schema=reply_schema())


def _batch(contents: list, paths: list[str] | None = None) -> pa.RecordBatch:
    paths = paths if paths is not None else [f"f{i}" for i in range(len(contents))]
    return pa.RecordBatch.from_arrays([pa.array(paths, pa.string()), pa.array(contents, pa.binary())],
                                      names=list(INPUT_COLUMNS))


# --- assemble: the one place failed rows go back, and the output check -----------------------------------------

def test_assemble_puts_failed_rows_back_at_their_positions_between_the_replies():
    paths = pa.array(["a", "b", "c", "d", "e"])
    pending = PendingBatch(paths, failed={3: "not an image", 0: "empty file (0 bytes)"})
    rows = assemble(_plan(), pending, [([4, 1], _labels([40, 10])), ([2], _labels([20]))])
    assert rows.schema.equals(output_schema())
    assert rows.column("path").equals(paths)  # the input's Arrow column, as it came
    assert rows.column("label").to_pylist() == [None, 10, 20, None, 40]
    assert rows.column("error").to_pylist() == ["empty file (0 bytes)", None, None, "not an image", None]


def test_assemble_of_a_batch_that_sent_nothing_is_its_error_rows():
    rows = assemble(_plan(), PendingBatch(pa.array(["a", "b"]), failed={1: "y", 0: "x"}), [])
    assert rows.column("error").to_pylist() == ["x", "y"] and rows.column("label").null_count == 2
    assert assemble(_plan(), PendingBatch(pa.array([], pa.string())), []).num_rows == 0


@pytest.mark.parametrize("failed, parts, message", [
    ({0: "x"}, [([1], _labels([1]))], "2 result rows for 3 input rows"),  # row 2 lost
    ({}, [([0, 1, 2, 2], _labels([0, 1, 2, 2]))], "4 result rows for 3 input rows"),  # row 2 twice
    ({1: "x"}, [([0, 1, 2], _labels([0, 1, 2]))], "4 result rows for 3 input rows"),  # failed and replied
    ({}, [([0, 1, 2], _labels([0, 1]))], "a reply of 2 rows for a request of 3 rows"),
])
def test_assemble_raises_unless_there_is_one_row_per_input_row(failed, parts, message):
    with pytest.raises(SidecarError, match=message):
        assemble(_plan(), PendingBatch(pa.array(["a", "b", "c"]), failed=failed), parts)


def test_assemble_copies_the_carried_columns():
    carried = pa.array([7, 8], pa.int64())
    rows = assemble(_plan(carry=("true_label",)), PendingBatch(pa.array(["a", "b"]), {"true_label": carried},
                                                               failed={0: "x"}), [([1], _labels([3]))])
    assert rows.schema.names[-1] == "true_label" and rows.column("true_label").equals(carried)


# --- decode_row and request ----------------------------------------------------------------------------------

def test_decode_row_fails_a_row_for_its_own_image_only():
    with pytest.raises(ImageError, match=re.escape(NULL_IMAGE)):
        decode_row(_plan(), None, struct=False, decode_here=False)
    with pytest.raises(ImageError, match="empty file"):
        decode_row(_plan(), b"", struct=False, decode_here=False)
    with pytest.raises(ImageError):
        decode_row(_plan(), b"not an image", struct=False, decode_here=True)
    too_large = _plan(decode_options=DecodeOptions(max_file_bytes=4))
    with pytest.raises(ImageError, match="max-file-bytes"):
        decode_row(too_large, b"12345", struct=False, decode_here=False)
    assert decode_row(_plan(), b"file", struct=False, decode_here=False) == (b"file", None)  # the sidecar decodes


def test_request_sends_the_rows_that_decode_and_keeps_the_others_by_row():
    batch = _batch([b"a", None, b"c", b"", b"e", b"f", None])
    pending = pending_batch(_plan(), batch)
    sent = list(request(_plan(request_rows=2), pending, batch, decode_here=False))
    assert [(s.rows, priced.images) for s, priced in sent] == [([0, 2], [b"a", b"c"]), ([4, 5], [b"e", b"f"])]
    assert all(s.batch is pending for s, _ in sent)
    assert all(priced.task_cpu_s >= 0.0 for _, priced in sent)  # the thread's CPU for them, told to the sidecar
    assert sorted(pending.failed) == [1, 3, 6] and pending.failed[1] == NULL_IMAGE


def test_request_with_on_error_fail_ends_the_task_naming_the_row():
    batch = _batch([b"a", None], paths=["good.jpg", "bad.jpg"])
    with pytest.raises(ImageError, match="bad.jpg: .*no image"):
        list(request(_plan(on_error="fail"), pending_batch(_plan(), batch), batch, decode_here=False))


# --- receive --------------------------------------------------------------------------------------------------

def test_receive_turns_a_refused_request_into_error_rows_and_fails_on_a_fault():
    sent = Request(PendingBatch(pa.array(["a", "b", "c"])), [0, 2])
    rows = receive(_plan(), sent, RequestFailed("too many pixels"))
    assert rows.num_rows == 2 and rows.column("error").to_pylist() == ["too many pixels"] * 2
    with pytest.raises(SidecarError, match="a .and 1 more.: too many pixels"):
        receive(_plan(on_error="fail"), sent, RequestFailed("too many pixels"))
    with pytest.raises(SidecarError, match="unexpected reply"):
        receive(_plan(), sent, None)


def test_receive_with_on_error_fail_ends_the_task_at_a_row_the_sidecar_failed():
    reply = _labels([1, 2]).set_column(3, "error", pa.array([None, "cannot decode image"]))
    sent = Request(PendingBatch(pa.array(["a", "b", "c"])), [0, 2])
    assert receive(_plan(), sent, reply) is reply
    with pytest.raises(ImageError, match="c: cannot decode image"):
        receive(_plan(on_error="fail"), sent, reply)


# --- gathered -------------------------------------------------------------------------------------------------

def test_gathered_yields_each_batch_once_its_rows_are_answered_in_input_order():
    first, empty, failed, last = (PendingBatch(pa.array(["x"] * n)) for n in (3, 0, 1, 2))
    failed.failed[0] = "bad"
    begun = deque([first, empty, failed, last])
    replies = iter([(Request(first, [0, 1]), _labels([0, 1])), (Request(first, [2]), _labels([2])),
                    (Request(last, [1, 0]), _labels([1, 0]))])
    out = gathered(replies, begun)
    pending, parts = next(out)
    assert pending is first and [rows for rows, _ in parts] == [[0, 1], [2]]
    assert [(pending, [rows for rows, _ in parts]) for pending, parts in out] == [
        (empty, []), (failed, []), (last, [[1, 0]])]
    assert not begun


def test_gathered_does_not_wait_for_later_replies_once_a_batch_is_answered():
    first, second = PendingBatch(pa.array(["a", "b"]), failed={1: "bad"}), PendingBatch(pa.array(["c"]))
    begun = deque([first, second])

    def replies():
        yield Request(first, [0]), _labels([0])
        raise AssertionError("the first batch should be out before the second's reply is asked for")

    pending, _ = next(gathered(replies(), begun))
    assert pending is first


# --- a partition through every stage ---------------------------------------------------------------------------

class _FakeClient:
    """A sidecar in-process: each row's label is its file's length; requests holding `refuse` are refused."""

    max_in_flight = 3

    def __init__(self, refuse: bytes):
        self.refuse = refuse
        self.waiting: deque = deque()
        self.ids = iter(range(1, 1 << 30))

    def submit(self, priced: PricedImages) -> int:
        request_id = next(self.ids)
        self.waiting.append((request_id, priced.images))
        return request_id

    def receive(self):
        request_id, images = self.waiting.popleft()
        if self.refuse in images:
            return request_id, RequestFailed("refused")
        return request_id, _labels([len(image) for image in images])


@pytest.mark.parametrize("seed", range(12))
def test_every_input_row_yields_one_output_row_in_order_with_its_error(seed):
    rng = np.random.default_rng(seed)
    plan = _plan(request_rows=int(rng.integers(1, 5)))
    refused = b"refuse me"
    inputs = []
    for b in range(int(rng.integers(1, 6))):
        choices = [None, b"", refused] + [b"x" * int(k) for k in range(1, 9)]
        contents = [choices[i] for i in rng.integers(0, len(choices), int(rng.integers(0, 9)))]
        inputs.append(_batch(contents, paths=[f"b{b}r{i}" for i in range(len(contents))]))
    begun: deque[PendingBatch] = deque()

    def requests():
        for batch in inputs:
            pending = pending_batch(plan, batch)
            begun.append(pending)
            yield from request(plan, pending, batch, decode_here=False)

    replies = ((sent, receive(plan, sent, reply)) for sent, reply in map_ordered(_FakeClient(refused), requests()))
    outputs = [assemble(plan, pending, parts) for pending, parts in gathered(replies, begun)]

    assert len(outputs) == len(inputs)
    for batch, rows in zip(inputs, outputs, strict=True):
        assert rows.column("path").equals(batch.column("path"))
        for content, label, error in zip(batch.column("content").to_pylist(), rows.column("label").to_pylist(),
                                         rows.column("error").to_pylist(), strict=True):
            if not content:  # null or empty: failed in the task
                assert label is None and error is not None
            elif error is not None:  # sent in a refused request
                assert label is None and error == "refused"
            else:
                assert label == len(content) and content != refused
