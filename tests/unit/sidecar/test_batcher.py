"""BatchPlanner (pure: no threads, no clocks) and its thread-safe shell WorkQueue."""

from __future__ import annotations

import random
import threading

import pytest

from spark_cnn.sidecar.batcher import BatchPlanner, Slice
from spark_cnn.sidecar.work_queue import WorkQueue

# Generous bounds for thread hand-offs: a passing test never waits for them, a hanging one fails after them.
JOIN_S = 1.0
# How long a blocked thread is given to (wrongly) make progress before we conclude it is blocked.
BLOCKED_S = 0.05


def _spans(batch: list[Slice]) -> list[tuple]:
    return [(s.request, s.start, s.stop) for s in batch]


# --- BatchPlanner ---------------------------------------------------------------------------------------------

def test_small_requests_merge_up_to_target():
    planner = BatchPlanner(target_rows=8, max_delay_s=1.0)
    for name, rows in (("a", 3), ("b", 2), ("c", 3), ("d", 1)):
        planner.add(name, rows=rows, now=0.0)

    assert planner.ready(0.0)  # 9 rows queued >= 8
    assert _spans(planner.take()) == [("a", 0, 3), ("b", 0, 2), ("c", 0, 3)]
    assert planner.queued_rows == 1
    assert len(planner) == 1


def test_large_request_is_split_across_batches_in_fifo_order():
    planner = BatchPlanner(target_rows=4, max_delay_s=0.0)
    planner.add("a", rows=2, now=0.0)
    planner.add("big", rows=9, now=0.0)
    planner.add("c", rows=1, now=0.0)

    batches = [_spans(planner.take()) for _ in range(3)]

    assert batches == [
        [("a", 0, 2), ("big", 0, 2)],
        [("big", 2, 6)],
        [("big", 6, 9), ("c", 0, 1)],
    ]
    assert planner.queued_rows == 0
    assert len(planner) == 0


def test_slice_rows_is_stop_minus_start():
    assert Slice("r", 3, 10).rows == 7


def test_partial_batch_waits_for_the_deadline_of_its_oldest_row():
    planner = BatchPlanner(target_rows=8, max_delay_s=0.5)
    planner.add("a", rows=2, now=10.0)
    planner.add("b", rows=3, now=10.25)

    assert planner.deadline() == 10.5  # the oldest row decides, not the newest
    assert not planner.ready(10.0)
    assert not planner.ready(10.49)
    assert planner.ready(10.5)
    assert planner.ready(11.0)
    assert _spans(planner.take()) == [("a", 0, 2), ("b", 0, 3)]


def test_full_batch_is_ready_before_the_deadline():
    planner = BatchPlanner(target_rows=4, max_delay_s=100.0)
    planner.add("a", rows=3, now=0.0)
    assert not planner.ready(0.0)
    planner.add("b", rows=1, now=0.0)
    assert planner.ready(0.0)


def test_empty_planner_is_never_ready_and_takes_nothing():
    planner = BatchPlanner(target_rows=4, max_delay_s=0.0)
    assert planner.deadline() is None
    assert not planner.ready(1e9)
    assert planner.take() == []
    assert planner.queued_rows == 0


def test_split_remainder_keeps_its_original_arrival_time():
    # The remainder does not get a fresh deadline when its head is taken: it goes out at arrival + max_delay_s.
    planner = BatchPlanner(target_rows=4, max_delay_s=1.0)
    planner.add("big", rows=6, now=0.0)
    assert _spans(planner.take()) == [("big", 0, 4)]

    assert planner.deadline() == 1.0
    assert planner.ready(1.0)
    assert _spans(planner.take()) == [("big", 4, 6)]


def test_split_remainder_is_ready_once_the_original_deadline_has_passed():
    planner = BatchPlanner(target_rows=4, max_delay_s=1.0)
    planner.add("big", rows=6, now=0.0)
    planner.take()  # taken late, at t=2: the remainder's deadline (t=1) is already behind us
    assert planner.ready(2.0)


def test_queued_rows_bookkeeping():
    planner = BatchPlanner(target_rows=5, max_delay_s=0.0)
    planner.add("a", rows=3, now=0.0)
    planner.add("b", rows=4, now=0.0)
    assert (planner.queued_rows, len(planner)) == (7, 2)

    planner.take()  # a[0:3] + b[0:2]
    assert (planner.queued_rows, len(planner)) == (2, 1)

    planner.add("c", rows=1, now=0.0)
    assert (planner.queued_rows, len(planner)) == (3, 2)

    assert _spans(planner.take()) == [("b", 2, 4), ("c", 0, 1)]
    assert (planner.queued_rows, len(planner)) == (0, 0)


@pytest.mark.parametrize("target_rows, max_delay_s", [(0, 0.0), (-1, 0.0), (1, -0.001)])
def test_invalid_planner_arguments_raise(target_rows, max_delay_s):
    with pytest.raises(ValueError, match="must be >="):
        BatchPlanner(target_rows=target_rows, max_delay_s=max_delay_s)


