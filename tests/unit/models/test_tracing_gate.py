"""The gate that keeps torch.fx tracing and model forwards of one sidecar apart (perf/tracing.py)."""

from __future__ import annotations

import threading

import torch
import torchvision

from spark_cnn.models.tracing import TracingGate
from spark_cnn.perf.layers import analyse
from spark_cnn.sidecar.runner import FX_GATE


def test_a_tracer_waits_for_running_forwards_and_new_forwards_wait_for_it():
    gate, events = TracingGate(), []
    forward_entered, release_forward = threading.Event(), threading.Event()

    def long_forward():
        with gate.forward():
            forward_entered.set()
            release_forward.wait(5)
            events.append("forward 1 done")

    def tracer():
        with gate.tracing():
            events.append("traced")

    def late_forward():
        with gate.forward():
            events.append("forward 2")

    first = threading.Thread(target=long_forward)
    first.start()
    forward_entered.wait(5)
    trace = threading.Thread(target=tracer)
    trace.start()
    while not gate._tracers_waiting:  # the tracer is queued behind the running forward
        threading.Event().wait(0.01)
    second = threading.Thread(target=late_forward)
    second.start()
    threading.Event().wait(0.1)
    assert events == []  # the tracer waits for forward 1; forward 2 waits for the tracer
    release_forward.set()
    for thread in (first, trace, second):
        thread.join(5)
    assert events == ["forward 1 done", "traced", "forward 2"]


def test_forwards_in_other_threads_survive_a_model_being_traced():
    """Without the gate, fx's process-wide patch of nn.Module.__call__ breaks forwards running meanwhile."""
    running = torchvision.models.mobilenet_v3_small().eval()
    errors, stop = [], threading.Event()

    def keep_running():
        while not stop.is_set():
            try:
                with FX_GATE.forward(), torch.inference_mode():
                    running(torch.zeros(1, 3, 64, 64))
            except Exception as e:  # noqa: BLE001 - any failure is the finding
                errors.append(repr(e))
                return

    worker = threading.Thread(target=keep_running)
    worker.start()
    try:
        for _ in range(3):
            analyse(torchvision.models.squeezenet1_0().eval())
    finally:
        stop.set()
        worker.join(30)
    assert errors == []
