"""When a client stops waiting for its sidecar: after `timeout_s` with neither a reply nor a sign of progress.

A task's request waits behind every other task's work in the sidecar's queue, so wall time since the request says
nothing about whether the sidecar hangs: eight tasks of a slow model on a CPU wait minutes for a healthy one. What
the client counts instead is progress: a reply of its own, or a PROGRESS message (protocol.Kind.PROGRESS) whose
count of batches the whole sidecar has completed went up. A PROGRESS with the same count (its main thread alive,
its model stuck in one forward) is no progress, so a wedged model is still caught, as is a frozen process (no
messages at all). Pure: the clock is injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ProgressDeadline:
    """The deadline of one wait on one connection.

    >>> now = [0.0]
    >>> deadline = ProgressDeadline(2.0, batches=5, clock=lambda: now[0])
    >>> now[0] = 1.5; deadline.progress(6)  # a batch completed somewhere in the sidecar
    >>> now[0] = 3.0; deadline.expired()
    False
    >>> now[0] = 3.5; deadline.progress(6); deadline.expired()  # alive, but nothing completed since 1.5 s
    True
    """

    def __init__(self, timeout_s: float, *, batches: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self._clock = clock
        self._batches = batches  # the sidecar's completed batches when last told; None: not told yet
        self._since = clock()

    def restart(self) -> None:
        """A reply came, or a new wait begins: the full timeout from now."""
        self._since = self._clock()

    def progress(self, batches: int) -> None:
        """A PROGRESS message: the sidecar has completed `batches` batches. More than last time extends the
        deadline; the first count a connection hears (without one from READY) only sets the baseline."""
        if self._batches is not None and batches > self._batches:
            self._since = self._clock()
        self._batches = batches if self._batches is None else max(self._batches, batches)

    def remaining(self) -> float:
        """Seconds left before the wait gives up (0 or less: it has)."""
        return self._since + self.timeout_s - self._clock()

    def expired(self) -> bool:
        return self.remaining() <= 0
