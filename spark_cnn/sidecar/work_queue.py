"""Thread-safe shell around BatchPlanner: connection threads put requests, the device thread takes batches.

`put` blocks while too many rows are queued: the connection thread then stops reading its socket, the
client's sends block, and memory stays bounded (backpressure).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from spark_cnn.sidecar.batcher import BatchPlanner, Slice


class WorkQueue:
    def __init__(self, target_rows: int, max_delay_s: float, max_queued_rows: int, clock=time.monotonic):
        self._planner = BatchPlanner(target_rows, max_delay_s)
        self._max_queued_rows = max(max_queued_rows, target_rows)
        self._clock = clock
        self._cond = threading.Condition()
        self._closed = False

    @property
    def target_rows(self) -> int:
        return self._planner.target_rows

    def set_target(self, target_rows: int) -> None:
        """Change the batch size for batches formed from now on (tuning, or an out-of-memory back-off).

        The queue bound scales with it: a bound below the target would never let a full batch form."""
        with self._cond:
            old, new = self._planner.target_rows, max(1, target_rows)
            self._planner.target_rows = new
            self._max_queued_rows = max(new, self._max_queued_rows * new // old)
            self._cond.notify_all()

    @property
    def queued_rows(self) -> int:
        with self._cond:
            return self._planner.queued_rows

    def put(self, request: Any, rows: int) -> None:
        with self._cond:
            # A request larger than the bound still enters an empty queue, or it could never be served.
            while (not self._closed and self._planner.queued_rows
                   and self._planner.queued_rows + rows > self._max_queued_rows):
                self._cond.wait()
            self._planner.add(request, rows, self._clock())
            self._cond.notify_all()

    def get_batch(self, timeout: float) -> list[Slice]:
        """Wait up to `timeout` s for a ready batch; [] on timeout or once closed and drained."""
        end = self._clock() + timeout
        with self._cond:
            while True:
                now = self._clock()
                if self._planner.ready(now) or (self._closed and len(self._planner)):
                    batch = self._planner.take()
                    self._cond.notify_all()  # room for blocked producers
                    return batch
                if self._closed or now >= end:
                    return []
                deadline = self._planner.deadline()
                wake = end if deadline is None else min(end, deadline)
                self._cond.wait(max(wake - now, 0.0))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
