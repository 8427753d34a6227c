"""Collect each sidecar's counters from the tasks that used it, through a Spark accumulator."""

from __future__ import annotations

from pyspark.accumulators import AccumulatorParam


class SidecarStatsParam(AccumulatorParam):
    """Accumulates {sidecar key: counters}. Counters are cumulative snapshots for one job, so merging keeps
    the latest (most requests) per sidecar; a retried task adding a snapshot twice changes nothing."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:
        for key, snapshot in value2.items():
            if key not in value1 or snapshot["requests"] >= value1[key]["requests"]:
                value1[key] = snapshot
        return value1

