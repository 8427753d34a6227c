"""Sessions the product makes under a local master allow task retries, as a cluster does: Spark's local
masters ignore spark.task.maxFailures and give a task one attempt unless the master says `local[N,F]`."""

from __future__ import annotations

import pytest

from spark_cnn.spark.session import LOCAL_TASK_MAX_FAILURES, with_task_retries


@pytest.mark.parametrize(("given", "expected"), [
    ("local", f"local[1,{LOCAL_TASK_MAX_FAILURES}]"),
    ("local[2]", f"local[2,{LOCAL_TASK_MAX_FAILURES}]"),
    ("local[*]", f"local[*,{LOCAL_TASK_MAX_FAILURES}]"),
    ("local[2,2]", "local[2,2]"),  # the user's own retry count stands
    ("local-cluster[2,1,1024]", "local-cluster[2,1,1024]"),  # honours spark.task.maxFailures (default 4)
    ("spark://host:7077", "spark://host:7077"),
    ("yarn", "yarn"),
])
def test_local_masters_get_task_retries(given, expected):
    assert with_task_retries(given) == expected
    assert LOCAL_TASK_MAX_FAILURES > 1
