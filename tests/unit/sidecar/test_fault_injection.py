"""Fault injection wraps a runner once, where models load: unset, the runner is served as it is (nothing in the
forward path checks a variable); set, only the forward fails, as the variable says."""

from __future__ import annotations

import pytest
import torch

from spark_cnn.errors import ConfigError
from spark_cnn.sidecar.fault_injection import (
    INJECT_MODEL_FAULT_ENV,
    INJECT_OOM_ENV,
    STICKY_FAULT_TEXT,
    FaultInjectingRunner,
    with_injected_faults,
)
from spark_cnn.sidecar.runner import Staged


class StubRunner:
    """The runner surface the wrapper passes through: stages that count their calls."""

    cuda = False

    def __init__(self):
        self.forwards = 0

    def upload(self, pixels):
        return Staged(pixels)

    def forward(self, staged):
        self.forwards += 1
        return f"forward of {len(staged.pixels)}"

    @staticmethod
    def download(pending):
        return pending


@pytest.fixture(autouse=True)
def no_injection(monkeypatch):
    monkeypatch.delenv(INJECT_OOM_ENV, raising=False)
    monkeypatch.delenv(INJECT_MODEL_FAULT_ENV, raising=False)


def test_unset_the_runner_itself_is_served():
    runner = StubRunner()
    assert with_injected_faults(runner) is runner


def test_injected_out_of_memory_fails_only_batches_above_the_bound(monkeypatch):
    monkeypatch.setenv(INJECT_OOM_ENV, "4")
    runner = StubRunner()
    wrapped = with_injected_faults(runner)
    assert isinstance(wrapped, FaultInjectingRunner) and wrapped.cuda is False
    assert wrapped.forward(Staged(torch.zeros(4, 1))) == "forward of 4"
    with pytest.raises(torch.OutOfMemoryError, match=f"injected by {INJECT_OOM_ENV} at 5 rows"):
        wrapped.run(torch.zeros(5, 1))  # the three stages go through the failing forward too
    assert runner.forwards == 1


@pytest.mark.parametrize("fault, text", [("raise", "the model failed"), ("sticky", STICKY_FAULT_TEXT)])
def test_an_injected_model_fault_fails_every_forward(monkeypatch, fault, text):
    monkeypatch.setenv(INJECT_MODEL_FAULT_ENV, fault)
    runner = StubRunner()
    with pytest.raises(RuntimeError, match=text):
        with_injected_faults(runner).forward(Staged(torch.zeros(1, 1)))
    assert runner.forwards == 0


def test_a_bad_value_is_refused_where_the_model_loads(monkeypatch):
    monkeypatch.setenv(INJECT_MODEL_FAULT_ENV, "sometimes")
    with pytest.raises(ConfigError, match="expected one of raise, sticky"):
        with_injected_faults(StubRunner())
