"""A driver's listing as a DataFrame (`sources.listed_frame`) on the real session: one partition per packed group,
in packed order, whichever way the groups reach their partitions: the groups' own scan (no more groups than
cores), their Arrow batches parallelised one a partition (a table over the local-relation threshold), or a
broadcast onto a range (more groups than cores)."""

from __future__ import annotations

import pytest

from spark_cnn.spark.listing import MIN_FILES_PER_TASK, Entry, pack_partitions
from spark_cnn.spark.sources import file_packing, listed_frame

pytestmark = pytest.mark.spark

THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"


def _entries(count: int) -> list[Entry]:
    return [Entry(f"s3://images/many/{i:05d}.jpg", 1_000 + (i * 7919) % 300_000) for i in range(count)]


def _jobs_run(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


# (files, conf, groups, Spark jobs to read the frame): the session has 2 cores; listing.FILES_PER_CORE_PER_WAVE
# gives one task per core below 4,096 files and a wave more per 2,048 files a core above
LAYOUTS = {"one task per core, the groups' own scan": (3_000, {}, 2, 1),
           "over the local-relation threshold": (3_000, {THRESHOLD: "1"}, 2, 1),
           "waves, broadcast onto a range": (8_192, {}, 4, 2)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_listing_becomes_one_partition_per_packed_group_in_order(spark, layout):
    from pyspark.sql import functions as F

    count, conf, group_count, jobs = LAYOUTS[layout]
    entries = _entries(count)
    groups = pack_partitions(entries, **file_packing(spark), min_files=MIN_FILES_PER_TASK)
    assert len(groups) == group_count
    previous = {key: spark.conf.get(key, None) for key in conf}
    try:
        for key, value in conf.items():
            spark.conf.set(key, value)
        frame = listed_frame(spark, entries)
        before = _jobs_run(spark)
        rows = frame.select("path", "size", F.spark_partition_id().alias("part")).collect()
        assert _jobs_run(spark) - before == jobs  # the broadcast is a job of its own, before the first task
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    assert [(r.path, r.size) for r in rows] == [(e.path, e.size) for g in groups for e in g]
    assert [r.part for r in rows] == [i for i, g in enumerate(groups) for _ in g]
    assert frame.where("content is not null").count() == 0
