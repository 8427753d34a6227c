"""The sidecar's malloc settings, the time model's two allocators, the channels-last layout the sidecar feeds
its models, and validation in fresh processes that run as the sidecar does."""

from __future__ import annotations

import platform

import pytest
import torch

from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.tensors import normalise
from spark_cnn.perf import heap as heap_replay
from spark_cnn.perf_tools.validate import PICK_TARGET, _pick
from spark_cnn.task.sidecar_env import GLIBC, RETAINED, SIDECAR_MALLOC_ENV, allocator_of, sidecar_environment

GLIBC_HOST = platform.libc_ver()[0] == "glibc"


def test_sidecar_environment_adds_the_settings_and_keeps_the_users():
    env = sidecar_environment({"PATH": "/bin", "MALLOC_ARENA_MAX": "4"})
    assert env["PATH"] == "/bin" and env["MALLOC_ARENA_MAX"] == "4"  # the user's choice wins
    assert env["MALLOC_MMAP_MAX_"] == "0" and int(env["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 30
    assert set(SIDECAR_MALLOC_ENV) <= set(sidecar_environment({}))


@pytest.mark.skipif(not GLIBC_HOST, reason="the settings are glibc's")
def test_allocator_of_reads_the_settings():
    assert allocator_of(sidecar_environment({})) == RETAINED
    assert allocator_of({}) == GLIBC
    assert allocator_of({"MALLOC_MMAP_MAX_": "0"}) == GLIBC               # still trims: pages fault again
    assert allocator_of({"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "junk"}) == GLIBC


def test_retained_heap_faults_only_while_it_grows():
    heap = heap_replay.Heap(32 << 20, retained=True)
    sizes = [64 << 20, 8 << 20, 100 << 20, 1 << 20]
    for _ in range(3):
        before = heap.faulted
        for chunk in [heap.malloc(size) for size in sizes]:
            heap.free(chunk)
        grown = heap.faulted - before
    assert grown == 0 and heap.faulted == sum(sizes)  # the first pass grows to the peak, then all is reused
    glibc = heap_replay.Heap(32 << 20)
    for _ in range(3):
        before = glibc.faulted
        for chunk in [glibc.malloc(size) for size in sizes]:
            glibc.free(chunk)
    assert glibc.faulted - before >= (64 + 100) << 20  # mapped afresh every pass


def test_normalise_hands_the_model_channels_last():
    images = normalise(torch.zeros(2, 5, 7, 3, dtype=torch.uint8), Preprocessing())
    assert images.shape == (2, 3, 5, 7) and images.is_contiguous(memory_format=torch.channels_last)


def test_pick_compares_the_tuners_choice_with_the_best_measured():
    points = [{"batch_size": b, "predicted_ms": p, "measured_ms": m}
              for b, p, m in [(1, 10.0, 10.0), (8, 40.0, 60.0), (16, 79.0, 100.0)]]
    pick = _pick(points, {1: [10.0, 11.0], 8: [60.0, 70.0], 16: [100.0, 90.0]})
    # predicted: 16 best (202.5 img/s), 8 within 3% -> 8; measured best is 16 (160 img/s), 8 gives 133.3
    assert pick["batch_size"] == 8 and pick["measured_best_batch_size"] == 16
    assert pick["fraction_of_best"] == pytest.approx(133.33 / 160, abs=1e-3) and pick["meets"] is False
    assert pick["fraction_by_sweep"] == [pytest.approx(133.33 / 160, abs=1e-3), pytest.approx(114.29 / 177.78,
                                                                                              abs=1e-3)]
    assert pick["target"] == PICK_TARGET