@pytest.mark.parametrize("rows", [0, -3])
def test_request_without_rows_is_refused(rows):
    planner = BatchPlanner(target_rows=4, max_delay_s=0.0)
    with pytest.raises(ValueError, match="at least one row"):
        planner.add("a", rows=rows, now=0.0)
    assert planner.queued_rows == 0
    assert len(planner) == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_requests_are_reassembled_exactly_and_batches_never_exceed_target(seed):
    rng = random.Random(seed)
    target = rng.randint(1, 64)
    planner = BatchPlanner(target_rows=target, max_delay_s=0.0)
    sizes = {f"r{i}": rng.randint(1, 200) for i in range(rng.randint(1, 40))}
    pending = list(sizes.items())
    seen: dict[str, list[tuple[int, int]]] = {name: [] for name in sizes}
    order: list[str] = []

    # Interleave adds and takes at random, then flush.
    while pending or planner.queued_rows:
        if pending and rng.random() < 0.6:
            name, rows = pending.pop(0)
            planner.add(name, rows=rows, now=0.0)
            continue
        before = planner.queued_rows
        batch = planner.take()
        assert sum(s.rows for s in batch) <= target
        assert sum(s.rows for s in batch) == before - planner.queued_rows
        if before >= target:
            assert sum(s.rows for s in batch) == target  # a full batch is full
        for s in batch:
            assert s.rows >= 1
            seen[s.request].append((s.start, s.stop))
            if not order or order[-1] != s.request:
                order.append(s.request)

    assert order == list(sizes)  # FIFO: each request's slices are contiguous and in arrival order
    for name, rows in sizes.items():
        spans = seen[name]
        assert spans[0][0] == 0
        assert spans[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(spans[:-1], spans[1:], strict=True))  # no gap, no overlap


# --- WorkQueue ------------------------------------------------------------------------------------------------

def _start(target, *args) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(target(*args)), daemon=True)
    thread.start()
    return thread, result


def test_get_batch_returns_empty_on_timeout():
    queue = WorkQueue(target_rows=4, max_delay_s=10.0, max_queued_rows=16)
    assert queue.get_batch(timeout=0.01) == []

    queue.put("a", 2)  # below target, deadline far away: still nothing to take
    assert queue.get_batch(timeout=0.01) == []
    assert queue.queued_rows == 2


def test_get_batch_returns_a_full_batch_at_once():
    queue = WorkQueue(target_rows=4, max_delay_s=10.0, max_queued_rows=16)
    queue.put("a", 3)
    queue.put("b", 3)
    assert _spans(queue.get_batch(timeout=JOIN_S)) == [("a", 0, 3), ("b", 0, 1)]
    assert queue.queued_rows == 2
    assert queue.target_rows == 4


def test_get_batch_releases_a_partial_batch_at_the_deadline():
    queue = WorkQueue(target_rows=100, max_delay_s=0.02, max_queued_rows=200)
    queue.put("a", 1)
    assert _spans(queue.get_batch(timeout=JOIN_S)) == [("a", 0, 1)]


def test_get_batch_wakes_when_a_put_fills_the_batch():
    queue = WorkQueue(target_rows=4, max_delay_s=10.0, max_queued_rows=16)
    getter, result = _start(queue.get_batch, 5.0)
    queue.put("a", 4)
    getter.join(JOIN_S)
    assert not getter.is_alive()
    assert _spans(result[0]) == [("a", 0, 4)]


def test_put_blocks_while_the_queue_is_full_and_resumes_when_a_batch_is_taken():
    queue = WorkQueue(target_rows=4, max_delay_s=10.0, max_queued_rows=8)
    queue.put("a", 4)
    queue.put("b", 4)  # 8 rows: at the bound
    entered = threading.Event()

    def producer():
        queue.put("c", 1)
        entered.set()

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    assert not entered.wait(BLOCKED_S), "put should block while 8 + 1 rows exceed max_queued_rows=8"
    assert queue.queued_rows == 8

    assert _spans(queue.get_batch(timeout=JOIN_S)) == [("a", 0, 4)]
    assert entered.wait(JOIN_S), "taking a batch should make room for the blocked put"
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert queue.queued_rows == 5


def test_a_request_larger_than_the_bound_still_enters_an_empty_queue():
    queue = WorkQueue(target_rows=4, max_delay_s=10.0, max_queued_rows=8)
    thread, _ = _start(queue.put, "huge", 50)
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert queue.queued_rows == 50


def test_max_queued_rows_is_at_least_one_batch():
    queue = WorkQueue(target_rows=8, max_delay_s=10.0, max_queued_rows=2)
    queue.put("a", 4)
    thread, _ = _start(queue.put, "b", 4)  # 8 rows fit: the bound is raised to target_rows
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert queue.queued_rows == 8


def test_close_releases_a_blocked_get_batch():
    queue = WorkQueue(target_rows=4, max_delay_s=10.0, max_queued_rows=16)
    getter, result = _start(queue.get_batch, 30.0)
    assert getter.is_alive()
    queue.close()
    getter.join(JOIN_S)
    assert not getter.is_alive()
    assert result == [[]]


def test_close_releases_a_blocked_put():
    queue = WorkQueue(target_rows=4, max_delay_s=10.0, max_queued_rows=4)
    queue.put("a", 4)
    entered = threading.Event()
    thread = threading.Thread(target=lambda: (queue.put("b", 1), entered.set()), daemon=True)
    thread.start()
    assert not entered.wait(BLOCKED_S)
    queue.close()
    assert entered.wait(JOIN_S)
    thread.join(JOIN_S)
    assert not thread.is_alive()


def test_close_drains_remaining_rows_then_returns_empty():
    queue = WorkQueue(target_rows=4, max_delay_s=10.0, max_queued_rows=16)
    queue.put("a", 3)
    queue.put("b", 3)
    assert _spans(queue.get_batch(timeout=JOIN_S)) == [("a", 0, 3), ("b", 0, 1)]
    assert queue.get_batch(timeout=0.0) == []  # 2 rows, not full, deadline far away

    queue.close()
    assert _spans(queue.get_batch(timeout=0.0)) == [("b", 1, 3)]
    assert queue.get_batch(timeout=0.0) == []
    assert queue.queued_rows == 0
