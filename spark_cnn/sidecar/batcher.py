"""The dynamic batcher's pure core: plan device batches from a FIFO of requests of any size.

Requests from every connected task enter one queue. A batch takes rows from the head until it holds
`target_rows`, splitting a request that does not fit (its remainder stays at the head) and merging small ones.
A batch is released when it is full, or when the oldest queued row has waited `max_delay_s`. No threads, no
clocks: callers pass `now`, so every decision is unit-testable.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Slice:
    """Rows [start, stop) of one queued request, as placed in a device batch."""

    request: Any
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass
class _Queued:
    request: Any
    rows: int
    arrived: float
    taken: int = 0  # rows of this request already placed in earlier batches


class BatchPlanner:
    """FIFO of requests -> device batches of at most `target_rows` rows.

    >>> p = BatchPlanner(target_rows=4, max_delay_s=0.01)
    >>> p.add("a", rows=3, now=0.0); p.add("b", rows=3, now=0.0)
    >>> [(s.request, s.start, s.stop) for s in p.take()]
    [('a', 0, 3), ('b', 0, 1)]
    """

    def __init__(self, target_rows: int, max_delay_s: float):
        if target_rows < 1:
            raise ValueError(f"target_rows must be >= 1, got {target_rows}")
        if max_delay_s < 0:
            raise ValueError(f"max_delay_s must be >= 0, got {max_delay_s}")
        self.target_rows = target_rows
        self.max_delay_s = max_delay_s
        self._queue: deque[_Queued] = deque()
        self._queued_rows = 0

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, request: Any, rows: int, now: float) -> None:
        if rows < 1:
            raise ValueError(f"a request needs at least one row, got {rows}")
        self._queue.append(_Queued(request, rows, now))
        self._queued_rows += rows

    def deadline(self) -> float | None:
        """When the oldest queued row has waited long enough to go out in a partial batch; None if empty."""
        return self._queue[0].arrived + self.max_delay_s if self._queue else None

    def ready(self, now: float) -> bool:
        if self._queued_rows >= self.target_rows:
            return True
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def take(self) -> list[Slice]:
        """The next batch (possibly partial); empty if nothing is queued. Call when `ready()`, or to flush."""
        batch: list[Slice] = []
        room = self.target_rows
        while room and self._queue:
            head = self._queue[0]
            n = min(room, head.rows - head.taken)
            batch.append(Slice(head.request, head.taken, head.taken + n))
            head.taken += n
            room -= n
            if head.taken == head.rows:
                self._queue.popleft()
        self._queued_rows -= self.target_rows - room
        return batch
