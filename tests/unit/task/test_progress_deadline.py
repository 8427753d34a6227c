"""ProgressDeadline with an injected clock: a wait ends `timeout_s` after the last reply or completed batch,
however long the wall time, and PROGRESS that reports no completed batch does not keep it alive."""

from __future__ import annotations

from spark_cnn.task.progress import ProgressDeadline

TIMEOUT_S = 10.0


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_progress_expires_after_the_timeout():
    clock = Clock()
    deadline = ProgressDeadline(TIMEOUT_S, batches=0, clock=clock)
    clock.now += TIMEOUT_S - 0.1
    assert not deadline.expired() and abs(deadline.remaining() - 0.1) < 1e-9
    clock.now += 0.1
    assert deadline.expired()


def test_batches_completed_for_other_tasks_extend_the_wait_far_past_the_timeout():
    clock = Clock()
    deadline = ProgressDeadline(TIMEOUT_S, batches=3, clock=clock)
    for batches in range(4, 40):  # 36 batches of other tasks, 5 s apart: 180 s, 18 timeouts of wall time
        clock.now += 5.0
        deadline.progress(batches)
        assert not deadline.expired()
    assert deadline.remaining() == TIMEOUT_S


def test_progress_without_a_completed_batch_expires_as_a_hang():
    clock = Clock()
    deadline = ProgressDeadline(TIMEOUT_S, batches=7, clock=clock)
    for _ in range(9):  # alive (PROGRESS every second) but stuck in one forward: the count stays at 7
        clock.now += 1.0
        deadline.progress(7)
        assert not deadline.expired()
    clock.now += 1.0
    deadline.progress(7)
    assert deadline.expired()


def test_a_count_that_goes_back_is_no_progress():
    clock = Clock()
    deadline = ProgressDeadline(TIMEOUT_S, batches=7, clock=clock)
    clock.now += TIMEOUT_S / 2
    deadline.progress(5)
    clock.now += TIMEOUT_S / 2
    deadline.progress(7)
    assert deadline.expired()


def test_without_a_baseline_the_first_count_only_sets_it():
    clock = Clock()
    deadline = ProgressDeadline(TIMEOUT_S, clock=clock)  # a READY without "batches"
    clock.now += TIMEOUT_S / 2
    deadline.progress(50)
    clock.now += TIMEOUT_S / 2
    assert deadline.expired()
    deadline.progress(51)
    assert not deadline.expired()


def test_restart_gives_a_new_wait_the_full_timeout():
    clock = Clock()
    deadline = ProgressDeadline(TIMEOUT_S, batches=0, clock=clock)
    clock.now += TIMEOUT_S * 3
    deadline.restart()  # a reply came
    assert deadline.remaining() == TIMEOUT_S
