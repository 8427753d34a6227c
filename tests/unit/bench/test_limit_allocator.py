"""The limit times the sidecar's runner with the sidecar's allocator, and its decoders with the tasks'."""

import os

from spark_cnn.bench.suite import variant_environment
from spark_cnn.bench.variant_task import VariantTask
from spark_cnn.bench.variants import _tasks_allocator
from spark_cnn.task.sidecar_env import RETAINED, SIDECAR_MALLOC_ENV, allocator_of


def _task(variant: str) -> VariantTask:
    return VariantTask(variant=variant, model="mobilenet_v3_small", weights=None, input="in", warmup_input="w",
                       images=8)


def test_only_the_limit_starts_with_the_sidecars_allocator(monkeypatch):
    for name in SIDECAR_MALLOC_ENV:
        monkeypatch.delenv(name, raising=False)
    assert allocator_of(variant_environment(_task("limit"))) == RETAINED
    for variant in ("bare", "predict_batch_udf", "spark_cnn", "daft"):
        assert not set(SIDECAR_MALLOC_ENV) & set(variant_environment(_task(variant))), variant


def test_children_started_inside_get_the_tasks_allocator_and_the_parent_keeps_its_own(monkeypatch):
    for name, value in SIDECAR_MALLOC_ENV.items():
        monkeypatch.setenv(name, value)
    with _tasks_allocator():  # what a spawned child inherits
        assert not set(SIDECAR_MALLOC_ENV) & set(os.environ)
    assert allocator_of(dict(os.environ)) == RETAINED
