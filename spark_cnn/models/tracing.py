"""Keep `torch.fx.symbolic_trace` and model forwards of one process apart.

While it traces, fx patches `torch.nn.Module.__call__` for the whole process, so a forward running meanwhile
in another thread goes through the tracer and fails ("module is not installed as a submodule"). A sidecar
traces a model (the layer analysis behind its starting batch size and decode placement) while other models
compute, so forwards hold the gate shared and tracing holds it alone. A waiting tracer goes first: forwards
that keep overlapping would otherwise hold it off for ever.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class TracingGate:
    """A readers-writer gate: `forward()` is shared, `tracing()` exclusive, with a waiting tracer first."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._forwards = 0
        self._tracing = False
        self._tracers_waiting = 0

    @contextmanager
    def forward(self) -> Iterator[None]:
        with self._cond:
            while self._tracing or self._tracers_waiting:
                self._cond.wait()
            self._forwards += 1
        try:
            yield
        finally:
            with self._cond:
                self._forwards -= 1
                if not self._forwards:
                    self._cond.notify_all()

    @contextmanager
    def tracing(self) -> Iterator[None]:
        with self._cond:
            self._tracers_waiting += 1
            while self._tracing or self._forwards:
                self._cond.wait()
            self._tracers_waiting -= 1
            self._tracing = True
        try:
            yield
        finally:
            with self._cond:
                self._tracing = False
                self._cond.notify_all()


FX_GATE = TracingGate()
